r"""Hessian operators of the loss: the Riemannian Hessian on the quotient and the plain Euclidean one.

**Quotient.** For a :class:`~geosharp_ref.sharpness.space.ProductSpace` (factors k with metric 𝔾_k, horizontal
projection P_k and geodesic acceleration γ̈_k(0) = −Γ_k(ξ, ξ) from their generated kernels, or from a factor's
own :func:`hessian_block` (the joint LoRA factor, :mod:`.joint_lora_hessian`); the adaptive rest with the flat
metric Σ ξ²/c², c = |θ|) and a loss L invariant under the quotiented symmetries, the
Riemannian Hessian of L on the quotient, lifted to horizontal vectors, is (Absil et al. 2008, Prop. 5.3.4)

    Hess L[ξ] = P 𝔾⁻¹ ( ∇²L ξ + c(ξ) ),      ⟨c(ξ), η⟩ = ⟨∇L, −Γ(ξ, η)⟩ = ½ ⟨(Dγ̈(ξ))ᵀ ∇L, η⟩

so that for horizontal ξ, η

    g(Hess L[ξ], η) = ∇²L[ξ, η] + ⟨∇L, −Γ(ξ, η)⟩       (symmetric: Hess L is g-self-adjoint)
    g(Hess L[ξ], ξ) = d²/dt² L(γ_ξ(t))|₀                  (γ_ξ the horizontal geodesic, γ̈(0) = −Γ(ξ, ξ)).

−Γ(ξ, η) is the polarisation of the quadratic γ̈(ξ) = −Γ(ξ, ξ): Dγ̈(ξ)[η] = −2Γ(ξ, η), so the covector c(ξ) is
half the VJP of the generated ``geodesic_acceleration`` at ξ with cotangent ∇L (``torch.func.vjp``). ∇²L ξ is
one Euclidean Hessian-vector product (``torch.func``: forward-over-reverse ``jvp(grad L)``, or
reverse-over-reverse where an operator lacks a forward-mode rule), on the model's parameters with the tangent
placed by the factors' bindings; 𝔾⁻¹ is the generated ``riemannian_gradient`` (c² ⊙ on the rest), P the
``horizontal_projection`` (the mask c > 0 on the rest). Every fast factor is evaluated through its
``generic()`` factors (the same geometry; the tangent layout of the space is unchanged). With
``geodesic_correction=False`` the space is flat (Γ = 0, c(ξ) = 0); ``metric_norm=False`` is refused (P is not
orthogonal for the Frobenius product, so the operator would not be self-adjoint).

**Metric-orthonormal coordinates** (what Hutchinson, Lanczos and scipy see). Every metric here acts per
matrix block as a right multiplication, 𝔾⁻¹ ξ_X = ξ_X M_X (M_X an h×h SPD matrix: (HᵀH)⁻¹ for G under
``mix``, GᵀG under ``inv``, …; a positive number per element for element-wise geometries; c² on the rest), so
S = 𝔾^{-1/2}: ξ_X ↦ ξ_X M_X^{1/2} is explicit. On flat coordinates y ∈ ℝᴺ (N = the number of perturbed
entries; :meth:`QuotientHessian.to_tangent` / :meth:`~QuotientHessian.to_flat`)

    Ã y = S⁻¹ Hess L[P S y] = (P S)ᵀ (∇²L + C) (P S) y       (N×N, Euclidean-symmetric)

and Q = S⁻¹ P S is the Euclidean-orthogonal projection onto S⁻¹(horizontal). So the spectrum of Ã is that of
Hess L on the horizontal space plus dim(vertical) zeros, tr Ã = tr(Hess L|_horizontal), and for y with
E[y yᵀ] = I (Rademacher or Gaussian) the probe z = P S y is a metric-orthonormal probe of the horizontal
space: E[g(z, Hess L[z])] = tr(Hess L|_horizontal). :meth:`QuotientHessian.as_linear_operator` is Ã as a
``scipy.sparse.linalg.LinearOperator`` (float64 numpy in and out). No dense Hessian is ever formed.

**Euclidean.** :class:`EuclideanHessian` is ∇²L on the same perturbed parameters (flat coordinates are the
parameters themselves): the counterpart that changes along symmetry orbits.

Shapes: a tangent is the space's flat list of tensors (factor blocks, then one tensor per adaptive parameter);
parameter dicts map names to tensors of the parameters' shapes; flat vectors are 1-D of length :attr:`dim`.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .space import ProductSpace, SpaceOptions, Tangent

__all__ = ["QuotientHessian", "EuclideanHessian", "hessian_vector_product", "HVP_MODES", "insert_adjoint",
           "hessian_block", "spd_sqrt_pair"]

#: how ∇²L v is taken: "forward" (forward-over-reverse), "reverse" (double backward), "auto" (forward, falling
#: back to reverse for a model whose operators lack forward-mode rules)
HVP_MODES = ("auto", "forward", "reverse")


def _as_list(losses):
    return list(losses) if isinstance(losses, (list, tuple)) else [losses]


def hessian_vector_product(loss_of_params, base: dict, names, v: dict, mode: str = "forward"):
    """(∇L, ∇²L v) over the parameters ``names`` at ``base`` (name → tensor) for the direction ``v`` (name →
    tensor, shapes of the parameters); the other parameters are held fixed. ``mode``: "forward" =
    ``torch.func.jvp`` of ``torch.func.grad`` (forward-over-reverse), "reverse" = double backward."""
    fixed = {n: p for n, p in base.items() if n not in set(names)}
    primal = {n: base[n].detach() for n in names}
    tangent = {n: v[n].to(primal[n].dtype) for n in names}

    def loss(sub):
        return loss_of_params({**fixed, **sub})

    with _math_attention():
        return _hvp(loss, primal, tangent, mode)


def _math_attention():
    """scaled_dot_product_attention on its math backend (composite: forward-mode and double-backward rules
    exist; the fused CPU/GPU kernels have neither)."""
    return sdpa_kernel([SDPBackend.MATH])


def _hvp(loss, primal, tangent, mode):
    if mode == "forward":
        g, hv = torch.func.jvp(torch.func.grad(loss), (primal,), (tangent,))
        return {n: t.detach() for n, t in g.items()}, {n: t.detach() for n, t in hv.items()}
    if mode != "reverse":
        raise ValueError(f"unknown HVP mode {mode!r}; choose one of ('forward', 'reverse')")
    with torch.enable_grad():
        leaves = {n: p.clone().requires_grad_(True) for n, p in primal.items()}
        value = loss(leaves)
        gs = torch.autograd.grad(value, list(leaves.values()), create_graph=True, allow_unused=True)
        gs = [torch.zeros_like(p) if gr is None else gr for p, gr in zip(leaves.values(), gs)]
        dot = sum((gr * tangent[n]).sum() for gr, n in zip(gs, leaves))
        hv = torch.autograd.grad(dot, list(leaves.values()), allow_unused=True) if dot.requires_grad else \
            [None] * len(leaves)
    return ({n: gr.detach() for n, gr in zip(leaves, gs)},
            {n: torch.zeros_like(p) if h is None else h.detach() for (n, p), h in zip(leaves.items(), hv)})


class _HVP:
    """∇²L v averaged over ``losses`` (callables params → scalar), the mode chosen once ("auto": forward,
    reverse if forward mode fails on the first call); ``gradient``: ∇L at ``base`` (averaged), computed once."""

    def __init__(self, losses, base, names, mode="auto"):
        if mode not in HVP_MODES:
            raise ValueError(f"unknown HVP mode {mode!r}; choose one of {HVP_MODES}")
        self.losses, self.base, self.names, self.mode = _as_list(losses), base, list(names), mode
        if not self.losses:
            raise ValueError("no loss given: pass at least one callable params -> scalar loss")
        self._grad = None
        self.calls = 0

    def _one(self, loss, v):
        if self.mode == "auto":
            try:
                out = hessian_vector_product(loss, self.base, self.names, v, "forward")
                self.mode = "forward"
                return out
            except (NotImplementedError, RuntimeError):
                self.mode = "reverse"
        return hessian_vector_product(loss, self.base, self.names, v, self.mode)

    def __call__(self, v: dict) -> dict:
        self.calls += 1
        total, grad = None, None
        for loss in self.losses:
            g, hv = self._one(loss, v)
            total = hv if total is None else {n: total[n] + hv[n] for n in total}
            grad = g if grad is None else {n: grad[n] + g[n] for n in grad}
        k = len(self.losses)
        if self._grad is None:
            self._grad = {n: t / k for n, t in grad.items()}
        return {n: t / k for n, t in total.items()}

    @property
    def gradient(self) -> dict:
        if self._grad is None:
            grads = []
            for loss in self.losses:
                fixed = {n: p for n, p in self.base.items() if n not in set(self.names)}
                grads.append(torch.func.grad(lambda sub, loss=loss: loss({**fixed, **sub}))(
                    {n: self.base[n].detach() for n in self.names}))
            self._grad = {n: sum(g[n] for g in grads).detach() / len(grads) for n in self.names}
        return self._grad


def spd_sqrt_pair(M: torch.Tensor) -> tuple:
    """(M^{1/2}, M^{-1/2}) of a (batched) symmetric positive semi-definite matrix from one eigendecomposition
    (eigenvalues clamped at 0 for the root and at the dtype's smallest normal number for the inverse root)."""
    w, q = torch.linalg.eigh(0.5 * (M + M.mT))
    return ((q * w.clamp_min(0).sqrt()[..., None, :]) @ q.mT,
            (q * w.clamp_min(torch.finfo(w.dtype).tiny).rsqrt()[..., None, :]) @ q.mT)


def insert_adjoint(at, names, d: dict, base: dict) -> list:
    """The adjoint of the linear map blocks ↦ ``at.insert(base, blocks)`` restricted to ``names``, applied to the
    parameter covector ``d`` (``torch.func.vjp``; ``base`` has the perturbed parameters zeroed)."""
    zero = tuple(torch.zeros_like(x) for x in at.point)
    _, pull = torch.func.vjp(lambda *x: tuple(at.insert(base, list(x))[n] for n in names), *zero)
    return list(pull(tuple(d[n] for n in names)))


def hessian_block(at):
    """The operator's view of one generic factor at the base point (the *block* interface below): the factor's
    own ``hessian_block()`` where it has one (hand-written geometry, e.g. the joint LoRA factor), else
    :class:`_Block` from its generated kernels.

    A block has ``at`` (the factor at θ: ``size``, ``point``, ``insert``) and ``factor``, and implements
    ``whiten``/``unwhiten`` (S = 𝔾^{-1/2} and S⁻¹ on its blocks), ``metric_inverse`` (𝔾⁻¹ on a cotangent),
    ``project`` (P), ``acceleration_covector(ξ, ∇L)`` (c(ξ)), ``extract(d)`` (its blocks of a parameter
    direction), ``pull(d, zeroed)`` (the adjoint of its insert on a covector; ``zeroed()`` gives θ with the
    perturbed parameters zeroed) and ``geodesic_acceleration(x, ξ)`` (γ̈ = −Γ_x(ξ, ξ) at a moving point x)."""
    if hasattr(at, "hessian_block"):
        return at.hessian_block()
    if not hasattr(at.factor, "module"):
        raise ValueError(f"the Riemannian Hessian needs factors with generated kernels or a hessian_block hook; "
                         f"{at.factor.keys[0]} is quotiented by a {type(at.factor).__name__}, which has neither")
    return _Block(at)


class _Block:
    """One generic factor at the base point with its metric's right-multiplication matrices: S ξ_X = ξ_X M^{½},
    S⁻¹ ξ_X = ξ_X M^{-½} (M = 𝔾⁻¹ per block, see the module doc); element-wise: M a tensor of the block's
    shape."""

    def __init__(self, at):
        self.at, self.factor = at, at.factor
        self.elementwise = bool(self.factor.module.ELEMENTWISE)
        self._roots = None

    def roots(self):
        """(M^{½}, M^{-½}) per block, computed on first use (only the flat coordinates need them)."""
        if self._roots is None:
            self._roots = self._compute_roots()
        return self._roots

    def _compute_roots(self):
        point, cache = self.at.point, self.at.cache
        if self.elementwise:
            M = self.factor.riemannian_gradient(point, tuple(torch.ones_like(X) for X in point), cache)
            return [m.sqrt() for m in M], [m.rsqrt() for m in M]
        for X in point:
            if X.dim() < 2:
                raise ValueError(f"{self.factor.binding.key}: a non-element-wise factor with a vector block "
                                 "has no metric-orthonormal coordinates here (matvec and quadratic_form work)")
        eyes = tuple(torch.eye(X.shape[-1], dtype=X.dtype, device=X.device).expand(
            X.shape[:-2] + (X.shape[-1], X.shape[-1])).contiguous() for X in point)
        M = [0.5 * (m + m.mT) for m in self.factor.riemannian_gradient(point, eyes, cache)]
        # the structure is checked once: 𝔾⁻¹ξ = ξ M for a random ξ
        gen = torch.Generator().manual_seed(0)
        xi = tuple(torch.randn(X.shape, generator=gen, dtype=X.dtype).to(X.device) for X in point)
        for x, m, r in zip(xi, M, self.factor.riemannian_gradient(point, xi, cache)):
            want = x @ m
            if float((r - want).abs().max()) > 1e-4 * float(want.abs().max()) + 1e-30:
                raise ValueError(f"{self.factor.binding.key}: the factor's metric is not a right multiplication "
                                 "per block; metric-orthonormal coordinates need one (matvec and quadratic_form "
                                 "work)")
        return tuple(map(list, zip(*(spd_sqrt_pair(m) for m in M))))

    def whiten(self, xi):
        return [x * s if self.elementwise else x @ s for x, s in zip(xi, self.roots()[0])]

    def unwhiten(self, xi):
        return [x * s if self.elementwise else x @ s for x, s in zip(xi, self.roots()[1])]

    def metric_inverse(self, w):
        return list(self.factor.riemannian_gradient(self.at.point, tuple(w), self.at.cache))

    def project(self, xi):
        return list(self.factor.project(self.at.point, tuple(xi), self.at.cache))

    def acceleration_covector(self, xi, grad):
        """c(ξ) = ½ (Dγ̈(ξ))ᵀ ∇L = ⟨∇L, −Γ(ξ, ·)⟩ (one VJP of the generated geodesic acceleration)."""
        f = self.factor
        fn = f.module.geodesic_acceleration
        kw = f._kw(self.at.cache, fn)
        point = self.at.point
        _, pull = torch.func.vjp(lambda *x: tuple(fn(*point, *x, **kw)), *xi)
        return [0.5 * c for c in pull(tuple(grad))]

    def geodesic_acceleration(self, point, xi):
        """γ̈ = −Γ_x(ξ, ξ) at the blocks ``point`` (no cache: the exact geodesic's right-hand side)."""
        fn = self.factor.module.geodesic_acceleration
        return list(fn(*point, *xi, **self.factor._kw(None, fn)))

    def extract(self, d):
        return list(self.factor.binding.extract(d))

    def pull(self, d, zeroed):
        """The adjoint of the insert: ``extract`` for a binding that cuts blocks out of parameters; through a
        norm's fold (:func:`~geosharp_ref.symmetry.norm_weights.fold_binding`: W = Ŵ Γ⁻¹) a vjp of the insert."""
        binding = self.factor.binding
        if getattr(binding, "norm_folds", ()):
            return insert_adjoint(self.at, binding.param_names, d, zeroed())
        return self.extract(d)


class _FlatOperator:
    """Flat coordinates shared by both operators: :attr:`dim`, :meth:`matvec_flat`, :meth:`as_linear_operator`."""

    dim: int
    dtype: torch.dtype

    def matvec_flat(self, y: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def as_linear_operator(self):
        """This operator as a ``scipy.sparse.linalg.LinearOperator`` (N×N, float64 numpy vectors in and out;
        evaluated in the space's dtype)."""
        from scipy.sparse.linalg import LinearOperator

        def mv(y):
            y = torch.as_tensor(np.asarray(y, dtype=np.float64).reshape(-1)).to(self.dtype)
            return self.matvec_flat(y).detach().to(torch.float64).cpu().numpy()

        return LinearOperator((self.dim, self.dim), matvec=mv, rmatvec=mv, dtype=np.float64)


class QuotientHessian(_FlatOperator):
    """The Riemannian Hessian of the loss on the quotient of ``space`` (see the module doc).

    ``losses``: a callable params (name → tensor) → scalar loss, or a list of them (the operator of their
    mean, e.g. one per batch); ``hvp``: one of :data:`HVP_MODES`.

    * :meth:`matvec` — Hess L[P ξ] for a tangent ξ (a horizontal tangent, the space's layout);
    * :meth:`quadratic_form` — g(ξ, Hess L[ξ]) for horizontal ξ;
    * :meth:`matvec_params` — the same on parameter dicts (name → direction of that parameter);
    * :meth:`matvec_flat`, :meth:`as_linear_operator` — Ã in metric-orthonormal coordinates;
    * :meth:`probe` — the metric-orthonormal horizontal probe z = P S y of flat y."""

    def __init__(self, space: ProductSpace, losses, *, hvp: str = "auto"):
        if not space.metric_norm:
            raise ValueError("the Riemannian Hessian needs the space's own metric: metric_norm=False (the "
                             "Frobenius ablation) makes the horizontal projection non-orthogonal")
        self.space = space
        self.flat_geometry = not space.geodesic_correction
        self.blocks = [hessian_block(g.at(space.base, SpaceOptions())) for f in space.factors for g in f.generic()]
        if sum(b.at.size for b in self.blocks) != sum(space.sizes):
            raise ValueError("the space's factors and their generic versions disagree on the tangent layout")
        self.names = list(dict.fromkeys([n for f in space.factors for n in f.param_names] + space.adaptive_names))
        self.hvp = _HVP(losses, space.base, self.names, hvp)
        self.shapes = [t.shape for t in space.zeros()]
        self.dim = sum(int(torch.Size(s).numel()) for s in self.shapes)
        self.dtype = next(iter(space.base.values())).dtype

    # -- layout -------------------------------------------------------------------------------------
    def _split(self, xi):
        parts, i = [], 0
        for b in self.blocks:
            parts.append(list(xi[i:i + b.at.size]))
            i += b.at.size
        return parts, list(xi[i:])

    def _join(self, parts, rest):
        return Tangent([x for p in parts for x in p] + list(rest), None, self.space)

    def to_tangent(self, y: torch.Tensor) -> Tangent:
        """The tangent whose components, flattened and concatenated, are ``y`` (length :attr:`dim`)."""
        out, i = [], 0
        for s in self.shapes:
            k = int(torch.Size(s).numel())
            out.append(y[i:i + k].reshape(s))
            i += k
        return Tangent(out, None, self.space)

    @staticmethod
    def to_flat(xi) -> torch.Tensor:
        return torch.cat([x.reshape(-1) for x in xi])

    def to_params(self, xi) -> dict:
        """The parameter direction of a tangent: each factor's blocks placed by its binding (``insert``), the
        adaptive components (masked) on their parameters; zero elsewhere. Linear in ξ."""
        parts, rest = self._split(xi)
        out = self._blocks_to_params(parts)
        for n, m, x in zip(self.space.adaptive_names, self.space.masks, rest):
            out[n] = out[n] + (x if m is None else x * m.to(x.dtype))
        return out

    def _blocks_to_params(self, parts) -> dict:
        """Σ_k (the parameter direction of factor k's blocks), on :attr:`names`: each binding's ``insert`` into a
        zero direction (the parameters outside :attr:`names`, e.g. a norm's γ a folded binding reads, from θ)."""
        out = {**self.space.base, **{n: torch.zeros_like(self.space.base[n]) for n in self.names}}
        for b, x in zip(self.blocks, parts):
            out = b.at.insert(out, x)
        return {n: out[n] for n in self.names}

    def from_params(self, d: dict, covector: bool = True) -> list:
        """The tangent components of a parameter covector ``d`` (``covector``: the adjoint of :meth:`to_params`)
        or of a parameter direction (``covector=False``: each factor's ``extract``), with the masked adaptive
        entries. The two agree for bindings that cut blocks out of parameters; for a binding seen through a
        norm's fold (:func:`~geosharp_ref.symmetry.norm_weights.fold_binding`: W = Ŵ Γ⁻¹) a direction maps to
        d Γ and a covector to d Γ⁻¹, so the adjoint is taken by ``torch.func.vjp`` of the linear ``insert``
        (each block's ``pull``)."""
        full, zeroed = {**self.space.base, **d}, []

        def zeroed_base():  # θ with the perturbed parameters zeroed, built once per call where a block needs it
            if not zeroed:
                zeroed.append({**self.space.base, **{n: torch.zeros_like(self.space.base[n]) for n in self.names}})
            return zeroed[0]
        parts = [b.pull(full, zeroed_base) if covector else b.extract(full) for b in self.blocks]
        rest = [d[n] if m is None else d[n] * m.to(d[n].dtype) for n, m in zip(self.space.adaptive_names,
                                                                                 self.space.masks)]
        return parts, rest

    # -- the operator --------------------------------------------------------------------------------
    @property
    def gradient(self) -> dict:
        """∇L at the base point (name → tensor)."""
        return self.hvp.gradient

    def _covector(self, xi):
        """(∇²L + C) ξ as per-factor cotangent blocks and adaptive cotangents."""
        hv = self.hvp(self.to_params(xi))
        w_parts, w_rest = self.from_params(hv)
        if not self.flat_geometry:
            g_parts, _ = self.from_params(self.gradient)
            parts, _ = self._split(xi)
            w_parts = [[w + c for w, c in zip(wp, b.acceleration_covector(x, gp))]
                       for b, wp, x, gp in zip(self.blocks, w_parts, parts, g_parts)]
        return w_parts, w_rest

    def matvec(self, xi) -> Tangent:
        """Hess L[P ξ] = P 𝔾⁻¹ ((∇²L + C) P ξ): a horizontal tangent (the space's layout)."""
        xi = self.project(xi)
        w_parts, w_rest = self._covector(xi)
        parts = [b.project(b.metric_inverse(w)) for b, w in zip(self.blocks, w_parts)]
        rest = [c2 * w for c2, w in zip(self.space._scale2, w_rest)]
        return self._join(parts, rest)

    def project(self, xi) -> Tangent:
        parts, rest = self._split(xi)
        return self._join([b.project(x) for b, x in zip(self.blocks, parts)],
                          [x * m for m, x in zip(self.space._movable, rest)])

    def inner(self, xi, eta) -> torch.Tensor:
        """g(ξ, η) (the space's metric)."""
        return self.space.inner(list(xi), list(eta))

    def quadratic_form(self, xi) -> float:
        """g(ξ, Hess L[ξ]) = ∇²L[ξ, ξ] + ⟨∇L, γ̈_ξ(0)⟩ for horizontal ξ (the second derivative of L along
        the horizontal geodesic γ_ξ)."""
        return float(self.inner(xi, self.matvec(xi)))

    def matvec_params(self, d: dict) -> dict:
        """:meth:`matvec` on parameter dicts: the tangent of the direction ``d`` (each factor's ``extract``,
        the adaptive entries), its Hessian placed back as a parameter direction."""
        parts, rest = self.from_params(d, covector=False)
        return self.to_params(self.matvec(self._join(parts, rest)))

    # -- metric-orthonormal coordinates --------------------------------------------------------------
    def whiten(self, xi) -> Tangent:
        """S ξ = 𝔾^{-1/2} ξ (g(Sy, Sy) = ‖y‖²)."""
        parts, rest = self._split(xi)
        return self._join([b.whiten(x) for b, x in zip(self.blocks, parts)],
                          [c2.sqrt() * x for c2, x in zip(self.space._scale2, rest)])

    def unwhiten(self, xi) -> Tangent:
        """S⁻¹ ξ = 𝔾^{1/2} ξ (0 on immovable adaptive entries)."""
        parts, rest = self._split(xi)
        return self._join([b.unwhiten(x) for b, x in zip(self.blocks, parts)],
                          [x * w.sqrt() for w, x in zip(self.space._inv_scale2, rest)])

    def probe(self, y: torch.Tensor) -> Tangent:
        """z = P S y: a metric-orthonormal horizontal probe for E[y yᵀ] = I."""
        return self.project(self.whiten(self.to_tangent(y)))

    def matvec_flat(self, y: torch.Tensor) -> torch.Tensor:
        """Ã y = S⁻¹ Hess L[P S y] (Euclidean-symmetric; see the module doc)."""
        return self.to_flat(self.unwhiten(self.matvec(self.whiten(self.to_tangent(y)))))


class EuclideanHessian(_FlatOperator):
    """∇²L on the parameters ``names`` (default: every floating parameter of ``base``) at ``base``: flat
    coordinates are the parameters, concatenated in ``names`` order. ``losses`` and ``hvp`` as for
    :class:`QuotientHessian`; ``QuotientHessian.names`` gives the same perturbed parameters."""

    def __init__(self, base: dict, losses, names=None, *, hvp: str = "auto"):
        self.base = base
        self.names = list(names) if names is not None else [n for n, p in base.items() if p.is_floating_point()]
        self.hvp = _HVP(losses, base, self.names, hvp)
        self.shapes = [base[n].shape for n in self.names]
        self.dim = sum(int(base[n].numel()) for n in self.names)
        self.dtype = base[self.names[0]].dtype

    @property
    def gradient(self) -> dict:
        return self.hvp.gradient

    def matvec_params(self, d: dict) -> dict:
        """∇²L d (name → tensor)."""
        return self.hvp({n: d[n] for n in self.names})

    def to_params(self, y) -> dict:
        out, i = {}, 0
        for n, s in zip(self.names, self.shapes):
            k = int(torch.Size(s).numel())
            out[n] = y[i:i + k].reshape(s)
            i += k
        return out

    def to_flat(self, d: dict) -> torch.Tensor:
        return torch.cat([d[n].reshape(-1) for n in self.names])

    def matvec_flat(self, y: torch.Tensor) -> torch.Tensor:
        return self.to_flat(self.matvec_params(self.to_params(y)))
