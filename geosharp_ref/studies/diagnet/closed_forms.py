"""Sharpness of diagonal nets in closed form and by batched reference maximisation (over models).

The mathematics (trust-region subproblems for mix and the second-order inv / adaptive expansions, exact
geodesics β(t)) is written out in :mod:`geosharp_ref.studies.diagnet`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from scipy.optimize import brentq

from ...kernels import load_kernels
from .data import DTYPE, loss_gradient, mse, single_thread

__all__ = ["KERNELS", "TRSResult", "trust_region_max", "geodesic_beta", "second_order_beta", "adaptive_beta",
           "maximize_on_ball", "mix_sharpness", "mix_sign_flips", "inv_sharpness_trs2", "inv_sharpness",
           "inv_geo2_sharpness", "adaptive_trs2", "diagnet_adaptive_sharpness", "euclidean_sharpness",
           "row_space_eig", "inv_eig", "adaptive_quadratic"]

#: the generated quotient geometries of (u, v) ↦ (a ⊙ u, v / a): metric (5) and metric (6)
KERNELS = {"inv": load_kernels("diag_inv"), "mix": load_kernels("diag_mix")}


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

def row_space_eig(X):
    """Eigen-decomposition of Σ = XᵀX/n restricted to the row space of X (rank ≤ n)."""
    _, s, Vt = torch.linalg.svd(X, full_matrices=False)
    keep = s > s.max() * 1e-12
    w = (s[keep] ** 2 / X.shape[0]).flip(0).numpy()
    Q = Vt[keep].flip(0).T.numpy()
    return w, Q


def mix_sharpness(beta, X, y, rho: float, eig=None, return_delta: bool = False):
    """Closed form S_mix = max_{‖δ‖ ≤ √2ρ} hᵀδ + δᵀΣδ for each row of ``beta`` (M, d)."""
    beta = torch.as_tensor(beta, dtype=DTYPE).reshape(-1, X.shape[1])
    w, Q = eig if eig is not None else row_space_eig(X)
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
    quad = quad if quad is not None else inv_eig(beta, X, y)
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


def inv_eig(beta, X, y):
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
        quad = quad if quad is not None else inv_eig(beta, X, y)
        trs = inv_sharpness_trs2(beta, X, y, rho, quad=quad)
    R = rho / math.sqrt(2.0)
    gen = torch.Generator().manual_seed(int(seed))
    starts = [_starts(x, R, n_random, gen) for x in trs[1]]
    L0 = mse(beta, X, y)

    def objective(b, rows):
        return mse(beta_map(beta, b, rows), X, y) - L0[rows]

    best, arg = _best_over_starts(objective, starts, R, n_iter)
    return best.numpy(), arg


def adaptive_quadratic(u, v, X, y, kind="adaptive"):
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
    quad = quad if quad is not None else adaptive_quadratic(u, v, X, y, kind)
    vals, xs = [], []
    for g, eig in quad:
        res = trust_region_max(g=g, radius=rho, eig=eig)
        vals.append(max(res.value, 0.0))
        xs.append(res.x)
    return np.array(vals), xs


def diagnet_adaptive_sharpness(u, v, X, y, rho: float, n_iter: int = 400, n_random: int = 2, seed: int = 0,
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
    return diagnet_adaptive_sharpness(u, v, X, y, rho, kind="euclidean", **kw)
