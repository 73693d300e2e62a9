"""Diagonal linear networks: closed-form geodesic sharpness, Auto-PGD, and the paper's Figure 3.

Model and loss
--------------
f(x) = ⟨u ⊙ v, x⟩, β = u ⊙ v ∈ R^d, square loss L(β) = (1/n) Σᵢ (⟨β, xᵢ⟩ − yᵢ)² (mean squared error).
Every sharpness below depends on (u, v) only through the perturbed predictor β', so with
r = Xβ − y, h = ∇L(β) = (2/n) Xᵀr and Σ = XᵀX/n,

    L(β + Δ) − L(β) = hᵀΔ + ΔᵀΣΔ        (exact: L is quadratic in β).

Symmetry (u, v) ↦ (a ⊙ u, v / a), a > 0. The quotient geometries are the generated kernels
the generated ``diag_inv`` (paper metric (5): Σ ξ_u η_u / u² + ξ_v η_v / v²) and
``diag_mix`` (metric (6): Σ v² ξ_u η_u + u² ξ_v η_v). Horizontal vectors are
ξ = (u ⊙ b, v ⊙ b) for both metrics.

Closed forms (used for the population)
--------------------------------------
* **mix** (metric (6)): the geodesic is u(t) = u √(1 + 2bt), v(t) = v √(1 + 2bt), so
  β(t) = β + tδ with δ = 2β ⊙ b, and ‖ξ‖² = 2 Σ β² b² = ‖δ‖²/2. Hence

      S_mix(ρ) = max_{‖δ‖ ≤ √2 ρ} hᵀδ + δᵀΣδ,

  a trust-region subproblem (convex quadratic over a ball) solved exactly by its secular equation
  (:func:`trust_region_max`) on the row space of X (Σ has rank n < d; h lies in the row space).
  Caveat (reported, not hidden): on the manifold u, v ≠ 0 a geodesic stops where a coordinate of β
  reaches 0 (the quotient is an open orthant in β), i.e. whenever √2 ρ exceeds some |βᵢ| along the
  maximiser. As in the paper (App. E.2) and docs/MATH.md, the closed form continues the geodesic linearly
  through β = 0 (the flat completion of the quotient); :func:`mix_sign_flips` counts how many
  coordinates of the maximiser cross zero.
* **inv** (metric (5)): the geodesic is (u e^{bt}, v e^{bt}), β(t) = β ⊙ e^{2bt}, ‖ξ‖² = 2‖b‖².
  (a) Second-order expansion: Δβ = β ⊙ (2b + 2b²) + O(b³) gives the trust-region subproblem
  max_{‖b‖ ≤ ρ/√2} 2(h⊙β)ᵀb + bᵀ(4 D_β Σ D_β + 2 diag(h⊙β))b (``geodesic_inv_trs2``, small-ρ reference).
  (b) The exact objective L(β ⊙ e^{2b}) − L(β) maximised numerically (``geodesic_inv``): projected /
  Riemannian-sphere gradient ascent, batched over models, started from the TRS solution, its
  negative and random points (:func:`maximize_on_ball`).
* **adaptive** (Kwon et al. 2021): (u + |u| ⊙ δ_u, v + |v| ⊙ δ_v), ‖(δ_u, δ_v)‖ ≤ ρ, so
  Δβ = |u|v δ_u + u|v| δ_v + |u||v| δ_u δ_v (quartic objective in δ). Reference: the same multi-start
  ascent (``adaptive``), warm-started at the solution of its second-order TRS (``adaptive_trs2``).

Auto-PGD evaluator (used for verification)
------------------------------------------
:class:`DiagNetSpace` is the project's :class:`~geosharp_ref.sharpness.ProductSpace` with one generated
``diag_inv`` / ``diag_mix`` factor over the blocks (u, v) (inner, horizontal_projection, riemannian_gradient,
second_order_geodesic and its VJP):
the perturbation is θ + ξ + ½ γ̈(0) (second-order geodesic, as the transformer evaluator;
``geodesic="second_order"``), θ + ξ (``"first_order"``, ablation) or the closed-form geodesic
(``"exact"``, a study-level option: the space's first-order map θ + ξ, the loss taken at the
closed-form β(1); mix continued linearly through β = 0 as above). Adaptive Auto-PGD uses the
ProductSpace without factors. Agreement with the closed forms is
checked in the tests and reported by :func:`run_experiment`.

Note on the second-order geodesic under mix: with ξ = (u b, v b), θ + ξ + ½γ̈(0) gives
β(1) = β(1 + 2b − b³ + b⁴/4) = β + δ − δ³/(8β²) + δ⁴/(64β³). For coordinates with |βᵢ| ≪ ρ
(every sparse, small-initialisation model has many) the correction is not small: the second-order
map, and hence Auto-PGD with it (paper Algorithm 1), is then far from the exact geodesic. Under inv
the map is β(1 + b + b²/2)² with |bᵢ| ≤ ρ/√2, uniformly O(ρ³) from the exact one.

Experiment (:func:`run_experiment`)
-----------------------------------
Gaussian X (n × d, default 100 × 200), 90 %-sparse Gaussian β*, noise-free labels by default.
A population of diagonal nets (all trained at once, float64, vectorised) from u = α·1, v = 0 (β₀ = 0;
small α → sparse, low-ℓ1 interpolator, large α → close to minimum-ℓ2) with random α (log-uniform in
[1e-3, 1]), learning rate (log-uniform) and batch size (full batch or SGD), each trained until its
full training loss ≤ 1e-5. Generalisation gap = test loss (fresh data) − training loss. Sharpness per
model and ρ; Kendall τ against the gap with bootstrap 95 % intervals (models resampled).
"""
from .apgd_space import DiagNetSpace, apgd_sharpness
from .closed_forms import (KERNELS, TRSResult, adaptive_beta, adaptive_trs2, diagnet_adaptive_sharpness,
                           euclidean_sharpness, geodesic_beta, inv_geo2_sharpness, inv_sharpness, inv_sharpness_trs2,
                           maximize_on_ball, mix_sharpness, mix_sign_flips, second_order_beta, trust_region_max)
from .data import (DiagNetData, TrainResult, loss_gradient, make_data, mse, sample_hyperparameters,
                   train_diagonal_nets)
from .experiment import DEFAULT_RHOS, HEADLINE, PAPER_TAU, compute_sharpness, run_experiment, sharpness_table

__all__ = [
    "KERNELS", "PAPER_TAU", "HEADLINE", "DiagNetData", "make_data", "mse", "loss_gradient",
    "sample_hyperparameters", "TrainResult", "train_diagonal_nets",
    "TRSResult", "trust_region_max", "geodesic_beta", "second_order_beta", "adaptive_beta",
    "mix_sharpness", "inv_sharpness_trs2", "inv_sharpness", "inv_geo2_sharpness", "adaptive_trs2",
    "diagnet_adaptive_sharpness", "euclidean_sharpness", "mix_sign_flips", "maximize_on_ball",
    "DiagNetSpace", "apgd_sharpness", "compute_sharpness", "sharpness_table", "run_experiment", "DEFAULT_RHOS",
]
