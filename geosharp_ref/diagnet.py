"""Diagonal linear networks: closed-form geodesic sharpness, Auto-PGD, and the paper's Figure 3.

Model and loss
--------------
f(x) = ⟨u ⊙ v, x⟩, β = u ⊙ v ∈ R^d, square loss L(β) = (1/n) Σᵢ (⟨β, xᵢ⟩ − yᵢ)² (mean squared error).
Every sharpness below depends on (u, v) only through the perturbed predictor β', so with
r = Xβ − y, h = ∇L(β) = (2/n) Xᵀr and Σ = XᵀX/n,

    L(β + Δ) − L(β) = hᵀΔ + ΔᵀΣΔ        (exact: L is quadratic in β).

Symmetry (u, v) ↦ (a ⊙ u, v / a), a > 0. The quotient geometries are the generated kernels
``codegen.generated.diag_inv`` (paper metric (5): Σ ξ_u η_u / u² + ξ_v η_v / v²) and
``codegen.generated.diag_mix`` (metric (6): Σ v² ξ_u η_u + u² ξ_v η_v). Horizontal vectors are
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
  maximiser. As in the paper (App. E.2) and DESIGN, the closed form continues the geodesic linearly
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
:class:`DiagNetSpace` implements the space interface of :func:`geosharp_ref.apgd.apgd` with the
generated kernels only (inner, horizontal_projection, riemannian_gradient, geodesic_acceleration):
the perturbation is θ + ξ + ½ γ̈(0) (second-order geodesic, as the transformer evaluator;
``geodesic="second_order"``), θ + ξ (``"first_order"``, ablation) or the closed-form geodesic
(``"exact"``; mix continued linearly through β = 0 as above). Adaptive Auto-PGD uses the project's
:class:`geosharp_ref.sharpness.PerturbationSpace` unchanged. Agreement with the closed forms is
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
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from scipy.optimize import brentq
from scipy.stats import kendalltau

from codegen.generated import diag_inv, diag_mix

from .apgd import apgd, value_and_grad
from .sharpness import PerturbationSpace

__all__ = [
    "KERNELS", "PAPER_TAU", "HEADLINE", "DiagNetData", "make_data", "mse", "loss_gradient",
    "sample_hyperparameters", "TrainResult", "train_diagonal_nets",
    "TRSResult", "trust_region_max", "geodesic_beta", "second_order_beta", "adaptive_beta",
    "mix_sharpness", "inv_sharpness_trs2", "inv_sharpness", "inv_geo2_sharpness", "adaptive_trs2",
    "adaptive_sharpness", "euclidean_sharpness", "mix_sign_flips", "maximize_on_ball",
    "DiagNetSpace", "apgd_sharpness", "kendall_tau_b", "kendall_with_ci",
    "sharpness_table", "run_experiment", "main_diagnet", "DEFAULT_RHOS",
]

KERNELS = {"inv": diag_inv, "mix": diag_mix}
PAPER_TAU = {"adaptive": -0.68, "geodesic_inv": -0.83, "geodesic_mix": -0.86}
HEADLINE = ("adaptive", "geodesic_inv", "geodesic_mix")
LABELS = {"adaptive": "adaptive", "geodesic_inv": "geodesic (5) inv", "geodesic_mix": "geodesic (6) mix"}
DEFAULT_RHOS = (0.001, 0.01, 0.1, 0.5)
DTYPE = torch.float64


# ================================================================================================
# Data and loss
# ================================================================================================

@dataclass
class DiagNetData:
    X: torch.Tensor          # (n, d) training inputs
    y: torch.Tensor          # (n,)
    X_test: torch.Tensor     # (n_test, d) fresh test inputs
    y_test: torch.Tensor
    beta_star: torch.Tensor  # (d,) sparse ground truth
    noise_std: float = 0.0

    @property
    def n(self):
        return self.X.shape[0]

    @property
    def d(self):
        return self.X.shape[1]


def make_data(d: int = 200, n: int = 100, n_test: int = 5000, sparsity: float = 0.9,
              noise_std: float = 0.0, seed: int = 0) -> DiagNetData:
    """Gaussian inputs, a sparse Gaussian ground truth (``round((1 − sparsity) d)`` non-zeros),
    labels y = Xβ* + noise; the test set is drawn fresh from the same distribution."""
    g = torch.Generator().manual_seed(int(seed))
    k = max(1, int(round((1.0 - sparsity) * d)))
    beta = torch.zeros(d, dtype=DTYPE)
    support = torch.randperm(d, generator=g)[:k]
    beta[support] = torch.randn(k, generator=g, dtype=DTYPE)
    X = torch.randn(n, d, generator=g, dtype=DTYPE)
    X_test = torch.randn(n_test, d, generator=g, dtype=DTYPE)
    y = X @ beta + noise_std * torch.randn(n, generator=g, dtype=DTYPE)
    y_test = X_test @ beta + noise_std * torch.randn(n_test, generator=g, dtype=DTYPE)
    return DiagNetData(X, y, X_test, y_test, beta, float(noise_std))


def mse(beta, X, y):
    """L(β) = mean((Xβ − y)²), batched over the leading dimensions of ``beta``."""
    r = beta @ X.mT - y
    return (r * r).mean(-1)


def loss_gradient(beta, X, y):
    """h = ∇L(β) = (2/n) Xᵀ(Xβ − y) (batched)."""
    return 2.0 * (beta @ X.mT - y) @ X / X.shape[0]


# ================================================================================================
# Training (all models at once)
# ================================================================================================

def sample_hyperparameters(n_models: int, n: int, seed: int = 0, alpha_range=(1e-3, 1.0),
                           lr_range=(0.02, 0.2), batch_fractions=(1.0, 0.5, 0.2, 0.1)) -> list[dict]:
    """Random initialisation scale α (log-uniform), learning rate (log-uniform) and batch size
    (``fraction · n``; 1.0 is full-batch gradient descent) for each model."""
    rng = np.random.default_rng([int(seed), 7919])
    la, lb = np.log10(alpha_range)
    ra, rb = np.log10(lr_range)
    out = []
    for i in range(n_models):
        out.append(dict(alpha=float(10 ** rng.uniform(la, lb)), lr=float(10 ** rng.uniform(ra, rb)),
                        batch_size=int(max(1, round(n * float(rng.choice(batch_fractions)))))))
    return out


@dataclass
class TrainResult:
    U: torch.Tensor            # (M, d)
    V: torch.Tensor            # (M, d)
    steps: list
    restarts: list
    lr: list                   # learning rate actually used (halved on divergence)
    converged: list
    train_loss: list
    seconds: float


class single_thread:
    """Context manager: torch on one intra-op thread (small tensors: thread hand-off costs more than
    it saves, and much more on a loaded 2-core machine). Restores the previous setting."""

    def __enter__(self):
        self.n = torch.get_num_threads()
        torch.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        torch.set_num_threads(self.n)
        return False


def train_diagonal_nets(data: DiagNetData, hparams: Sequence[dict], target_loss: float = 1e-5,
                        max_steps: int = 300_000, seed: int = 0, progress: bool = True) -> TrainResult:
    """(S)GD on L(u ⊙ v) for every model simultaneously, from u = α·1, v = 0.

    Each step draws, per model, a batch of ``batch_size`` distinct training points (all of them for
    full-batch models); the full training loss is computed every step (it shares the residual
    with the gradient) and a model is frozen as soon as it is ≤ ``target_loss`` (frozen models leave
    the batched computation). A model whose loss becomes non-finite or grows 1e3-fold is restarted
    from its initialisation with half the learning rate."""
    X, y = data.X, data.y
    n, d = X.shape
    M = len(hparams)
    g = torch.Generator().manual_seed(int(seed) + 12345)
    alpha = torch.tensor([h["alpha"] for h in hparams], dtype=DTYPE)
    lr = torch.tensor([h["lr"] for h in hparams], dtype=DTYPE)
    bs = torch.tensor([h["batch_size"] for h in hparams])
    if int(bs.min()) < 1 or int(bs.max()) > n:
        raise ValueError(f"batch sizes must lie in [1, {n}]")
    U = alpha[:, None].expand(M, d).clone()
    V = torch.zeros(M, d, dtype=DTYPE)
    steps = torch.zeros(M, dtype=torch.long)
    restarts = torch.zeros(M, dtype=torch.long)
    final = torch.full((M,), float("nan"), dtype=DTYPE)
    l0 = float((y * y).mean())
    t0 = time.perf_counter()
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=M, desc="training diagonal nets", unit="model")
    ids = torch.arange(M)                   # active models (compact arrays below)
    Ua, Va = U.clone(), V.clone()
    step = 0
    with single_thread():
        while len(ids) and step < max_steps:
            r = (Ua * Va) @ X.T - y                      # (Ma, n)
            loss = (r * r).mean(1)
            bad = ~torch.isfinite(loss) | (loss > 1e3 * max(l0, 1e-12))
            if bool(bad.any()):
                bi = ids[bad]
                Ua[bad] = alpha[bi, None].expand(-1, d)
                Va[bad] = 0.0
                lr[bi] = lr[bi] * 0.5
                restarts[bi] += 1
                steps[bi] = 0
                continue
            done = loss <= target_loss
            if bool(done.any()):
                di = ids[done]
                final[di] = loss[done]
                U[di], V[di] = Ua[done], Va[done]
                keep = ~done
                ids, Ua, Va, r = ids[keep], Ua[keep], Va[keep], r[keep]
                if bar is not None:
                    bar.update(int(done.sum()))
                if not len(ids):
                    break
            b = bs[ids]
            if bool((b == n).all()):
                gb = (2.0 / n) * (r @ X)                 # full-batch gradient in β, (Ma, d)
            else:
                bmax = int(b.max())
                pick = torch.rand(len(ids), n, generator=g).argsort(1)[:, :bmax]
                vals = (torch.arange(bmax)[None, :] < b[:, None]).to(DTYPE) / b[:, None].to(DTYPE)
                w = torch.zeros(len(ids), n, dtype=DTYPE).scatter_(1, pick, vals)
                gb = 2.0 * (w * r) @ X
            step_lr = lr[ids][:, None]
            Ua, Va = Ua - step_lr * gb * Va, Va - step_lr * gb * Ua
            steps[ids] += 1
            step += 1
        if len(ids):
            U[ids], V[ids] = Ua, Va
    if bar is not None:
        bar.close()
    r = (U * V) @ X.T - y
    loss = (r * r).mean(1)
    final = torch.where(torch.isnan(final), loss, final)
    converged = (final <= target_loss).tolist()
    return TrainResult(U=U, V=V, steps=steps.tolist(), restarts=restarts.tolist(), lr=lr.tolist(),
                       converged=converged, train_loss=final.tolist(),
                       seconds=time.perf_counter() - t0)


# ================================================================================================
# Trust-region subproblem
# ================================================================================================

@dataclass
class TRSResult:
    value: float
    x: np.ndarray
    mu: float                  # multiplier: (μI − A)x = g/2
    hard_case: bool
    boundary: bool


def trust_region_max(A=None, g=None, radius: float = 1.0, eig=None, hard_tol: float = 1e-10) -> TRSResult:
    """Global maximum of q(x) = gᵀx + xᵀAx over ‖x‖ ≤ radius (A symmetric).

    KKT: (μI − A)x = g/2 with μ ≥ max(λ_max(A), 0), μ(radius − ‖x‖) = 0. With A = QΛQᵀ and
    c = Qᵀg/2, ‖x(μ)‖ = ‖c / (μ − λ)‖; the secular equation 1/radius − 1/‖x(μ)‖ = 0 is solved by
    ``brentq`` on [max(λ_max, 0), λ_max + ‖c‖/radius]. Hard case (c ⟂ top eigenspace, and the rest of
    x(λ_max) inside the ball): μ = λ_max and the remaining norm is filled along the top eigenspace
    (either sign is optimal). The top-eigenspace part of a boundary solution is always set to
    fill the norm exactly, which keeps the near-hard case (μ − λ_max below round-off) accurate.
    ``eig`` = (λ ascending, Q) may be passed instead of A (it is then reused across radii)."""
    if eig is None:
        A = np.asarray(A, dtype=float)
        w, Q = _eigh(0.5 * (A + A.T))
    else:
        w, Q = (np.asarray(eig[0], dtype=float), np.asarray(eig[1], dtype=float))
    g = np.asarray(g, dtype=float)
    R = float(radius)
    if not (R > 0 and math.isfinite(R)):
        raise ValueError(f"radius must be positive and finite, got {radius!r}")
    c = Q.T @ g / 2.0
    wmax = float(w[-1])
    scale = max(float(np.abs(w).max()), 1e-300)
    top = w >= wmax - hard_tol * scale
    rest = ~top

    def value_of(yc):  # y = Qᵀx
        return float(2.0 * c @ yc + w @ (yc * yc))

    # interior maximum (only possible when A is negative definite)
    if wmax < 0:
        y0 = c / (-w)
        if np.linalg.norm(y0) <= R:
            return TRSResult(value_of(y0), Q @ y0, 0.0, False, False)

    def rest_norm(mu):
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(c[rest] == 0, 0.0, c[rest] / (mu - w[rest]))
        return float(np.linalg.norm(t))

    def psi(mu):
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(c == 0, 0.0, (c / (mu - w)) ** 2)
        nrm = math.sqrt(float(t.sum()))
        return 1.0 / R - (0.0 if not math.isfinite(nrm) else (1.0 / nrm if nrm > 0 else math.inf))

    lo = max(wmax, 0.0)
    ctop = float(np.linalg.norm(c[top]))
    hard = False
    if wmax >= 0 and ctop <= 1e-14 * max(float(np.linalg.norm(c)), 1e-300) and rest_norm(lo) <= R:
        mu, hard = lo, True
    else:
        hi = max(lo, wmax + float(np.linalg.norm(c)) / R) * (1 + 1e-12) + 1e-300
        while psi(hi) > 0:
            hi = 2 * hi + 1e-300
        flo = psi(lo)
        if flo <= 0:      # A negative definite and x(0) already on the boundary
            mu = lo
        else:
            mu = brentq(psi, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500)
    yv = np.zeros_like(c)
    with np.errstate(divide="ignore", invalid="ignore"):
        yv[rest] = np.where(c[rest] == 0, 0.0, c[rest] / (mu - w[rest]))
    if wmax >= 0 or mu > 0:      # boundary solution: fill the top eigenspace exactly
        left = max(R * R - float(yv[rest] @ yv[rest]), 0.0)
        if ctop > 0:
            direction = c[top] / ctop
        else:
            direction = np.zeros(int(top.sum()))
            direction[-1] = 1.0
        yv[top] = math.sqrt(left) * direction
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            yv[top] = c[top] / (mu - w[top])
    return TRSResult(value_of(yv), Q @ yv, float(mu), hard, True)


# ================================================================================================
# Maps from a perturbation to the perturbed predictor β'
# ================================================================================================

def geodesic_beta(beta, b, metric: str):
    """β at t = 1 on the exact geodesic with horizontal velocity (u b, v b): inv β e^{2b}; mix β(1 + 2b)
    (continued linearly through β = 0)."""
    if metric == "inv":
        return beta * torch.exp(2 * b)
    if metric == "mix":
        return beta * (1 + 2 * b)
    raise ValueError(f"unknown metric {metric!r}")


def second_order_beta(u, v, b, metric: str):
    """β of θ + ξ + ½γ̈(0) with ξ = (u b, v b), γ̈ from the generated kernels."""
    k = KERNELS[metric]
    xu, xv = u * b, v * b
    au, av = k.geodesic_acceleration(u, v, xu, xv)
    return (u + xu + 0.5 * au) * (v + xv + 0.5 * av)


def _scales(u, v, kind):
    if kind == "adaptive":
        return u.abs(), v.abs()
    if kind == "euclidean":
        return torch.ones_like(u), torch.ones_like(v)
    raise ValueError(f"unknown kind {kind!r}; choose 'adaptive' or 'euclidean'")


def adaptive_beta(u, v, z, kind: str = "adaptive"):
    """β of the perturbation (u + c_u δ_u, v + c_v δ_v), z = [δ_u, δ_v] (last dim 2d), with
    c = (|u|, |v|) (adaptive) or c = 1 (``kind="euclidean"``: plain worst-case sharpness)."""
    d = u.shape[-1]
    cu, cv = _scales(u, v, kind)
    return (u + cu * z[..., :d]) * (v + cv * z[..., d:])


# ================================================================================================
# Batched numerical maximisation over a Euclidean ball
# ================================================================================================

def _project_ball(z, radius):
    n = z.norm(dim=-1, keepdim=True)
    return torch.where(n > radius[:, None], z * (radius[:, None] / n.clamp_min(1e-300)), z)


def maximize_on_ball(objective: Callable, z0: torch.Tensor, radius, n_iter: int = 400,
                     step0: float = 0.05):
    """Maximise ``objective(z) -> (B,)`` row-wise over ‖z_b‖ ≤ radius_b from starts ``z0`` (B, k).

    Monotone gradient ascent with a per-row adaptive step (×1.5 on success, ×0.5 on failure,
    at most ``radius``): in the interior a projected gradient step; on the sphere, when the gradient
    points outwards, a step along its tangential part followed by the radial retraction (Riemannian
    gradient ascent on the sphere). Returns (values, maximisers); each value is a value attained."""
    z0 = z0.detach().to(DTYPE)
    B = z0.shape[0]
    radius = torch.as_tensor(radius, dtype=DTYPE).expand(B).clone()

    def fg(z):
        z = z.detach().requires_grad_(True)
        f = objective(z)
        (gr,) = torch.autograd.grad(f.sum(), z)
        return f.detach(), gr

    z = _project_ball(z0, radius)
    f, gr = fg(z)
    s = torch.full((B,), step0, dtype=DTYPE)
    for _ in range(n_iter):
        zn = z.norm(dim=1, keepdim=True)
        on = (zn[:, 0] >= radius * (1 - 1e-9))
        zhat = z / zn.clamp_min(1e-300)
        radial = (gr * zhat).sum(1, keepdim=True)
        tangential = gr - radial * zhat
        use_t = on & (radial[:, 0] > 0)
        dvec = torch.where(use_t[:, None], tangential, gr)
        dn = dvec.norm(dim=1, keepdim=True).clamp_min(1e-300)
        zt = z + (s * radius)[:, None] * dvec / dn
        zt = torch.where(use_t[:, None], zt * (radius[:, None] / zt.norm(dim=1, keepdim=True).clamp_min(1e-300)),
                         _project_ball(zt, radius))
        ft, gt = fg(zt)
        acc = ft > f
        z = torch.where(acc[:, None], zt, z)
        f = torch.where(acc, ft, f)
        gr = torch.where(acc[:, None], gt, gr)
        s = torch.where(acc, (s * 1.5).clamp(max=1.0), s * 0.5)
        if bool((s < 1e-12).all()):
            break
    return f, z


def _starts(x_trs: np.ndarray, radius: float, n_random: int, gen: torch.Generator):
    """TRS solution, its negative, and random points on the sphere."""
    x = torch.as_tensor(x_trs, dtype=DTYPE)
    out = [x, -x]
    for _ in range(n_random):
        r = torch.randn(x.shape, generator=gen, dtype=DTYPE)
        out.append(r * (radius / r.norm()))
    return out


def _best_over_starts(objective_rows, starts, radius, n_iter):
    """starts: list over models of lists of start vectors; objective_rows(z, rows) -> values."""
    rows, Z = [], []
    for m, st in enumerate(starts):
        for s in st:
            rows.append(m)
            Z.append(s)
    rows = torch.tensor(rows)
    Z = torch.stack(Z)
    R = torch.as_tensor(radius, dtype=DTYPE)
    R = R[rows] if R.ndim else R.expand(len(rows))
    f, z = maximize_on_ball(lambda zz: objective_rows(zz, rows), Z, R, n_iter=n_iter)
    M = len(starts)
    best = torch.full((M,), -math.inf, dtype=DTYPE)
    arg = [None] * M
    for i in range(len(rows)):
        m = int(rows[i])
        if f[i] > best[m]:
            best[m] = f[i]
            arg[m] = z[i]
    return best.clamp_min(0.0), arg


# ================================================================================================
# Sharpness of diagonal nets: closed forms and references (batched over models)
# ================================================================================================

def _row_space_eig(X):
    """Eigen-decomposition of Σ = XᵀX/n restricted to the row space of X (rank ≤ n)."""
    _, s, Vt = torch.linalg.svd(X, full_matrices=False)
    keep = s > s.max() * 1e-12
    w = (s[keep] ** 2 / X.shape[0]).flip(0).numpy()
    Q = Vt[keep].flip(0).T.numpy()
    return w, Q


def mix_sharpness(beta, X, y, rho: float, eig=None, return_delta: bool = False):
    """Closed form S_mix = max_{‖δ‖ ≤ √2ρ} hᵀδ + δᵀΣδ for each row of ``beta`` (M, d)."""
    beta = torch.as_tensor(beta, dtype=DTYPE).reshape(-1, X.shape[1])
    w, Q = eig if eig is not None else _row_space_eig(X)
    H = loss_gradient(beta, X, y).numpy()
    R = math.sqrt(2.0) * rho
    vals, deltas = [], []
    for h in H:
        gq = Q.T @ h                                    # h lies in the row space of X
        res = trust_region_max(g=gq, radius=R, eig=(w, np.eye(len(w))))
        vals.append(max(res.value, 0.0))
        deltas.append(Q @ res.x)
    vals = np.array(vals)
    return (vals, np.array(deltas)) if return_delta else vals


def mix_sign_flips(beta, delta):
    """Number of coordinates where β + δ has crossed zero (the manifold geodesic would have ended)."""
    beta = np.asarray(beta).reshape(np.shape(delta))
    return ((beta * (beta + delta)) < 0).sum(-1)


def _inv_quadratic(beta, X, y):
    """(g, A) of the second-order expansion 2(h⊙β)ᵀb + bᵀAb of L(β e^{2b}) − L(β), per model."""
    n = X.shape[0]
    h = loss_gradient(beta, X, y)
    out = []
    XtX = (X.T @ X / n)
    for bt, ht in zip(beta, h):
        A = 4 * bt[:, None] * XtX * bt[None, :] + torch.diag(2 * ht * bt)
        out.append(((2 * ht * bt).numpy(), A))
    return out


def inv_sharpness_trs2(beta, X, y, rho: float, quad=None):
    """Second-order expansion of inv geodesic sharpness (trust-region subproblem), per model.
    Returns (values, maximisers b)."""
    beta = torch.as_tensor(beta, dtype=DTYPE).reshape(-1, X.shape[1])
    quad = quad if quad is not None else _inv_eig(beta, X, y)
    vals, xs = [], []
    for g, eig in quad:
        res = trust_region_max(g=g, radius=rho / math.sqrt(2.0), eig=eig)
        vals.append(max(res.value, 0.0))
        xs.append(res.x)
    return np.array(vals), xs


def _eigh(A):
    with single_thread():
        w, Q = torch.linalg.eigh(torch.as_tensor(A, dtype=DTYPE))
    return w.numpy(), Q.numpy()


def _inv_eig(beta, X, y):
    return [(g, _eigh(A)) for g, A in _inv_quadratic(beta, X, y)]


def inv_sharpness(beta, X, y, rho: float, n_iter: int = 400, n_random: int = 2, seed: int = 0,
                  quad=None, trs=None):
    """inv geodesic sharpness with the exact geodesic β e^{2b}, maximised numerically (see module doc)."""
    return _inv_numeric(beta, X, y, rho, lambda bt, b, rows: geodesic_beta(bt[rows], b, "inv"),
                        n_iter, n_random, seed, quad, trs)


def inv_geo2_sharpness(u, v, X, y, rho: float, n_iter: int = 400, n_random: int = 2, seed: int = 0,
                       quad=None, trs=None):
    """inv sharpness with the second-order geodesic θ + ξ + ½γ̈(0) (what Auto-PGD maximises)."""
    u = torch.as_tensor(u, dtype=DTYPE).reshape(-1, X.shape[1])
    v = torch.as_tensor(v, dtype=DTYPE).reshape(-1, X.shape[1])
    return _inv_numeric(u * v, X, y, rho,
                        lambda bt, b, rows: second_order_beta(u[rows], v[rows], b, "inv"),
                        n_iter, n_random, seed, quad, trs)


def _inv_numeric(beta, X, y, rho, beta_map, n_iter, n_random, seed, quad, trs):
    beta = torch.as_tensor(beta, dtype=DTYPE).reshape(-1, X.shape[1])
    if trs is None:
        quad = quad if quad is not None else _inv_eig(beta, X, y)
        trs = inv_sharpness_trs2(beta, X, y, rho, quad=quad)
    R = rho / math.sqrt(2.0)
    gen = torch.Generator().manual_seed(int(seed))
    starts = [_starts(x, R, n_random, gen) for x in trs[1]]
    L0 = mse(beta, X, y)

    def objective(b, rows):
        return mse(beta_map(beta, b, rows), X, y) - L0[rows]

    best, arg = _best_over_starts(objective, starts, R, n_iter)
    return best.numpy(), arg


def _adaptive_quadratic(u, v, X, y, kind="adaptive"):
    """(g, eig(A)) of the second-order expansion gᵀz + zᵀAz of the (adaptive or Euclidean) objective:
    Δβ = c_u v δ_u + u c_v δ_v + c_u c_v δ_u δ_v."""
    n = X.shape[0]
    beta = u * v
    h = loss_gradient(beta, X, y)
    XtX = X.T @ X / n
    CU, CV = _scales(u, v, kind)
    out = []
    for uu, vv, hh, cu, cv in zip(u, v, h, CU, CV):
        p = torch.cat([cu * vv, uu * cv])                        # Δβ₁ = P z, P = [diag(c_u v), diag(u c_v)]
        d = uu.shape[0]
        idx = torch.cat([torch.arange(d), torch.arange(d)])
        A = p[:, None] * XtX[idx][:, idx] * p[None, :]
        D = hh * cu * cv
        A[torch.arange(d), torch.arange(d) + d] += 0.5 * D
        A[torch.arange(d) + d, torch.arange(d)] += 0.5 * D
        g = p * hh[idx]
        out.append((g.numpy(), _eigh(A)))
    return out


def adaptive_trs2(u, v, X, y, rho: float, quad=None, kind: str = "adaptive"):
    """Second-order expansion of adaptive sharpness as a trust-region subproblem (per model)."""
    u = torch.as_tensor(u, dtype=DTYPE).reshape(-1, X.shape[1])
    v = torch.as_tensor(v, dtype=DTYPE).reshape(-1, X.shape[1])
    quad = quad if quad is not None else _adaptive_quadratic(u, v, X, y, kind)
    vals, xs = [], []
    for g, eig in quad:
        res = trust_region_max(g=g, radius=rho, eig=eig)
        vals.append(max(res.value, 0.0))
        xs.append(res.x)
    return np.array(vals), xs


def adaptive_sharpness(u, v, X, y, rho: float, n_iter: int = 400, n_random: int = 2, seed: int = 0,
                       quad=None, trs=None, kind: str = "adaptive"):
    """Worst-case adaptive sharpness max_{‖δ‖ ≤ ρ} L((u + |u|δ_u)(v + |v|δ_v)) − L(uv), numerically
    (multi-start ascent from the second-order TRS solution). Returns (values, maximisers).

    Adaptive sharpness is *exactly* invariant under (u, v) ↦ (a ⊙ u, v / a), a > 0:
    (au + |au|δ_u)(v/a + |v/a|δ_v) = (u + |u|δ_u)(v + |v|δ_v). ``kind="euclidean"`` (c = 1,
    plain worst-case sharpness) is the non-invariant baseline."""
    u = torch.as_tensor(u, dtype=DTYPE).reshape(-1, X.shape[1])
    v = torch.as_tensor(v, dtype=DTYPE).reshape(-1, X.shape[1])
    if trs is None:
        trs = adaptive_trs2(u, v, X, y, rho, quad=quad, kind=kind)
    gen = torch.Generator().manual_seed(int(seed))
    starts = [_starts(x, rho, n_random, gen) for x in trs[1]]
    L0 = mse(u * v, X, y)

    def objective(z, rows):
        return mse(adaptive_beta(u[rows], v[rows], z, kind), X, y) - L0[rows]

    best, arg = _best_over_starts(objective, starts, rho, n_iter)
    return best.numpy(), arg


def euclidean_sharpness(u, v, X, y, rho: float, **kw):
    """Plain worst-case sharpness max_{‖(ξ_u, ξ_v)‖₂ ≤ ρ} L((u + ξ_u)(v + ξ_v)) − L(uv) (numerical)."""
    return adaptive_sharpness(u, v, X, y, rho, kind="euclidean", **kw)


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


# ================================================================================================
# Kendall τ with bootstrap intervals
# ================================================================================================

def kendall_tau_b(x, y):
    """Kendall τ-b of rows: x, y (B, M) → (B,) (ties handled as scipy.stats.kendalltau)."""
    x = np.atleast_2d(np.asarray(x, dtype=float))
    y = np.atleast_2d(np.asarray(y, dtype=float))
    M = x.shape[1]
    iu = np.triu_indices(M, 1)
    sx = np.sign(x[:, :, None] - x[:, None, :])[:, iu[0], iu[1]]
    sy = np.sign(y[:, :, None] - y[:, None, :])[:, iu[0], iu[1]]
    s = (sx * sy).sum(1)
    nx = (sx != 0).sum(1)
    ny = (sy != 0).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return s / np.sqrt(nx.astype(float) * ny)


def kendall_with_ci(x, y, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """scipy's τ and p-value, plus a percentile bootstrap interval (models resampled)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3:
        return dict(tau=float("nan"), p=float("nan"), ci=[float("nan"), float("nan")], n=int(len(x)))
    res = kendalltau(x, y)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(n_boot, len(x)))
    taus = kendall_tau_b(x[idx], y[idx])
    taus = taus[np.isfinite(taus)]
    a = (1 - level) / 2
    lo, hi = (np.quantile(taus, [a, 1 - a]) if len(taus) else (float("nan"), float("nan")))
    return dict(tau=float(res.statistic), p=float(res.pvalue), ci=[float(lo), float(hi)], n=int(len(x)))


# ================================================================================================
# The experiment
# ================================================================================================

def _col(measure, rho):
    return f"{measure}@rho={rho:g}"


APGD_VARIANTS = {   # column name -> (measure, geodesic)
    "apgd_adaptive": ("adaptive", None),
    "apgd_inv": ("inv", "second_order"),
    "apgd_mix": ("mix", "second_order"),
    "apgd_inv_exact": ("inv", "exact"),
    "apgd_mix_exact": ("mix", "exact"),
}
AGREEMENT = {       # Auto-PGD column -> reference column (same objective)
    "apgd_adaptive": "adaptive",
    "apgd_inv": "geodesic_inv_geo2",
    "apgd_inv_exact": "geodesic_inv",
    "apgd_mix_exact": "geodesic_mix",
    "apgd_mix": "geodesic_mix",
}


def compute_sharpness(U, V, data: DiagNetData, rhos, *, n_iter: int = 100, apgd_models=None,
                      apgd_starts=("zero", "antipodal"), ref_iter: int = 400, n_random: int = 2,
                      seed: int = 0, progress: bool = True):
    """All sharpness columns for models (U, V) (M, d) at every ρ; returns (columns dict, seconds dict)."""
    with single_thread():
        return _compute_sharpness(U, V, data, rhos, n_iter, apgd_models, apgd_starts, ref_iter, n_random,
                                  seed, progress)


def _compute_sharpness(U, V, data, rhos, n_iter, apgd_models, apgd_starts, ref_iter, n_random, seed,
                       progress):
    X, y = data.X, data.y
    M = U.shape[0]
    beta = U * V
    cols, secs = {}, {}
    t = time.perf_counter()
    eig_mix = _row_space_eig(X)
    inv_quad = _inv_eig(beta, X, y)
    ad_quad = _adaptive_quadratic(U, V, X, y)
    secs["eigendecompositions"] = time.perf_counter() - t
    sel = list(range(M)) if apgd_models is None else list(range(min(int(apgd_models), M)))
    it = rhos
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(rhos) * (5 + len(sel) * len(APGD_VARIANTS)), desc="sharpness", unit="task")
    for rho in it:
        t = time.perf_counter()
        mix_v, mix_d = mix_sharpness(beta, X, y, rho, eig=eig_mix, return_delta=True)
        cols[_col("geodesic_mix", rho)] = mix_v
        cols[_col("mix_sign_flips", rho)] = mix_sign_flips(beta.numpy(), mix_d)
        secs[_col("geodesic_mix", rho)] = time.perf_counter() - t
        bar and bar.update(1)
        t = time.perf_counter()
        trs = inv_sharpness_trs2(beta, X, y, rho, quad=inv_quad)
        cols[_col("geodesic_inv_trs2", rho)] = trs[0]
        secs[_col("geodesic_inv_trs2", rho)] = time.perf_counter() - t
        bar and bar.update(1)
        t = time.perf_counter()
        cols[_col("geodesic_inv", rho)] = inv_sharpness(beta, X, y, rho, n_iter=ref_iter, n_random=n_random,
                                                        seed=seed, trs=trs)[0]
        secs[_col("geodesic_inv", rho)] = time.perf_counter() - t
        bar and bar.update(1)
        t = time.perf_counter()
        cols[_col("geodesic_inv_geo2", rho)] = inv_geo2_sharpness(U, V, X, y, rho, n_iter=ref_iter,
                                                                  n_random=n_random, seed=seed, trs=trs)[0]
        secs[_col("geodesic_inv_geo2", rho)] = time.perf_counter() - t
        bar and bar.update(1)
        t = time.perf_counter()
        atrs = adaptive_trs2(U, V, X, y, rho, quad=ad_quad)
        cols[_col("adaptive_trs2", rho)] = atrs[0]
        cols[_col("adaptive", rho)] = adaptive_sharpness(U, V, X, y, rho, n_iter=ref_iter, n_random=n_random,
                                                         seed=seed, trs=atrs)[0]
        secs[_col("adaptive", rho)] = time.perf_counter() - t
        bar and bar.update(1)
        for name, (measure, geo) in APGD_VARIANTS.items():
            t = time.perf_counter()
            vals = np.full(M, np.nan)
            for m in sel:
                vals[m] = apgd_sharpness(U[m], V[m], X, y, rho, measure, geo or "second_order",
                                         n_iter=n_iter, seed=seed + m, starts=apgd_starts)[0]
                bar and bar.update(1)
            cols[_col(name, rho)] = vals
            secs[_col(name, rho)] = time.perf_counter() - t
    if bar is not None:
        bar.close()
    return cols, secs


def _agreement(cols, rhos, sel_mask):
    out = {}
    for rho in rhos:
        d = {}
        for a, ref in AGREEMENT.items():
            x = np.asarray(cols[_col(a, rho)])[sel_mask]
            r = np.asarray(cols[_col(ref, rho)])[sel_mask]
            ok = np.isfinite(x) & (r > 0)
            ratio = x[ok] / r[ok]
            if len(ratio) == 0:
                continue
            d[f"{a}/{ref}"] = dict(median=float(np.median(ratio)), min=float(ratio.min()),
                                   max=float(ratio.max()),
                                   within_1pct=int(((ratio >= 0.99) & (ratio <= 1.01)).sum()),
                                   n=int(len(ratio)))
        r2 = np.asarray(cols[_col("geodesic_inv_trs2", rho)])
        ex = np.asarray(cols[_col("geodesic_inv", rho)])
        ok = r2 > 0
        d["geodesic_inv/geodesic_inv_trs2"] = dict(median=float(np.median(ex[ok] / r2[ok])),
                                                   min=float((ex[ok] / r2[ok]).min()),
                                                   max=float((ex[ok] / r2[ok]).max()), n=int(ok.sum()))
        a2 = np.asarray(cols[_col("adaptive_trs2", rho)])
        ad = np.asarray(cols[_col("adaptive", rho)])
        ok = a2 > 0
        d["adaptive/adaptive_trs2"] = dict(median=float(np.median(ad[ok] / a2[ok])),
                                           min=float((ad[ok] / a2[ok]).min()),
                                           max=float((ad[ok] / a2[ok]).max()), n=int(ok.sum()))
        out[f"{rho:g}"] = d
    return out


def sharpness_table(tau: dict, rhos, measures=HEADLINE) -> str:
    """Plain-text τ table (measures × ρ) beside the paper's values."""
    lines = [f"{'measure':<22s}{'rho':>8s}{'tau':>8s}   {'95% bootstrap CI':<18s}{'paper':>7s}"]
    for m in measures:
        for rho in rhos:
            t = tau[f"{rho:g}"][m]
            paper = PAPER_TAU.get(m)
            lines.append(f"{LABELS.get(m, m):<22s}{rho:>8g}{t['tau']:>8.3f}   "
                         f"[{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}]    "
                         f"{'' if paper is None else f'{paper:+.2f}':>7s}")
    return "\n".join(lines)


def run_experiment(n_models: int = 50, seed: int = 0, out_dir="diagnet_out", rhos=DEFAULT_RHOS,
                   n_iter: int = 100, progress: bool = True, *, d: int = 200, n: int = 100,
                   n_test: int = 5000, sparsity: float = 0.9, noise_std: float = 0.0,
                   target_loss: float = 1e-5, alpha_range=(1e-3, 1.0), lr_range=(0.02, 0.2),
                   batch_fractions=(1.0, 0.5, 0.2, 0.1), apgd_models=None,
                   apgd_starts=("zero", "antipodal"), ref_iter: int = 400,
                   n_boot: int = 1000, max_steps: int = 300_000, verbose: bool = True) -> dict:
    """Train ``n_models`` diagonal nets, compute their sharpness at every ρ in ``rhos`` and the Kendall
    τ against the generalisation gap; write ``results.json``, ``models.csv`` and ``diagnet.png`` into
    ``out_dir``; print and return (key ``table``) the τ table beside the paper's values.

    Columns (per ρ) of ``models.csv`` / keys of ``tau``:

    * headline: ``adaptive`` (numerical reference), ``geodesic_inv`` (exact geodesic, numerical),
      ``geodesic_mix`` (closed form);
    * ``geodesic_inv_trs2``, ``adaptive_trs2`` (second-order trust-region values), ``geodesic_inv_geo2``
      (inv with the second-order geodesic map, numerical), ``mix_sign_flips``;
    * Auto-PGD (``n_iter`` iterations, one run per entry of ``apgd_starts``, best kept) on the first
      ``apgd_models`` models (None: all): ``apgd_adaptive``, ``apgd_inv`` / ``apgd_mix`` (second-order
      geodesic from the generated kernels), ``apgd_inv_exact`` / ``apgd_mix_exact`` (closed-form
      geodesic). ``agreement`` in results.json compares each with the reference for the same objective.

    Speed (2 CPU cores, 50 models, 4 radii): training ≈ 25 s (all models batched, float64, one
    thread), closed forms and batched numerical references ≈ 10 s, Auto-PGD verification of all models
    ≈ 2 min (the bulk; reduce with ``apgd_models``), bootstrap < 5 s."""
    t_start = time.perf_counter()
    rhos = tuple(float(r) for r in rhos)
    if not rhos or any(not (r > 0 and math.isfinite(r)) for r in rhos):
        raise ValueError(f"rhos must be positive finite numbers, got {rhos!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = make_data(d=d, n=n, n_test=n_test, sparsity=sparsity, noise_std=noise_std, seed=seed)
    hp = sample_hyperparameters(n_models, n, seed=seed, alpha_range=alpha_range, lr_range=lr_range,
                                batch_fractions=batch_fractions)
    tr = train_diagonal_nets(data, hp, target_loss=target_loss, max_steps=max_steps, seed=seed,
                             progress=progress)
    U, V = tr.U, tr.V
    beta = U * V
    train_loss = mse(beta, data.X, data.y).numpy()
    test_loss = mse(beta, data.X_test, data.y_test).numpy()
    gap = test_loss - train_loss
    t_sh = time.perf_counter()
    cols, secs = compute_sharpness(U, V, data, rhos, n_iter=n_iter, apgd_models=apgd_models,
                                   apgd_starts=apgd_starts, ref_iter=ref_iter, seed=seed, progress=progress)
    t_sh = time.perf_counter() - t_sh

    conv = np.array(tr.converged)
    measures = list(HEADLINE) + ["geodesic_inv_trs2", "geodesic_inv_geo2", "adaptive_trs2"] + list(APGD_VARIANTS)
    tau = {}
    for rho in rhos:
        tau[f"{rho:g}"] = {}
        for m in measures:
            x = np.asarray(cols[_col(m, rho)], dtype=float)
            x = np.where(conv, x, np.nan)
            tau[f"{rho:g}"][m] = kendall_with_ci(x, gap, n_boot=n_boot, seed=seed)
    sel = np.zeros(n_models, dtype=bool)
    sel[: (n_models if apgd_models is None else min(int(apgd_models), n_models))] = True
    minabs = np.abs(beta.numpy()).min(1)
    agreement = _agreement(cols, rhos, sel)

    # ---- models.csv
    rows = []
    for i in range(n_models):
        row = dict(model=i, alpha=hp[i]["alpha"], lr=tr.lr[i], lr_sampled=hp[i]["lr"],
                   batch_size=hp[i]["batch_size"], steps=tr.steps[i], restarts=tr.restarts[i],
                   converged=bool(tr.converged[i]), train_loss=float(train_loss[i]),
                   test_loss=float(test_loss[i]), gap=float(gap[i]),
                   l1_norm=float(beta[i].abs().sum()), l2_error=float((beta[i] - data.beta_star).norm()),
                   min_abs_beta=float(minabs[i]))
        for k in sorted(cols):
            row[k] = float(cols[k][i])
        rows.append(row)
    with open(out / "models.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)

    # ---- figure
    from .plots import plot_diagnet_scatter
    plot_diagnet_scatter({k: np.asarray(v) for k, v in cols.items()}, gap, tau, rhos,
                         color=np.log10([h["alpha"] for h in hp]), path=out / "diagnet.png")

    table = sharpness_table(tau, rhos)
    results = dict(
        config=dict(n_models=n_models, seed=seed, rhos=list(rhos), n_iter=n_iter, d=d, n=n, n_test=n_test,
                    sparsity=sparsity, noise_std=noise_std, target_loss=target_loss,
                    alpha_range=list(alpha_range), lr_range=list(lr_range),
                    batch_fractions=list(batch_fractions), apgd_models=apgd_models,
                    apgd_starts=list(apgd_starts), ref_iter=ref_iter,
                    n_boot=n_boot, loss="mean squared error (1/n)||X beta - y||^2",
                    init="u = alpha * 1, v = 0"),
        paper_tau=PAPER_TAU,
        tau=tau,
        agreement=agreement,
        training=dict(converged=int(conv.sum()), seconds=tr.seconds, restarts=int(np.sum(tr.restarts)),
                      max_steps_used=int(max(tr.steps)), train_loss_max=float(np.max(train_loss))),
        mix_sign_flips={f"{rho:g}": dict(models_with_flips=int((cols[_col('mix_sign_flips', rho)] > 0).sum()),
                                         median=float(np.median(cols[_col('mix_sign_flips', rho)])))
                        for rho in rhos},
        seconds=dict(total=time.perf_counter() - t_start, training=tr.seconds, sharpness=t_sh,
                     per_column=secs),
        files=dict(results=str(out / "results.json"), models=str(out / "models.csv"),
                   figure=str(out / "diagnet.png")),
        table=table,
    )
    with open(out / "results.json", "w") as fh:
        json.dump(results, fh, indent=2)
    if verbose:
        print(table)
    return results


def main_diagnet(argv=None) -> int:
    """``geosharp diagnet``: the diagonal-network experiment (paper Figure 3 / Table 1, first row)."""
    p = argparse.ArgumentParser(prog="geosharp diagnet",
                                description="Train a population of diagonal linear networks, compute adaptive "
                                            "and geodesic (inv, mix) sharpness and their Kendall tau with the "
                                            "generalisation gap; writes results.json, models.csv, diagnet.png.")
    p.add_argument("--models", type=int, default=50, help="number of models (default 50)")
    p.add_argument("--seed", type=int, default=0, help="random seed: data and hyper-parameters (default 0)")
    p.add_argument("--out", default="diagnet_out", help="output directory (default ./diagnet_out)")
    p.add_argument("--rho", type=float, nargs="+", default=list(DEFAULT_RHOS), metavar="R",
                   help=f"perturbation radii (default {' '.join(map(str, DEFAULT_RHOS))})")
    p.add_argument("--iters", type=int, default=100, help="Auto-PGD iterations (default 100)")
    p.add_argument("--apgd-models", type=int, default=None,
                   help="run the Auto-PGD verification on the first N models only (default: all)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    if args.models < 3:
        p.error("--models must be at least 3")
    run_experiment(n_models=args.models, seed=args.seed, out_dir=args.out, rhos=tuple(args.rho),
                   n_iter=args.iters, progress=not args.no_progress, apgd_models=args.apgd_models)
    return 0


if __name__ == "__main__":
    sys.exit(main_diagnet())
