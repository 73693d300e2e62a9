"""Factors of the perturbation space: a generated geometry bound to blocks of the model's parameters.

A *factor* is one generated kernel module (any declared symmetry and metric: ``load_kernels`` of a built-in
name or of a file written by ``geosharp derive --spec``) bound to blocks θ_k of the model's parameters and
batched over its groups (layers × heads × …). :class:`~geosharp_ref.sharpness.space.ProductSpace` is the
product of its factors and the adaptive rest; it talks to each factor at the base point θ through the hooks
below (:class:`FactorAt`), which :class:`Factor` implements from the generated functions alone:

    g_k(ξ, η)     ``inner``                    the metric (Frobenius ⟨ξ, η⟩_F for ``metric_norm=False``)
    P_k ξ         ``horizontal_projection``    g-orthogonal onto the horizontal space
    E_k(ξ)        ``second_order_geodesic``    θ_k + ξ + ½ γ̈_k(0)   (θ_k + ξ for ``geodesic_correction=False``)
    d_k           P_k 𝔾_k⁻¹ (∂E_k/∂ξ)ᵀ ū_k      the ascent direction from the cotangent ū_k = ∂L/∂E_k

with (∂E_k/∂ξ)ᵀ the generated ``second_order_geodesic_vjp`` (``torch.func.vjp`` of ``second_order_geodesic``
for a module without one), the identity for ``geodesic_correction=False`` and for ``gradient="perturbed"``
(the gradient at the perturbed weights, paper Algorithm 1), and 𝔾_k⁻¹ the generated
``riemannian_gradient`` (the identity for ``metric_norm=False``). Each call gets the factor's base-point
factors (Gram matrices, inverses, Sylvester eigendecomposition: the module's ``prepare``, once per space).

Rank check: a factor whose group is a matrix group (GL-type, ``GROUP`` a shape) needs the Gram matrices XᵀX
of its matrix blocks to be invertible; a rank-deficient block is refused with a clear ValueError (pass a
relaxation eps > 0) before ``prepare`` would fail inside a Cholesky factorisation.

The factor interface (what :class:`~geosharp_ref.sharpness.space.ProductSpace` calls):

* ``factor.param_names`` — the parameters it covers; ``factor.keys`` — one key per bound group;
* ``factor.at(params, options) -> FactorAt`` — the factor at the base point (checks, caches);
* ``factor.generic() -> list of factors`` — the same geometry without fast hooks (:class:`Factor` returns
  itself; :class:`~geosharp_ref.sharpness.gl_factor.GLPairFactor` one generated ``gl_<metric>`` factor per
  pair group). ``ProductSpace(..., fast=False)`` uses it.

A factor at a base point (:class:`FactorAt`) works on its own slice of a tangent vector (a list of
``size`` tensors) and an optional per-vector *state* (None for :class:`Factor`; the fast GL factor keeps
the Gram products of the vector with the base point there, carried by
:class:`~geosharp_ref.sharpness.space.Tangent`):

* ``zeros()``, ``random(generator)`` (unprojected), ``project(xi)``;
* ``inner(xi, eta, state=None)`` — g_k(ξ, η) summed over the groups (``state``: ξ's, given when ξ is η);
* ``forward(xi, state) -> (E blocks, forward state)`` — E_k(ξ) without autograd (inserted into the weights by
  nodes whose backward is the insert's adjoint, so the backward pass stops at ū_k);
* ``ascent(xi, cot, forward_state) -> (d, d's state, g(d, d), g(ξ, d))`` — the ascent direction with its two
  pairings (for ``metric_norm`` they are ⟨d, ∇⟩_F and ⟨ξ, ∇⟩_F with ∇ = (∂E/∂ξ)ᵀ ū: g(ξ, P𝔾⁻¹∇) = ⟨ξ, ∇⟩_F
  for horizontal ξ; for the Frobenius ablation they are computed with ⟨·,·⟩_F);
* ``perturbed(xi)`` — E_k(ξ), differentiable in ξ; ``insert(params, blocks)`` — θ with θ_k replaced;
* ``insert_parts()`` (optional) — ``[(block indices, insert(params, blocks))]``, the insert in parts over
  disjoint blocks (e.g. one per layer), so the backward pass frees each part's weights and their gradient
  as it passes them (default: one part, ``insert``);
* ``lincomb(terms)`` with ``terms`` = [(c, xi, state)] → (Σ c ξ, state), ``scale(xi, state, s)`` → (s ξ, state).
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol

import torch

from ..apgd import combine
from ..kernels import load_kernels
from .exact_geodesic import GeodesicPart
from .space import SpaceOptions, frobenius

__all__ = ["Factor", "FactorAt", "check_rank", "random_tangent_like", "RANDOM_CHUNK"]


class FactorAt(Protocol):
    """A factor at a base point: the hooks :class:`~geosharp_ref.sharpness.space.ProductSpace` calls (see
    the module doc for their mathematics)."""

    size: int

    def zeros(self) -> list: ...

    def random(self, generator) -> list: ...

    def inner(self, xi, eta, state=None) -> torch.Tensor: ...

    def project(self, xi) -> list: ...

    def forward(self, xi, state) -> tuple: ...

    def ascent(self, xi, cot, forward_state) -> tuple: ...

    def perturbed(self, xi) -> list: ...

    def insert(self, params, blocks) -> dict: ...

    def lincomb(self, terms) -> tuple: ...

    def scale(self, xi, state, s) -> tuple: ...


def check_rank(key: str, names, blocks, eps: float = 0.0) -> None:
    """Refuse matrix blocks X (…, n, h) whose Gram matrix XᵀX (+ eps I) is singular (per leading index,
    e.g. per head): the quotient geometry of a GL-type symmetry needs (XᵀX)⁻¹."""
    for name, X in zip(names, blocks):
        S = X.mT @ X
        ev = torch.linalg.eigvalsh(S)
        bad = (ev[..., 0] + eps) <= 1e-12 * ev[..., -1].clamp_min(1e-300)
        if bool(bad.any()):
            heads = bad.nonzero().flatten().tolist()
            raise ValueError(
                f"{key}: {name} is rank deficient for heads {heads} "
                f"(smallest eigenvalue of {name}ᵀ{name} {float(ev[..., 0].min()):.3g}); "
                "pass a relaxation eps > 0 (paper App. H.2), e.g. eps=1e-6"
            )


#: the most elements of the random square matrix W that :func:`random_tangent_like` draws at once
RANDOM_CHUNK = 1 << 22


def random_tangent_like(X, generator):
    """W X with W Gaussian (…, n, n) / √n for a block X (…, n, h): it transforms like a tangent vector under a right
    action X ↦ X A (W (X A) = (W X) A for the same draw), so a random start keeps the invariance. W is drawn and
    applied in row chunks of at most :data:`RANDOM_CHUNK` elements over all leading dimensions (one chunk, the
    whole W, for small blocks), so e.g. the 1,536 units × 576 inputs of one gated MLP do not need a 4 GB W at
    once."""
    n = X.shape[-2]
    rows = max(1, RANDOM_CHUNK // (n * max(1, math.prod(X.shape[:-2]))))
    out = []
    for r0 in range(0, n, rows):
        W = torch.randn(X.shape[:-2] + (min(rows, n - r0), n), generator=generator, dtype=X.dtype).to(X.device)
        out.append((W / math.sqrt(n)) @ X)
    return out[0] if len(out) == 1 else torch.cat(out, dim=-2)


@dataclass(frozen=True)
class Factor:
    """A generated geometry (``kernels``: a module or its name/path) bound to parameter blocks
    (``binding``: ``extract(params) -> blocks``, ``insert(params, blocks) -> new params``, ``param_names``,
    ``key``); every hook from the generated kernels (see the module doc).

    Kernel options: a binding may carry ``kernel_options`` (a dict, optional attribute of the
    :class:`~geosharp_ref.symmetry.binding.Binding` protocol), extra keyword arguments of its kernels that fix
    *which* geometry they compute at a given block shape, e.g. ``{"rotary_dim": r}`` for the RoPE subgroup
    kernels (``rope_<pairing>_<metric>``) of a partial-rotary Q/K pair. They are passed to ``prepare`` (the
    cached kernels then read them from the cache) and to every uncached call whose signature takes them."""

    kernels: object
    binding: object
    eps: float = 0.0

    @property
    def module(self) -> ModuleType:
        return load_kernels(self.kernels)

    @property
    def param_names(self) -> tuple:
        return tuple(self.binding.param_names)

    @property
    def keys(self) -> list:
        return [self.binding.key]

    def generic(self) -> list:
        return [self]

    def at(self, params, options: SpaceOptions = SpaceOptions()) -> "GenericFactorAt":
        return GenericFactorAt(self, params, options)

    @property
    def kernel_options(self) -> dict:
        """The binding's ``kernel_options`` (extra keyword arguments of its kernels; empty when it has none)."""
        return dict(getattr(self.binding, "kernel_options", None) or {})

    def prepare(self, point):
        """The base-point factors of ``point`` for the ``cache=`` argument of the other methods (None for
        element-wise geometries, which have none); the binding's :attr:`kernel_options` go to ``prepare``."""
        module = self.module
        prepare = None if module.ELEMENTWISE else getattr(module, "prepare", None)
        return None if prepare is None else prepare(*point, eps=self.eps, **self.kernel_options)

    def _kw(self, cache, fn=None):
        """Keyword arguments of a kernel call: eps and cache; without a cache, the :attr:`kernel_options` that
        ``fn``'s signature takes (with one, the kernels read them from the cache)."""
        if self.module.ELEMENTWISE:
            return {}
        kw = {"eps": self.eps, "cache": cache}
        options = self.kernel_options
        if cache is None and options and fn is not None:
            accepted = inspect.signature(fn).parameters
            kw.update({k: v for k, v in options.items() if k in accepted})
        return kw

    def _call(self, name, *args, cache=None):
        fn = getattr(self.module, name)
        return fn(*args, **self._kw(cache, fn))

    def inner(self, point, xi, eta, cache=None):
        return self._call("inner", *point, *xi, *eta, cache=cache).sum()

    def project(self, point, xi, cache=None):
        return tuple(self._call("horizontal_projection", *point, *xi, cache=cache))

    def riemannian_gradient(self, point, egrad, cache=None):
        return tuple(self._call("riemannian_gradient", *point, *egrad, cache=cache))

    def second_order_geodesic(self, point, xi, cache=None):
        return tuple(self._call("second_order_geodesic", *point, *xi, cache=cache))

    def second_order_geodesic_fwd(self, point, xi, cache=None):
        """(E(ξ), saved): the generated ``second_order_geodesic_fwd`` (``saved``: the products its VJP
        reuses), or (``second_order_geodesic``, None) for a module without one."""
        fwd = getattr(self.module, "second_order_geodesic_fwd", None)
        if fwd is None:
            return self.second_order_geodesic(point, xi, cache), None
        *E, saved = fwd(*point, *xi, **self._kw(cache, fwd))
        return tuple(E), saved

    def second_order_geodesic_vjp(self, point, xi, cot, cache=None, saved=None):
        """(∂E/∂ξ)ᵀ ū: the generated VJP (``saved`` from :meth:`second_order_geodesic_fwd` skips products), or
        ``torch.func.vjp`` of ``second_order_geodesic`` for a module without one."""
        module = self.module
        vjp = getattr(module, "second_order_geodesic_vjp", None)
        if vjp is not None:
            kw = self._kw(cache, vjp)
            return tuple(vjp(*point, *xi, *cot, **kw, **({} if saved is None else {"saved": saved})))
        kw = self._kw(cache, module.second_order_geodesic)
        n = len(point)
        _, pull = torch.func.vjp(lambda *x: tuple(module.second_order_geodesic(*point, *x, **kw)), *xi)
        return tuple(pull(tuple(cot))[:n])


def _is_matrix_group(module) -> bool:
    return not module.ELEMENTWISE and isinstance(getattr(module, "GROUP", None), tuple)


class GenericFactorAt:
    """:class:`Factor` at a base point: every hook from the generated kernels (no per-vector state)."""

    def __init__(self, factor: Factor, params, options: SpaceOptions):
        self.factor, self.options = factor, options
        self.point = tuple(factor.binding.extract(params))
        self.size = len(self.point)
        module = factor.module
        self.matrix_group = _is_matrix_group(module)
        if self.matrix_group:  # GL-type: (XᵀX)⁻¹ of every matrix block is needed
            shapes = getattr(module, "BLOCK_SHAPES", ((),) * self.size)
            names = getattr(module, "BLOCKS", tuple(str(i) for i in range(self.size)))
            mats = [(nm, X) for nm, X, s in zip(names, self.point, shapes) if len(s) == 2 and X.dim() >= 2]
            check_rank(factor.binding.key, [m[0] for m in mats], [m[1] for m in mats], factor.eps)
        self.cache = factor.prepare(self.point)

    def zeros(self):
        return [torch.zeros_like(b) for b in self.point]

    def random(self, generator):
        """Gaussian blocks; for a matrix group (right action X ↦ X A) W X with W Gaussian square (1/√n),
        which transforms like a tangent vector, so a random start keeps the invariance (as the GL factor)."""
        if not self.matrix_group:
            return [torch.randn(b.shape, generator=generator, dtype=b.dtype).to(b.device) for b in self.point]
        out = []
        for X in self.point:
            if X.dim() < 2:
                out.append(torch.randn(X.shape, generator=generator, dtype=X.dtype).to(X.device))
                continue
            out.append(random_tangent_like(X, generator))
        return out

    def inner(self, xi, eta, state=None):
        if self.options.metric_norm:
            return self.factor.inner(self.point, xi, eta, self.cache)
        return frobenius(xi, eta)

    def project(self, xi):
        return list(self.factor.project(self.point, xi, self.cache))

    def forward(self, xi, state):
        """E(ξ); the forward state is what the generated VJP reuses (exact gradient only)."""
        o = self.options
        if not o.geodesic_correction:
            return [b + x for b, x in zip(self.point, xi)], None
        if o.gradient == "exact":
            E, saved = self.factor.second_order_geodesic_fwd(self.point, xi, self.cache)
            return list(E), saved
        return list(self.factor.second_order_geodesic(self.point, xi, self.cache)), None

    def perturbed(self, xi):
        if not self.options.geodesic_correction:
            return [b + x for b, x in zip(self.point, xi)]
        if self.options.gradient == "perturbed":  # value E(ξ), derivative in ξ the identity
            with torch.no_grad():
                E = self.factor.second_order_geodesic(self.point, xi, self.cache)
            return [e + (x - x.detach()) for e, x in zip(E, xi)]
        return list(self.factor.second_order_geodesic(self.point, xi, self.cache))

    def ascent(self, xi, cot, forward_state):
        o = self.options
        if o.geodesic_correction and o.gradient == "exact":
            grad = self.factor.second_order_geodesic_vjp(self.point, xi, cot, self.cache, forward_state)
        else:
            grad = tuple(cot)
        if o.metric_norm:
            d = list(self.factor.project(self.point, self.factor.riemannian_gradient(self.point, grad, self.cache),
                                         self.cache))
            return d, None, frobenius(d, grad), frobenius(xi, grad)
        d = list(self.factor.project(self.point, grad, self.cache))
        return d, None, frobenius(d, d), frobenius(xi, d)

    def insert(self, params, blocks):
        return self.factor.binding.insert(params, tuple(blocks))

    def geodesic_parts(self) -> list:
        """Hook of the exact geodesic (:mod:`~geosharp_ref.sharpness.exact_geodesic`): one part, all blocks,
        with the generated ``geodesic_acceleration`` evaluated at the current point (no base-point cache)."""
        fn = self.factor.module.geodesic_acceleration
        kw = self.factor._kw(None, fn)
        return [GeodesicPart([[i] for i in range(self.size)], self.point, lambda p, v: tuple(fn(*p, *v, **kw)))]

    def lincomb(self, terms):
        return [combine([(c, x[j]) for c, x, _ in terms]) for j in range(self.size)], None

    def scale(self, xi, state, s):
        return [x * (s.to(x.dtype) if torch.is_tensor(s) else s) for x in xi], None
