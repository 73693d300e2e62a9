"""Auto-PGD on diagonal nets through the generated kernels (verification of the closed forms).
"""
from __future__ import annotations


import torch

from ...apgd import apgd, value_and_grad
from ...sharpness.space import PerturbationSpace
from .closed_forms import KERNELS, geodesic_beta
from .data import DTYPE, mse

__all__ = ["DiagNetSpace", "apgd_sharpness"]


# ================================================================================================
# Auto-PGD on diagonal nets through the generated kernels
# ================================================================================================

class DiagNetSpace:
    """Horizontal tangent space at (u, v) with the generated ``diag_inv`` / ``diag_mix`` geometry,
    in the interface of :func:`geosharp_ref.apgd.apgd`. Tangent vectors are lists [ξ_u, ξ_v]."""

    GEODESICS = ("second_order", "first_order", "exact")

    def __init__(self, u, v, metric: str = "mix", geodesic: str = "second_order"):
        if metric not in KERNELS:
            raise ValueError(f"unknown metric {metric!r}; choose 'inv' or 'mix'")
        if geodesic not in self.GEODESICS:
            raise ValueError(f"unknown geodesic {geodesic!r}; choose one of {self.GEODESICS}")
        u = torch.as_tensor(u, dtype=DTYPE)
        v = torch.as_tensor(v, dtype=DTYPE)
        if bool((u == 0).any()) or bool((v == 0).any()):
            raise ValueError("u and v must have no zero entries (the quotient geometry needs u, v ≠ 0)")
        self.u, self.v, self.metric, self.geodesic = u, v, metric, geodesic
        self.k = KERNELS[metric]

    def zeros(self):
        return [torch.zeros_like(self.u), torch.zeros_like(self.v)]

    def random(self, rho, generator=None):
        a = torch.randn(self.u.shape, generator=generator, dtype=DTYPE)
        xi = [self.u * a, self.v * a]
        n = self.norm(xi)
        r = rho * float(torch.rand((), generator=generator))
        return xi if n == 0 else [x * (r / n) for x in xi]

    def inner(self, xi, eta):
        return self.k.inner(self.u, self.v, xi[0], xi[1], eta[0], eta[1]).sum()

    def norm(self, xi):
        return float(self.inner(xi, xi)) ** 0.5

    def project_horizontal(self, xi):
        return list(self.k.horizontal_projection(self.u, self.v, xi[0], xi[1]))

    def project(self, xi, rho):
        xi = self.project_horizontal(xi)
        n = self.norm(xi)
        return xi if n <= rho else [x * (rho / n) for x in xi]

    def ascent_direction(self, xi, egrad):
        return self.project_horizontal(list(self.k.riemannian_gradient(self.u, self.v, egrad[0], egrad[1])))

    def perturbed(self, xi):
        """(u', v') = θ + ξ + ½γ̈(0) (second order) or θ + ξ (first order)."""
        if self.geodesic == "first_order":
            return self.u + xi[0], self.v + xi[1]
        au, av = self.k.geodesic_acceleration(self.u, self.v, xi[0], xi[1])
        return self.u + xi[0] + 0.5 * au, self.v + xi[1] + 0.5 * av

    def perturbed_beta(self, xi):
        if self.geodesic == "exact":
            b = 0.5 * (xi[0] / self.u + xi[1] / self.v)        # ξ horizontal: ξ_u/u = ξ_v/v = b
            return geodesic_beta(self.u * self.v, b, self.metric)
        up, vp = self.perturbed(xi)
        return up * vp


class _StartAt:
    """Wraps a space so that Auto-PGD's "random" start is a given tangent vector."""

    def __init__(self, space, xi):
        self._space, self._xi = space, xi

    def random(self, rho, generator=None):
        return [x.clone() for x in self._xi]

    def __getattr__(self, name):
        return getattr(self._space, name)


def apgd_sharpness(u, v, X, y, rho: float, measure: str = "mix", geodesic: str = "second_order",
                   n_iter: int = 100, random_start: bool = False, seed: int = 0, starts=None):
    """Auto-PGD sharpness of one diagonal net: ``measure`` ∈ {"adaptive", "inv", "mix"}.

    Geodesic measures use :class:`DiagNetSpace` (generated kernels); adaptive uses the project's
    :class:`~geosharp_ref.sharpness.PerturbationSpace` on {u, v} (ξ = |θ| ⊙ δ, θ + ξ).
    ``starts``: sequence of "zero" | "random" | "antipodal" (−best ξ so far: the maximisers of these
    near-quadratic problems come in ± pairs, see module doc), one Auto-PGD run each, best kept;
    default ``("random",)`` if ``random_start`` else ``("zero",)``.
    Returns (sharpness, APGDResult of the best run)."""
    u = torch.as_tensor(u, dtype=DTYPE).reshape(-1)
    v = torch.as_tensor(v, dtype=DTYPE).reshape(-1)
    if measure == "adaptive":
        space = PerturbationSpace({"u": u, "v": v})

        def beta_of(xi):
            p = space.perturbed_params(xi)
            return p["u"] * p["v"]
    elif measure in KERNELS:
        space = DiagNetSpace(u, v, measure, geodesic)
        beta_of = space.perturbed_beta
    else:
        raise ValueError(f"unknown measure {measure!r}; choose 'adaptive', 'inv' or 'mix'")

    f_and_grad = value_and_grad(lambda xi: mse(beta_of(xi), X, y))

    l0 = float(mse(u * v, X, y))
    gen = torch.Generator().manual_seed(int(seed))
    starts = tuple(starts) if starts is not None else (("random",) if random_start else ("zero",))
    best = None
    for kind in starts:
        if kind == "zero":
            res = apgd(f_and_grad, space, rho, n_iter=n_iter, random_start=False, generator=gen)
        elif kind == "random":
            res = apgd(f_and_grad, space, rho, n_iter=n_iter, random_start=True, generator=gen)
        elif kind == "antipodal":
            x0 = [-x for x in (best.best_xi if best is not None else space.zeros())]
            res = apgd(f_and_grad, _StartAt(space, x0), rho, n_iter=n_iter, random_start=True, generator=gen)
        else:
            raise ValueError(f"unknown start {kind!r}; choose 'zero', 'random' or 'antipodal'")
        if best is None or res.best_value > best.best_value:
            best = res
    return max(best.best_value, l0) - l0, best
