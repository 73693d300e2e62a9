"""Tests of the metric-only Koszul reference (geosharp_ref.verification.reference) against closed forms."""
import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from geosharp_ref.verification.reference import (
    christoffel_contraction,
    geodesic_acceleration,
    integrate_geodesic,
    metric_matrix,
)

f64 = torch.float64
seeds = st.integers(0, 2**32 - 1)
TOL = 1e-12  # relative, for algebraic identities evaluated in float64


def randn(rng, *shape):
    return torch.as_tensor(rng.standard_normal(shape), dtype=f64)


def close(a, b, tol=TOL):
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


# --- metrics -----------------------------------------------------------------------------------
def euclidean(point, xi, eta):
    return sum((a * b).sum() for a, b in zip(xi, eta))


def log_metric(point, xi, eta):
    """Σ ξ_u η_u / u² on each block (diagonal-net metric (5)); geodesics u ⊙ exp(a t)."""
    return sum((a * b / u**2).sum() for u, a, b in zip(point, xi, eta))


def poincare(point, xi, eta):
    """Half-plane (dx² + dy²) / y² with point = (x, y) as 0-dim tensors."""
    _, y = point
    return (xi[0] * eta[0] + xi[1] * eta[1]) / y**2


def inv_metric(point, xi, eta):
    G, H = point
    return (torch.trace(torch.linalg.solve(G.T @ G, xi[0].T @ eta[0]))
            + torch.trace(torch.linalg.solve(H.T @ H, xi[1].T @ eta[1])))


def mix_metric(point, xi, eta):
    G, H = point
    return torch.trace(H.T @ H @ xi[0].T @ eta[0]) + torch.trace(G.T @ G @ xi[1].T @ eta[1])


# --- tests -------------------------------------------------------------------------------------
@given(seed=seeds, n=st.integers(1, 4), k=st.integers(1, 3))
def test_euclidean_has_zero_christoffel(seed, n, k):
    rng = np.random.default_rng(seed)
    point = (randn(rng, n, k), randn(rng, k))
    xi = (randn(rng, n, k), randn(rng, k))
    gam = christoffel_contraction(euclidean, point, xi)
    assert [g.shape for g in gam] == [p.shape for p in point]
    assert all(float(g.abs().max()) < 1e-14 for g in gam)
    assert torch.equal(metric_matrix(euclidean, point), torch.eye(n * k + k, dtype=f64))


@given(seed=seeds, k=st.integers(1, 5))
def test_log_metric_closed_form(seed, k):
    """u(t) = u ⊙ exp(a t), ξ = a ⊙ u  ⇒  γ̈(0) = a² u = ξ² / u, blockwise."""
    rng = np.random.default_rng(seed)
    u = torch.as_tensor(rng.uniform(0.2, 3.0, k), dtype=f64)
    v = torch.as_tensor(rng.uniform(0.2, 3.0, (2, k)), dtype=f64)
    xi = (randn(rng, k), randn(rng, 2, k))
    acc = geodesic_acceleration(log_metric, (u, v), xi)
    assert close(acc[0], xi[0] ** 2 / u)
    assert close(acc[1], xi[1] ** 2 / v)
    # a bare tensor point is accepted and returned as a tensor
    bare = geodesic_acceleration(lambda p, a, b: (a * b / p**2).sum(), u, xi[0])
    assert isinstance(bare, torch.Tensor) and close(bare, xi[0] ** 2 / u)


@given(seed=seeds)
def test_poincare_half_plane_christoffel(seed):
    """Γ^x_xy = Γ^x_yx = −1/y, Γ^y_xx = 1/y, Γ^y_yy = −1/y (all others 0)."""
    rng = np.random.default_rng(seed)
    x, y = torch.tensor(rng.standard_normal(), dtype=f64), torch.tensor(rng.uniform(0.1, 5.0), dtype=f64)
    dx, dy = torch.tensor(rng.standard_normal(), dtype=f64), torch.tensor(rng.standard_normal(), dtype=f64)
    gx, gy = christoffel_contraction(poincare, (x, y), (dx, dy))
    assert gx.shape == () and gy.shape == ()
    assert close(gx, -2 * dx * dy / y)
    assert close(gy, (dx**2 - dy**2) / y)
    # polarization: the symmetric bilinear Γ(ξ, η) recovered from Γ(·,·) on sums has the textbook
    # components, e.g. Γ(e_x, e_y) = (−1/y, 0)
    one, zero = torch.tensor(1.0, dtype=f64), torch.tensor(0.0, dtype=f64)
    s = christoffel_contraction(poincare, (x, y), (one, one))
    ex = christoffel_contraction(poincare, (x, y), (one, zero))
    ey = christoffel_contraction(poincare, (x, y), (zero, one))
    gxy = [(s[i] - ex[i] - ey[i]) / 2 for i in range(2)]
    assert close(gxy[0], -1 / y) and close(gxy[1], 0.0)
    assert close(ex[0], 0.0) and close(ex[1], 1 / y)
    assert close(ey[0], 0.0) and close(ey[1], -1 / y)


@given(seed=seeds, n=st.integers(2, 4), m=st.integers(2, 3), h=st.integers(1, 2))
def test_gl_block_metrics_match_design_formulas(seed, n, m, h):
    """Reference agrees with the matrix-form accelerations of docs/MATH.md (valid for any ξ)."""
    rng = np.random.default_rng(seed)
    G, H = randn(rng, n, h), randn(rng, m, h)
    xG, xH = randn(rng, n, h), randn(rng, m, h)
    SG, SH = G.T @ G, H.T @ H
    aG, aH = geodesic_acceleration(inv_metric, (G, H), (xG, xH))
    assert close(aG, xG @ torch.linalg.solve(SG, xG.T @ G + G.T @ xG)
                 - G @ torch.linalg.solve(SG, xG.T @ xG), 1e-9)
    assert close(aH, xH @ torch.linalg.solve(SH, xH.T @ H + H.T @ xH)
                 - H @ torch.linalg.solve(SH, xH.T @ xH), 1e-9)
    aG, aH = geodesic_acceleration(mix_metric, (G, H), (xG, xH))
    assert close(aG, (G @ xH.T @ xH - xG @ (xH.T @ H + H.T @ xH)) @ torch.linalg.inv(SH), 1e-9)
    assert close(aH, (H @ xG.T @ xG - xH @ (xG.T @ G + G.T @ xG)) @ torch.linalg.inv(SG), 1e-9)


@given(seed=seeds, k=st.integers(1, 4), T=st.floats(-1.0, 1.5))
def test_integrate_geodesic_log_metric_closed_form_acceleration(seed, k, T):
    rng = np.random.default_rng(seed)
    u = torch.as_tensor(rng.uniform(0.3, 3.0, k), dtype=f64)
    v = torch.as_tensor(rng.uniform(0.3, 3.0, k), dtype=f64)
    a = torch.as_tensor(rng.uniform(-1.0, 1.0, k), dtype=f64)
    b = torch.as_tensor(rng.uniform(-1.0, 1.0, k), dtype=f64)

    def acc(p, w):
        return tuple(wi**2 / pi for pi, wi in zip(p, w))

    (uT, vT), (duT, dvT) = integrate_geodesic(acc, (u, v), (a * u, b * v), T)
    ea, eb = torch.exp(a * T), torch.exp(b * T)
    assert close(uT, u * ea, 1e-9) and close(vT, v * eb, 1e-9)
    assert close(duT, a * u * ea, 1e-9) and close(dvT, b * v * eb, 1e-9)


def test_integrate_geodesic_with_koszul_acceleration():
    """Rung 4 end to end: the metric-only acceleration, integrated, gives u ⊙ exp(a t)."""
    rng = np.random.default_rng(0)
    u = torch.as_tensor(rng.uniform(0.5, 2.0, 3), dtype=f64)
    a = torch.as_tensor([0.7, -0.4, 0.2], dtype=f64)
    T = 0.5
    (uT,), (duT,) = integrate_geodesic(lambda p, w: geodesic_acceleration(log_metric, p, w),
                                       (u,), (a * u,), T)
    assert close(uT, u * torch.exp(a * T), 1e-9)
    assert close(duT, a * u * torch.exp(a * T), 1e-9)
    # second-order expansion θ + tξ + ½t²γ̈(0) has O(t³) error (rung 4's shape)
    (acc0,) = geodesic_acceleration(log_metric, (u,), (a * u,))
    errs = []
    for t in (0.1, 0.05):
        exact = u * torch.exp(a * t)
        errs.append(float((u + t * a * u + 0.5 * t**2 * acc0 - exact).abs().max()))
    assert 6.0 < errs[0] / errs[1] < 10.0


def test_shape_and_dtype_errors():
    u = torch.ones(3, dtype=f64)
    with pytest.raises(ValueError, match="same structure"):
        christoffel_contraction(log_metric, (u,), (torch.ones(2, dtype=f64),))
    with pytest.raises(ValueError, match="float64"):
        christoffel_contraction(log_metric, (u.float(),), (u.float(),))
