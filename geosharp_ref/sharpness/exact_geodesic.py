"""Exact geodesics of the quotient: γ̈ = −Γ(γ̇, γ̇) integrated with fixed-step RK4 (issue 27 item 3).

Geodesic sharpness evaluates the loss at γ_ξ(1), the geodesic from θ with horizontal velocity ξ. The default
(paper Eq. 4) is the second-order geodesic E(ξ) = θ + ξ + ½ γ̈(0); with ``geodesic="exact"`` every factor
integrates the geodesic equation of its (total-space) metric

    ẋ = v,   v̇ = a(x, v) = −Γ_x(v, v),    x(0) = θ_k,  v(0) = ξ_k,    t ∈ [0, 1],

with the classical fixed-step Runge–Kutta scheme (``steps`` = N steps of size h = 1/N, 4 evaluations of
the generated ``geodesic_acceleration`` kernel per step, each at the *current* point, so the Gram matrices
and inverses are recomputed there):

    k₁ = (v, a(x, v)),  k₂ = f(y + h/2 k₁),  k₃ = f(y + h/2 k₂),  k₄ = f(y + h k₃),  y ← y + h/6 (k₁ + 2k₂ + 2k₃ + k₄)

with y = (x, v) and f(x, v) = (v, a(x, v)). The global error is O(h⁴ ‖ξ‖⁵)-small: at ‖ξ‖_g = ρ the
step error of one RK4 step scales like (ρ/N)⁵ N, so :data:`DEFAULT_STEPS` = 8 leaves the endpoint within
round-off of the converged one for ρ ≲ 0.3 (measured in ``docs/guides/exact-geodesics.md``). The adaptive
rest has a flat metric: its geodesic is the straight line θ + tξ (no integration).

A geodesic of the total space whose initial velocity is horizontal stays horizontal (a Riemannian
submersion), so it is the horizontal lift of the quotient geodesic; for the RoPE subgroups the total-space
geodesic equation is that of the GL(h) metric (only the projection differs), and the generated
acceleration is the full −Γ(ξ, ξ) of the metric.

Gradients (``gradient="exact"``): d/dξ L(γ_ξ(1)) = (∂γ_ξ(1)/∂ξ)ᵀ ū with ū = ∂L/∂γ(1). We backpropagate
directly through the RK4 steps (autograd, "discretise-then-differentiate"), recomputing the integration
of one part (a factor's bucket of groups) inside the ascent step: the gradient is then the exact
derivative of the value Auto-PGD maximises (a continuous adjoint would be the derivative of the ODE's
solution, not of its discretisation, and would need a backward integration of the same cost, 4N
acceleration VJPs, plus a re-integration of the state), and the memory held is one part's N·4 stages,
never the whole model's. Cost per Auto-PGD iteration: one extra forward integration plus its backward
(≈ 3× the forward), i.e. ≈ 16N acceleration-kernel evaluations per factor against ~2 for the second order.
``gradient="perturbed"`` uses ū itself (the paper's Algorithm 1).

Hook (what a factor at a base point provides, :meth:`~geosharp_ref.sharpness.factors.GenericFactorAt.geodesic_parts`,
:meth:`~geosharp_ref.sharpness.gl_factor.GLPairFactorAt.geodesic_parts`): ``geodesic_parts()`` → a list of
:class:`GeodesicPart`, each one independent system (its blocks, possibly several groups stacked along the
leading dimension) with its acceleration function. :class:`ExactGeodesicAt` wraps a factor at the base
point built with ``geodesic_correction=False`` (metric, projection and ``ascent`` from a given Euclidean
gradient: the factor's own hooks) and replaces E(ξ) by the RK4 endpoint;
:class:`~geosharp_ref.sharpness.space.ProductSpace` (``geodesic="exact"``) wraps every factor so.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

import torch

__all__ = ["GEODESICS", "DEFAULT_STEPS", "GeodesicPart", "rk4_geodesic", "second_order_endpoint",
           "ExactGeodesicAt", "exact_bound", "check_geodesic", "second_order_params"]

#: how γ_ξ(1) is computed: the second-order step (paper Eq. 4) or the RK4-integrated geodesic
GEODESICS = ("second-order", "exact")
#: RK4 steps of the exact geodesic unless given (h = 1/8)
DEFAULT_STEPS = 8


def check_geodesic(geodesic, steps) -> int:
    """Validate ``geodesic`` (one of :data:`GEODESICS`) and ``steps`` (an integer ≥ 1, or None for
    :data:`DEFAULT_STEPS`); returns the number of steps."""
    if geodesic not in GEODESICS:
        raise ValueError(f"unknown geodesic {geodesic!r}; choose one of {GEODESICS} ('exact' integrates "
                         f"γ̈ = −Γ(γ̇, γ̇) with RK4, 'second-order' is θ + ξ + ½γ̈(0))")
    if steps is None:
        return DEFAULT_STEPS
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps (RK4 steps of the exact geodesic) must be an integer of at least 1, got {steps!r}")
    return steps


@dataclass(frozen=True)
class GeodesicPart:
    """One geodesic system of a factor: ``index[j]`` lists the positions, in the factor's slice of a tangent
    vector, of the tensors stacked (along dim 0, sizes ``sizes``) into block j; ``point`` the base blocks
    (stacked alike); ``acceleration(point, velocity) -> tuple``: −Γ_x(v, v) at the current point x."""

    index: Sequence[Sequence[int]]
    point: tuple
    acceleration: Callable
    sizes: Optional[Sequence[int]] = None

    def gather(self, xi) -> tuple:
        return tuple(xi[ix[0]] if len(ix) == 1 else torch.cat([xi[i] for i in ix]) for ix in self.index)

    def scatter(self, blocks, out: list) -> None:
        for ix, b in zip(self.index, blocks):
            if len(ix) == 1:
                out[ix[0]] = b
            else:
                for i, piece in zip(ix, b.split(list(self.sizes))):
                    out[i] = piece


def _axpy(x, h, v):
    return tuple(a + h * b for a, b in zip(x, v))


def rk4_geodesic(acceleration, point, velocity, steps: int = DEFAULT_STEPS):
    """(γ(1), γ̇(1)) of γ̈ = acceleration(γ, γ̇), γ(0) = point, γ̇(0) = velocity (tuples of tensors), by
    ``steps`` classical RK4 steps of size 1/steps (module doc). Differentiable (plain tensor algebra)."""
    h = 1.0 / steps
    x, v = tuple(point), tuple(velocity)
    for _ in range(steps):
        a1 = tuple(acceleration(x, v))
        x2, v2 = _axpy(x, h / 2, v), _axpy(v, h / 2, a1)
        a2 = tuple(acceleration(x2, v2))
        x3, v3 = _axpy(x, h / 2, v2), _axpy(v, h / 2, a2)
        a3 = tuple(acceleration(x3, v3))
        x4, v4 = _axpy(x, h, v3), _axpy(v, h, a3)
        a4 = tuple(acceleration(x4, v4))
        x = tuple(xi + (h / 6) * (p + 2 * q + 2 * r + s) for xi, p, q, r, s in zip(x, v, v2, v3, v4))
        v = tuple(vi + (h / 6) * (p + 2 * q + 2 * r + s) for vi, p, q, r, s in zip(v, a1, a2, a3, a4))
    return x, v


def second_order_endpoint(acceleration, point, velocity):
    """θ + ξ + ½ γ̈(0) with γ̈(0) = acceleration(θ, ξ): the second-order geodesic (paper Eq. 4)."""
    a = tuple(acceleration(tuple(point), tuple(velocity)))
    return tuple(p + v + 0.5 * x for p, v, x in zip(point, velocity, a))


class ExactGeodesicAt:
    """A factor at a base point with E(ξ) = γ_ξ(1) integrated by RK4 (module doc). Every other hook
    (metric, projection, random starts, linear combinations, insertion) is the wrapped factor's, built with
    ``geodesic_correction=False`` so that its ``ascent`` maps a given Euclidean gradient ∇ to
    d = P 𝔾⁻¹ ∇ with the pairings g(d, d), g(ξ, d)."""

    def __init__(self, factor, params, options, steps: int = DEFAULT_STEPS):
        self.options, self.steps = options, steps
        self.inner_factor = factor.at(params, replace(options, geodesic_correction=False))
        self.size = self.inner_factor.size
        self.parts = list(self.inner_factor.geodesic_parts())

    def __getattr__(self, name):  # zeros, random, inner, project, insert, lincomb, scale, …
        if name == "inner_factor":
            raise AttributeError(name)
        return getattr(self.inner_factor, name)

    def _map(self, xi, endpoint):
        out = [None] * self.size
        for part in self.parts:
            part.scatter(endpoint(part, part.gather(xi)), out)
        return out

    def exact(self, xi) -> list:
        """γ_ξ(1) per block (differentiable in ξ)."""
        return self._map(xi, lambda p, v: rk4_geodesic(p.acceleration, p.point, v, self.steps)[0])

    def second_order(self, xi) -> list:
        """θ + ξ + ½γ̈(0) per block, from the same acceleration kernels."""
        return self._map(xi, lambda p, v: second_order_endpoint(p.acceleration, p.point, v))

    def forward(self, xi, state):
        with torch.no_grad():
            return self.exact([x.detach() for x in xi]), None

    def perturbed(self, xi):
        if self.options.gradient == "perturbed":  # value γ_ξ(1), derivative in ξ the identity
            with torch.no_grad():
                E = self.exact([x.detach() for x in xi])
            return [e + (x - x.detach()) for e, x in zip(E, xi)]
        return self.exact(xi)

    def pullback(self, xi, cot) -> list:
        """(∂γ_ξ(1)/∂ξ)ᵀ ū by backpropagation through the RK4 steps, one part at a time (module doc)."""
        out = [None] * self.size
        with torch.enable_grad():
            for part in self.parts:
                v = tuple(x.detach().requires_grad_(True) for x in part.gather(xi))
                end = rk4_geodesic(part.acceleration, part.point, v, self.steps)[0]
                grads = torch.autograd.grad(end, v, part.gather(cot), allow_unused=True)
                part.scatter([torch.zeros_like(a) if g is None else g for a, g in zip(v, grads)], out)
        return out

    def ascent(self, xi, cot, forward_state):
        grad = self.pullback(xi, cot) if self.options.gradient == "exact" else list(cot)
        return self.inner_factor.ascent(xi, grad, None)


def exact_bound(factors, params, options, steps: int) -> list:
    """Every factor at ``params`` wrapped as an :class:`ExactGeodesicAt` (``geodesic_correction`` must be on:
    the exact geodesic replaces the correction, ``geodesic_correction=False`` is the first-order ablation)."""
    if not options.geodesic_correction:
        raise ValueError("geodesic='exact' integrates the geodesic, geodesic_correction=False uses θ + ξ: "
                         "choose one of them")
    return [ExactGeodesicAt(f, params, options, steps) for f in factors]


def second_order_params(space, xi) -> dict:
    """The parameters at the second-order geodesic θ + ξ + ½γ̈(0) of ``xi`` in an exact-geodesic ``space``
    (the value the default evaluation would see at the same ξ), for the gap exact − second-order."""
    parts, _, rest = space._split(xi)
    return space._assemble([b.second_order(x) for b, x in zip(space.bound, parts)], rest)
