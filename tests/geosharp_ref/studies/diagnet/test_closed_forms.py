"""Diagonal linear networks, closed forms (geosharp_ref.studies.diagnet.closed_forms): the trust-region
solver against brute force, the closed-form geodesics against the generated kernels' geodesic equation,
the second-order map, the numerical maximiser. The networks and data come from
tests/cases/models.py (diagonal_net, diagonal_regression)."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.func import jacfwd

from geosharp_ref.kernels import load_kernels
from geosharp_ref.studies import diagnet as D
from tests.cases import diagonal_net as well_conditioned_model, diagonal_regression as small_problem

KERNELS = {m: load_kernels(f"diag_{m}") for m in ("inv", "mix")}
f64 = torch.float64


def q(A, g, x):
    return float(g @ x + x @ A @ x)


# ------------------------------------------------------------------------------------------------
# trust-region subproblem
# ------------------------------------------------------------------------------------------------

def sphere_points(dim, n):
    if dim == 2:
        t = np.linspace(0, 2 * np.pi, n, endpoint=False)
        return np.stack([np.cos(t), np.sin(t)], 1)
    i = np.arange(n) + 0.5                       # Fibonacci sphere
    phi = np.arccos(1 - 2 * i / n)
    th = np.pi * (1 + 5 ** 0.5) * i
    return np.stack([np.cos(th) * np.sin(phi), np.sin(th) * np.sin(phi), np.cos(phi)], 1)


@settings(max_examples=20)
@given(seed=st.integers(0, 10_000), dim=st.sampled_from([2, 3]), log_r=st.floats(-1.5, 1.0),
       case=st.sampled_from(["generic", "hard", "negative_definite", "indefinite"]))
def test_trust_region_matches_brute_force(seed, dim, log_r, case):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    w = np.sort(rng.uniform(-2, 2, dim))
    if case == "negative_definite":
        w = -np.abs(w) - 0.1
    elif case == "indefinite":
        w[0], w[-1] = -abs(w[0]) - 0.1, abs(w[-1]) + 0.1
    elif case == "hard":
        w[-1] = abs(w[-2]) + 0.5
    A = Q @ np.diag(w) @ Q.T
    g = rng.standard_normal(dim) * rng.uniform(0.01, 2)
    if case == "hard":                      # g ⟂ top eigenvector, small enough for the hard case
        g -= (g @ Q[:, -1]) * Q[:, -1]
        g *= 1e-3
    R = 10 ** log_r
    res = D.trust_region_max(A, g, R)
    assert np.linalg.norm(res.x) <= R * (1 + 1e-9)
    assert abs(q(A, g, res.x) - res.value) <= 1e-9 * (1 + abs(res.value))
    # brute force: the sphere (dense) and, for a possibly interior maximum, shrunken spheres
    P = sphere_points(dim, 20_000 if dim == 2 else 100_000)
    lin, quad = P @ g, ((P @ A) * P).sum(1)
    radii = np.array([R]) if w[-1] > 0 else np.linspace(0, R, 201)[1:]
    best = max(float(np.max(r * lin + r * r * quad)) for r in radii)
    best = max(best, 0.0)
    scale = abs(best) + np.linalg.norm(g) * R + np.abs(w).max() * R * R
    assert res.value >= best - 1e-12 * scale                  # never below a sampled point
    assert res.value - best <= 2e-3 * scale                   # sampling resolution
    if case == "hard":
        assert res.hard_case


def test_trust_region_exact_hard_case():
    A = np.diag([1.0, 3.0])
    g = np.array([0.2, 0.0])           # ⟂ top eigenvector e₂; x(μ=3) = (0.1/2, 0) lies inside
    res = D.trust_region_max(A, g, 1.0)
    assert res.hard_case and abs(res.mu - 3.0) < 1e-12
    x1 = 0.1 / 2
    assert np.allclose(abs(res.x[1]), math.sqrt(1 - x1**2)) and np.isclose(res.x[0], x1)
    assert np.isclose(res.value, 0.2 * x1 + x1**2 + 3 * (1 - x1**2))


def test_mix_closed_form_row_space_equals_full_trs():
    """The row-space restriction of Σ = XᵀX/n (rank n < d) gives the full d-dimensional TRS value."""
    X, y = small_problem(d=12, n=5, seed=3)
    u, v = well_conditioned_model(12, 4)
    beta = u * v
    h = D.loss_gradient(beta, X, y).numpy()
    S = (X.T @ X / X.shape[0]).numpy()
    for rho in (1e-3, 0.05, 0.7):
        full = D.trust_region_max(S, h, math.sqrt(2) * rho).value
        assert np.isclose(D.mix_sharpness(beta, X, y, rho)[0], full, rtol=1e-10)


# ------------------------------------------------------------------------------------------------
# closed-form geodesics vs generated kernels
# ------------------------------------------------------------------------------------------------

def closed_geodesic(metric, u, v, b, t):
    if metric == "inv":
        s = torch.exp(b * t)
        return u * s, v * s
    s = torch.sqrt(1 + 2 * b * t)
    return u * s, v * s


@settings(max_examples=15)
@given(seed=st.integers(0, 10_000), metric=st.sampled_from(["inv", "mix"]), t=st.floats(0.0, 0.8))
def test_closed_form_geodesic_solves_kernel_geodesic_equation(seed, metric, t):
    """γ̈(t) of the closed-form geodesic equals the generated −Γ(γ̇, γ̇) at γ(t) (t = 0: γ̈(0))."""
    u, v = well_conditioned_model(5, seed)
    g = torch.Generator().manual_seed(seed + 1)
    b = 0.4 * torch.tanh(torch.randn(5, generator=g, dtype=f64))   # 1 + 2bt > 0 on [0, 1] (mix)
    tt = torch.tensor(t, dtype=f64)
    gam = lambda s: torch.cat(closed_geodesic(metric, u, v, b, s))
    pos = gam(tt)
    vel = jacfwd(gam)(tt)
    acc = jacfwd(jacfwd(gam))(tt)
    k = KERNELS[metric]
    au, av = k.geodesic_acceleration(pos[:5], pos[5:], vel[:5], vel[5:])
    assert torch.allclose(acc, torch.cat([au, av]), rtol=1e-10, atol=1e-12)
    # velocity stays horizontal and has constant speed
    assert torch.allclose(k.horizontal_residual(pos[:5], pos[5:], vel[:5], vel[5:]),
                          torch.zeros(5, dtype=f64), atol=1e-12)
    speed = k.inner(pos[:5], pos[5:], vel[:5], vel[5:], vel[:5], vel[5:]).sum()
    speed0 = k.inner(u, v, u * b, v * b, u * b, v * b).sum()
    assert torch.allclose(speed, speed0, rtol=1e-10)
    # the norms stated in the closed forms
    expected = 2 * (b * b).sum() if metric == "inv" else ((2 * u * v * b) ** 2).sum() / 2
    assert torch.allclose(speed0, expected, rtol=1e-12)
    # β(1) of the closed form
    up, vp = closed_geodesic(metric, u, v, b, torch.tensor(1.0, dtype=f64))
    assert torch.allclose(up * vp, D.geodesic_beta(u * v, b, metric), rtol=1e-12)


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_second_order_map_is_third_order_accurate(metric):
    u, v = well_conditioned_model(6, 11)
    b = 0.2 * torch.randn(6, generator=torch.Generator().manual_seed(2), dtype=f64)
    errs = [float((D.second_order_beta(u, v, s * b, metric) - D.geodesic_beta(u * v, s * b, metric)).norm())
            for s in (1.0, 0.5, 0.25)]
    assert 6.0 < errs[0] / errs[1] < 10.0 and 6.0 < errs[1] / errs[2] < 10.0   # O(b³)
    beta = u * v
    poly = {"inv": (1 + b + b * b / 2) ** 2, "mix": 1 + 2 * b - b**3 + b**4 / 4}[metric]
    assert torch.allclose(D.second_order_beta(u, v, b, metric), beta * poly, rtol=1e-12)


def test_numerical_maximiser_reaches_trust_region_value_on_a_quadratic():
    """On the mix objective (exactly quadratic) the multi-start ascent reaches the closed form."""
    X, y = small_problem(d=10, n=6, seed=7)
    u, v = well_conditioned_model(10, 7)
    beta = (u * v)[None]
    rho = 0.3
    closed = float(D.mix_sharpness(beta, X, y, rho)[0])
    L0 = D.mse(beta, X, y)
    obj = lambda z: D.mse(beta + z, X, y) - L0
    z0 = torch.randn(6, 10, generator=torch.Generator().manual_seed(0), dtype=f64)
    f, z = D.maximize_on_ball(obj, z0, math.sqrt(2) * rho, n_iter=800)
    assert float(f.max()) <= closed * (1 + 1e-10)
    assert float(f.max()) >= closed * (1 - 1e-6)
