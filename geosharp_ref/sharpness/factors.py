"""The generic perturbation space: a product of generated geometries (factors) and the adaptive rest.

A *factor* is one generated kernel module (any declared symmetry and metric: ``load_kernels`` of a built-in
name or of a file written by ``geosharp derive --spec``) bound to blocks of the model's parameters and
batched over its groups (layers × heads × …). With factors k = 1…K and the parameters no factor covers
("the rest", adaptive geometry with scales c = |θ|):

    g(ξ, η)  = Σ_k g_k(ξ_k, η_k) + Σ_rest ⟨ξ ⊘ c, η ⊘ c⟩
    P ξ      = (P_1 ξ_1, …, P_K ξ_K, ξ_rest ⊙ [c > 0])                 (horizontal projection)
    grad F   = (P_1 𝔾_1⁻¹ ∇_1, …, P_K 𝔾_K⁻¹ ∇_K, c² ⊙ ∇_rest)          (Auto-PGD's ascent direction)
    E(ξ)     = (E_1(ξ_1), …, E_K(ξ_K), θ_rest + ξ_rest),  E_k = θ_k + ξ_k + ½ γ̈_k(0)

every term from the factor's own generated functions (``inner``, ``horizontal_projection``,
``riemannian_gradient``, ``second_order_geodesic``), each called with the factor's base-point factors
(Gram matrices, inverses, Sylvester eigendecomposition: the module's ``prepare``, built once per space and
passed as ``cache=``). The gradient ∇ = ∂F/∂ξ of F(ξ) = L(E(ξ)) comes from autograd through E (the
generated kernels are differentiable). A tangent vector is a flat list: the blocks of factor 1, …, of
factor K, then one tensor per adaptive parameter.

Every generated projection is g-orthogonal (horizontal = g-orthogonal to the vertical space) and the
ascent direction is P 𝔾⁻¹ ∇, so for horizontal ξ (zero where c = 0)

    g(ξ, P 𝔾⁻¹ ∇) = g(ξ, 𝔾⁻¹ ∇) = Σ ⟨ξ, ∇⟩_F                                 (:attr:`ProductSpace.gradient_pairing`)

and Auto-PGD takes the norms of its steps from these Euclidean pairings: per step one metric norm (of the
new iterate) instead of three, and no projection of combinations of horizontal vectors.

This is the readable math path, for any symmetry. The GL(h) attention pairs keep their fast path
(:class:`~geosharp_ref.sharpness.space.PerturbationSpace`: base-point caches, stacked buckets, the
cotangent VJP on block combinations, iterates carrying Gram products); tests check the two against each
other to round-off.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Iterable

import torch

from ..apgd import radial_clip, value_and_grad
from ..geometry import AdaptiveGeometry
from ..kernels import load_kernels

__all__ = ["Factor", "PairBinding", "ProductSpace", "gl_pair_factors"]


class PairBinding:
    """Binds a :class:`~geosharp_ref.symmetry.groups.PairGroup` (G, H per head) as a factor's two blocks."""

    def __init__(self, group):
        self.group = group
        self.key = group.key
        self.param_names = tuple(group.param_names)

    def extract(self, params) -> tuple:
        return tuple(self.group.extract(params))

    def insert(self, params, blocks) -> dict:
        return self.group.insert(params, *blocks)


@dataclass(frozen=True)
class Factor:
    """A generated geometry (``kernels``: a module or its name/path) bound to parameter blocks
    (``binding``: ``extract(params) -> blocks``, ``insert(params, blocks) -> new params``, ``param_names``)."""

    kernels: object
    binding: object
    eps: float = 0.0

    @property
    def module(self) -> ModuleType:
        return load_kernels(self.kernels)

    def prepare(self, point):
        """The base-point factors of ``point`` for the ``cache=`` argument of the other methods (None for
        element-wise geometries, which have none)."""
        prepare = None if self.module.ELEMENTWISE else getattr(self.module, "prepare", None)
        return None if prepare is None else prepare(*point, eps=self.eps)

    def _kw(self, cache):
        return {} if self.module.ELEMENTWISE else {"eps": self.eps, "cache": cache}

    def inner(self, point, xi, eta, cache=None):
        return self.module.inner(*point, *xi, *eta, **self._kw(cache)).sum()

    def project(self, point, xi, cache=None):
        return tuple(self.module.horizontal_projection(*point, *xi, **self._kw(cache)))

    def riemannian_gradient(self, point, egrad, cache=None):
        return tuple(self.module.riemannian_gradient(*point, *egrad, **self._kw(cache)))

    def second_order_geodesic(self, point, xi, cache=None):
        return tuple(self.module.second_order_geodesic(*point, *xi, **self._kw(cache)))


def gl_pair_factors(groups, metric: str, eps: float = 0.0) -> list:
    """One factor per GL(h) pair group, with the built-in ``gl_inv`` / ``gl_mix`` kernels."""
    return [Factor(f"gl_{metric}", PairBinding(g), eps) for g in groups]


def _euclidean_pairing(xi, egrad):
    """Σ ⟨ξ, ∇⟩_F over a list of tensors (a 0-dim tensor)."""
    total = 0.0
    for x, g in zip(xi, egrad):
        total = total + torch.dot(x.reshape(-1), g.reshape(-1).to(x.dtype))
    return torch.as_tensor(total)


class ProductSpace:
    """Tangent space at θ of the product of ``factors`` and the adaptive geometry on the rest (see the
    module doc); implements what :func:`geosharp_ref.apgd.apgd` needs.

    ``adaptive_masks``: name → bool mask of the elements left to the adaptive geometry (None: the whole
    tensor); parameters absent from it are covered by factors only. Default: every parameter no factor
    names is adaptive. ``geodesic_correction=False`` perturbs θ + ξ (paper App. G)."""

    def __init__(self, params: dict, factors=(), adaptive_masks=None, geodesic_correction: bool = True,
                 adaptive_offset: float = 0.0, exclude: Iterable[str] = ()):
        self.base = params
        self.factors = list(factors)
        self.points = [f.binding.extract(params) for f in self.factors]
        self.caches = [f.prepare(p) for f, p in zip(self.factors, self.points)]  # once per base point
        self.sizes = [len(p) for p in self.points]
        self.geodesic_correction = geodesic_correction
        self.adaptive = AdaptiveGeometry(adaptive_offset)
        covered = {n for f in self.factors for n in f.binding.param_names}
        if adaptive_masks is None:
            adaptive_masks = {n: None for n in params if n not in covered}
        exclude = set(exclude)
        self.adaptive_names = [n for n in adaptive_masks if n not in exclude and params[n].is_floating_point()]
        # once per base point: c² (the adaptive Riemannian gradient is c² ⊙ ∇), the movable coordinates
        # c > 0 and the adaptive metric's weight 1/c² (0 on immovable coordinates)
        self._scale2, self._movable, self._inv_scale2 = [], [], []
        for n in self.adaptive_names:
            c = self.adaptive.scale(params[n])
            m = adaptive_masks[n]
            c = c if m is None else c * m.to(c.dtype)
            self._scale2.append(c * c)
            self._movable.append(c > 0)
            self._inv_scale2.append(torch.where(c > 0, c, torch.inf).square().reciprocal())

    @property
    def scales(self):
        """The adaptive scales c = |θ| (+ offset, masked), one tensor per adaptive parameter."""
        return [c2.sqrt() for c2 in self._scale2]

    # -- vectors ------------------------------------------------------------------------------------
    def _split(self, xi):
        """``([blocks of factor k] for k, adaptive tensors)``."""
        parts, i = [], 0
        for k in self.sizes:
            parts.append(tuple(xi[i:i + k]))
            i += k
        return parts, list(xi[i:])

    @staticmethod
    def _join(parts, rest):
        return [x for p in parts for x in p] + list(rest)

    def zeros(self):
        return self._join([tuple(torch.zeros_like(b) for b in p) for p in self.points],
                          [torch.zeros_like(self.base[n]) for n in self.adaptive_names])

    def random(self, rho, generator=None):
        """A Gaussian direction (scaled by |θ| on the rest), projected horizontally, at radius ρ·u."""
        parts = [tuple(torch.randn(b.shape, generator=generator, dtype=b.dtype).to(b.device) for b in p)
                 for p in self.points]
        rest = [c * torch.randn(c.shape, generator=generator, dtype=c.dtype).to(c.device) for c in self.scales]
        u = float(torch.rand((), generator=generator))
        xi = self.project_horizontal(self._join(parts, rest))
        n = self.norm(xi)
        return xi if n == 0 else [x * (rho * u / n) for x in xi]

    # -- the metric and the projection ---------------------------------------------------------------
    def inner(self, xi, eta):
        px, ax = self._split(xi)
        pe, ae = self._split(eta)
        total = 0.0
        for f, point, cache, a, b in zip(self.factors, self.points, self.caches, px, pe):
            total = total + f.inner(point, a, b, cache)
        for w, x, e in zip(self._inv_scale2, ax, ae):
            total = total + torch.dot((x * w).reshape(-1), e.reshape(-1))
        return torch.as_tensor(total)

    def norm(self, xi):
        return float(self.inner(xi, xi)) ** 0.5

    def project_horizontal(self, xi):
        px, ax = self._split(xi)
        return self._join([f.project(p, x, c) for f, p, c, x in zip(self.factors, self.points, self.caches, px)],
                          [x * m for m, x in zip(self._movable, ax)])

    def project(self, xi, rho):
        """Horizontal projection, then radially into the ball ‖ξ‖ ≤ ρ."""
        xi = self.project_horizontal(xi)
        return radial_clip(xi, self.inner(xi, xi), rho)[0]

    @property
    def gradient_pairing(self):
        """``(ξ, ∇) ↦ Σ ⟨ξ, ∇⟩_F``, equal to g(ξ, ascent_direction(∇)) for every ξ of the space (see the
        module doc); Auto-PGD (:func:`geosharp_ref.apgd.apgd_step`) takes the norms of its steps from it."""
        return _euclidean_pairing

    def ascent_direction(self, xi, egrad):
        """P 𝔾⁻¹ ∇ per factor, c² ⊙ ∇ on the rest (the horizontal Riemannian gradient at θ)."""
        pg, ag = self._split(egrad)
        parts = [f.project(p, f.riemannian_gradient(p, g, c), c)
                 for f, p, c, g in zip(self.factors, self.points, self.caches, pg)]
        return self._join(parts, [c2 * g for c2, g in zip(self._scale2, ag)])

    # -- the perturbed model ---------------------------------------------------------------------------
    def perturbed_params(self, xi):
        """The parameters at E(ξ) (a new dict; differentiable in ξ)."""
        px, ax = self._split(xi)
        new = dict(self.base)
        for f, point, cache, x in zip(self.factors, self.points, self.caches, px):
            blocks = f.second_order_geodesic(point, x, cache) if self.geodesic_correction else \
                tuple(b + d for b, d in zip(point, x))
            new = f.binding.insert(new, blocks)
        for n, x in zip(self.adaptive_names, ax):
            new[n] = new[n] + x
        return new

    def value_and_grad(self, loss_of_params):
        """``f_and_grad(ξ) -> (F(ξ), ∂F/∂ξ)`` with F(ξ) = loss_of_params(E(ξ)), by autograd."""
        return value_and_grad(lambda v: loss_of_params(self.perturbed_params(v)))
