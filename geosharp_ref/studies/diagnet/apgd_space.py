"""Auto-PGD on diagonal nets through the generated kernels (verification of the closed forms).

The space is the project's :class:`~geosharp_ref.sharpness.ProductSpace` with one generated factor
(``diag_inv`` / ``diag_mix``) over the blocks (u, v); adaptive sharpness is the ProductSpace without factors.
"""
from __future__ import annotations

import torch

from ...apgd import apgd
from ...sharpness.factors import Factor
from ...sharpness.space import ProductSpace
from .closed_forms import KERNELS, geodesic_beta
from .data import DTYPE, mse

__all__ = ["DiagNetSpace", "apgd_sharpness"]


class _UV:
    """The binding of a diagonal net's two parameter vectors (u, v) as one factor's blocks."""

    key = "diag:uv"
    param_names = ("u", "v")

    @staticmethod
    def extract(params):
        return params["u"], params["v"]

    @staticmethod
    def insert(params, blocks):
        out = dict(params)
        out["u"], out["v"] = blocks
        return out


class DiagNetSpace(ProductSpace):
    """The horizontal tangent space at (u, v) with the generated ``diag_inv`` / ``diag_mix`` geometry: a
    :class:`~geosharp_ref.sharpness.ProductSpace` with one factor over (u, v). Tangent vectors are lists
    [ξ_u, ξ_v]. ``geodesic``: ``"second_order"`` (θ + ξ + ½γ̈(0)), ``"first_order"`` (θ + ξ) or ``"exact"``
    (the closed-form geodesic, a study-level option: the space's map is θ + ξ and :meth:`perturbed_beta`
    gives β(1) in closed form)."""

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
        super().__init__({"u": u, "v": v}, [Factor(KERNELS[metric], _UV())],
                         geodesic_correction=geodesic == "second_order")
        self.u, self.v, self.metric, self.geodesic = u, v, metric, geodesic

    def random(self, rho, generator=None):
        """(u ⊙ a, v ⊙ a) with a Gaussian, at radius ρ·U (U uniform on [0, 1]; Auto-PGD projects it)."""
        a = torch.randn(self.u.shape, generator=generator, dtype=DTYPE)
        xi = [self.u * a, self.v * a]
        n = self.norm(xi)
        r = rho * float(torch.rand((), generator=generator))
        return xi if n == 0 else [x * (r / n) for x in xi]

    def beta_of_params(self, params):
        """β at the perturbed parameters (for ``"exact"``: the closed-form β(1) of ξ = params − θ)."""
        if self.geodesic == "exact":
            b = 0.5 * ((params["u"] - self.u) / self.u + (params["v"] - self.v) / self.v)
            return geodesic_beta(self.u * self.v, b, self.metric)
        return params["u"] * params["v"]

    def perturbed_beta(self, xi):
        if self.geodesic == "exact":
            b = 0.5 * (xi[0] / self.u + xi[1] / self.v)        # ξ horizontal: ξ_u/u = ξ_v/v = b
            return geodesic_beta(self.u * self.v, b, self.metric)
        p = self.perturbed_params(xi)
        return p["u"] * p["v"]


def apgd_sharpness(u, v, X, y, rho: float, measure: str = "mix", geodesic: str = "second_order",
                   n_iter: int = 100, random_start: bool = False, seed: int = 0, starts=None):
    """Auto-PGD sharpness of one diagonal net: ``measure`` ∈ {"adaptive", "inv", "mix"}.

    Geodesic measures use :class:`DiagNetSpace` (generated kernels); adaptive uses the project's
    :class:`~geosharp_ref.sharpness.ProductSpace` on {u, v} without factors (ξ = |θ| ⊙ δ, θ + ξ).
    ``starts``: sequence of "zero" | "random" | "antipodal" (−best ξ so far: the maximisers of these
    near-quadratic problems come in ± pairs, see module doc), one Auto-PGD run each, best kept;
    default ``("random",)`` if ``random_start`` else ``("zero",)``.
    Returns (sharpness, APGDResult of the best run)."""
    u = torch.as_tensor(u, dtype=DTYPE).reshape(-1)
    v = torch.as_tensor(v, dtype=DTYPE).reshape(-1)
    if measure == "adaptive":
        space = ProductSpace({"u": u, "v": v})

        def beta_of(params):
            return params["u"] * params["v"]
    elif measure in KERNELS:
        space = DiagNetSpace(u, v, measure, geodesic)
        beta_of = space.beta_of_params
    else:
        raise ValueError(f"unknown measure {measure!r}; choose 'adaptive', 'inv' or 'mix'")

    f_and_grad = space.value_and_grad(lambda params: mse(beta_of(params), X, y))

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
            res = apgd(f_and_grad, space, rho, n_iter=n_iter, generator=gen, start=x0)
        else:
            raise ValueError(f"unknown start {kind!r}; choose 'zero', 'random' or 'antipodal'")
        if best is None or res.best_value > best.best_value:
            best = res
    return max(best.best_value, l0) - l0, best
