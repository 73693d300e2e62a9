"""Tests for geosharp_ref.geometry: the GL(h) quotient geometry (``gl_pair``) and AdaptiveGeometry.

Property tests (hypothesis) over batch shapes (layers × heads, including no batch dims), block sizes
n, m ≥ h, seeds and group elements A = a·Q·D (a log-uniform in [1e-2, 1e2], Q orthogonal,
D = diag U[0.5, 2]), on well-conditioned points (G, H) (singular values in [0.5, 2]), in float64; all
drawn with geosharp_ref.sampling (:func:`orbit_element`, :func:`well_conditioned`).

Under ψ(A, θ) = (G A, H A⁻ᵀ) tangent vectors transform as (ξ_G A, ξ_H A⁻ᵀ) and Euclidean gradients
as (∇_G A⁻ᵀ, ∇_H A). Checked for both metrics: the metric is invariant; the horizontal projection,
the Riemannian gradient, the geodesic acceleration and exp2 are equivariant; plus the defining
identities of each object (g-orthogonal projection, g(grad f, η) = df(η), the invariant-loss identity
Gᵀ∇_G L = (∇_H L)ᵀ H) and input validation.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, strategies as st

from geosharp_ref.geometry import METRICS, AdaptiveGeometry, GLPairGeometry, gl_pair
from geosharp_ref.sampling import orbit_element, well_conditioned

DT = torch.float64
# Relative tolerance for identities evaluated in float64 on points whose Gram matrices have condition
# number <= 16 and group elements with cond(A) <= 4, |a| in [1e-2, 1e2]. Observed (dev profile,
# 60 examples): <= 1.6e-13; the exp2 second difference (cancellation, bound 1e-8/t²) <= 8e-9.
TOL = 1e-10

metrics = pytest.mark.parametrize("metric", METRICS)




# ---------------------------------------------------------------------------------------------
# Random well-conditioned data
# ---------------------------------------------------------------------------------------------

def _orthogonal(gen, batch, k):
    """(…, k, k) orthogonal: :func:`well_conditioned` with every singular value 1."""
    return well_conditioned((*batch, k, k), gen, DT, cond=1.0)


def _point(gen, batch, rows, h):
    """(…, rows, h) with singular values in [0.5, 2]: 0.5 · :func:`well_conditioned` (singular values in [1, 4])."""
    return 0.5 * well_conditioned((*batch, rows, h), gen, DT)


def _group_element(gen, batch, h, log10_a):
    """A = a·Q·diag(u), u ∈ [0.5, 2], per batch entry: :func:`orbit_element` with the batch flattened."""
    return orbit_element(math.prod(batch), h, 10.0 ** log10_a, gen, DT).reshape(*batch, h, h)


def _tangent(gen, G, H):
    return (torch.randn(G.shape, generator=gen, dtype=DT), torch.randn(H.shape, generator=gen, dtype=DT))


def _move(xi, A):
    """Tangent vector at θ → tangent vector at ψ(A, θ): (ξ_G A, ξ_H A⁻ᵀ)."""
    return xi[0] @ A, torch.linalg.solve(A.mT, xi[1], left=False)


def _move_grad(g, A):
    """Euclidean gradient (covector) at θ → at ψ(A, θ): (∇_G A⁻ᵀ, ∇_H A)."""
    return torch.linalg.solve(A.mT, g[0], left=False), g[1] @ A


def _rel(a, b):
    """max-norm relative difference of tensors or tuples of tensors."""
    if isinstance(a, (tuple, list)):
        return max(_rel(x, y) for x, y in zip(a, b))
    scale = float(b.abs().max()) if b.numel() else 0.0
    return float((a - b).abs().max()) / max(scale, 1e-300) if b.numel() else 0.0


@st.composite
def setups(draw):
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))  # layers × heads
    h = draw(st.integers(1, 4))
    n = h + draw(st.integers(0, 3))
    m = h + draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    log10_a = draw(st.floats(-2.0, 2.0))
    return batch, n, m, h, seed, log10_a


def _data(setup):
    batch, n, m, h, seed, log10_a = setup
    gen = torch.Generator().manual_seed(seed)
    G, H = _point(gen, batch, n, h), _point(gen, batch, m, h)
    A = _group_element(gen, batch, h, log10_a)
    return gen, G, H, A


# ---------------------------------------------------------------------------------------------
# Invariance / equivariance along orbits
# ---------------------------------------------------------------------------------------------

@metrics
@given(setup=setups())
def test_act_matches_definition_and_preserves_product(metric, setup):
    _, G, H, A = _data(setup)
    geo = gl_pair(metric)
    G1, H1 = geo.act(G, H, A)
    assert _rel(G1, G @ A) <= TOL
    assert _rel(H1, H @ torch.linalg.inv(A).mT) <= TOL
    assert _rel(G1 @ H1.mT, G @ H.mT) <= TOL


@metrics
@given(setup=setups())
def test_inner_invariant(metric, setup):
    gen, G, H, A = _data(setup)
    geo = gl_pair(metric)
    xi, eta = _tangent(gen, G, H), _tangent(gen, G, H)
    G1, H1 = geo.act(G, H, A)
    g0 = geo.inner(G, H, xi, eta)
    g1 = geo.inner(G1, H1, _move(xi, A), _move(eta, A))
    assert g0.shape == G.shape[:-2]
    scale = geo.norm(G, H, xi) * geo.norm(G, H, eta)  # |g(ξ, η)| can be ≈ 0: compare to ‖ξ‖‖η‖
    assert float(((g1 - g0).abs() / scale).max()) <= TOL
    # symmetric, and positive definite on random vectors
    assert _rel(geo.inner(G, H, eta, xi), g0) <= TOL
    assert bool((geo.inner(G, H, xi, xi) > 0).all())


@metrics
@given(setup=setups())
def test_project_horizontal_equivariant_and_horizontal(metric, setup):
    gen, G, H, A = _data(setup)
    geo = gl_pair(metric)
    xi = _tangent(gen, G, H)
    p0 = geo.project_horizontal(G, H, xi)
    G1, H1 = geo.act(G, H, A)
    p1 = geo.project_horizontal(G1, H1, _move(xi, A))
    assert _rel(p1, _move(p0, A)) <= TOL
    # horizontal: residual ≈ 0 relative to the residual of the unprojected vector
    r_in = geo.horizontal_residual(G, H, xi)
    r_out = geo.horizontal_residual(G, H, p0)
    assert float(r_out.abs().max()) <= TOL * max(float(r_in.abs().max()), 1.0)
    # idempotent; the removed part is vertical and g-orthogonal to the result
    assert _rel(geo.project_horizontal(G, H, p0), p0) <= TOL
    vert = (xi[0] - p0[0], xi[1] - p0[1])
    nx = geo.norm(G, H, xi)
    assert float((geo.inner(G, H, vert, p0).abs() / nx**2).max()) <= TOL
    X = torch.randn(G.shape[:-2] + (G.shape[-1], G.shape[-1]), generator=gen, dtype=DT)
    v = (G @ X, -(H @ X.mT))
    pv = geo.project_horizontal(G, H, v)
    assert max(float(pv[0].abs().max()), float(pv[1].abs().max())) <= TOL * float(X.abs().max())


@metrics
@given(setup=setups())
def test_riemannian_gradient_equivariant_and_defining_identity(metric, setup):
    gen, G, H, A = _data(setup)
    geo = gl_pair(metric)
    egrad = _tangent(gen, G, H)  # any covector
    r0 = geo.riemannian_gradient(G, H, egrad)
    G1, H1 = geo.act(G, H, A)
    r1 = geo.riemannian_gradient(G1, H1, _move_grad(egrad, A))
    assert _rel(r1, _move(r0, A)) <= TOL
    # g(grad, η) = <∇, η>_Euclid for every η
    eta = _tangent(gen, G, H)
    lhs = geo.inner(G, H, r0, eta)
    rhs = (egrad[0] * eta[0]).sum((-2, -1)) + (egrad[1] * eta[1]).sum((-2, -1))
    scale = (geo.norm(G, H, r0) * geo.norm(G, H, eta))
    assert float(((lhs - rhs).abs() / scale).max()) <= TOL
    # its metric norm is invariant (the quantity compared in the model-level tests)
    assert _rel(geo.norm(G1, H1, r1), geo.norm(G, H, r0)) <= TOL


@metrics
@given(setup=setups())
def test_geodesic_acceleration_equivariant(metric, setup):
    gen, G, H, A = _data(setup)
    geo = gl_pair(metric)
    xi = geo.project_horizontal(G, H, _tangent(gen, G, H))
    a0 = geo.geodesic_acceleration(G, H, xi)
    G1, H1 = geo.act(G, H, A)
    a1 = geo.geodesic_acceleration(G1, H1, _move(xi, A))
    assert _rel(a1, _move(a0, A)) <= TOL
    # quadratic in ξ
    a2 = geo.geodesic_acceleration(G, H, (0.3 * xi[0], 0.3 * xi[1]))
    assert _rel(a2, (0.09 * a0[0], 0.09 * a0[1])) <= TOL


@metrics
@given(setup=setups(), t=st.floats(1e-3, 2.0))
def test_exp2_consistent_with_acceleration(metric, setup, t):
    gen, G, H, A = _data(setup)
    geo = gl_pair(metric)
    xi = geo.project_horizontal(G, H, _tangent(gen, G, H))
    acc = geo.geodesic_acceleration(G, H, xi)
    txi = (t * xi[0], t * xi[1])
    E = geo.exp2(G, H, txi)
    # exp2(tξ) = θ + tξ + ½ t² γ̈(0)
    ref = (G + txi[0] + 0.5 * t * t * acc[0], H + txi[1] + 0.5 * t * t * acc[1])
    assert _rel(E, ref) <= TOL
    # second difference of the curve t ↦ exp2(tξ) recovers γ̈(0) (exact for a quadratic curve)
    Ep, Em = geo.exp2(G, H, txi), geo.exp2(G, H, (-t * xi[0], -t * xi[1]))
    sd = tuple((p + q - 2 * x) / t**2 for p, q, x in zip(Ep, Em, (G, H)))
    assert _rel(sd, acc) <= 1e-8 / t**2  # cancellation error ~ 1e-16·|θ| / t²
    # equivariant: the exp2 of the moved vector at the moved point is the moved exp2
    G1, H1 = geo.act(G, H, A)
    E1 = geo.exp2(G1, H1, _move(txi, A))
    assert _rel(E1, geo.act(*E, A)) <= TOL


@metrics
@given(setup=setups(), cached=st.booleans())
def test_exp2_gradient_through_generated_vjp_equals_autograd(metric, setup, cached):
    """exp2 backpropagates through the generated VJP (a custom autograd function): its gradient
    in ξ equals autograd through θ + ξ + ½γ̈ (the acceleration kernel), and with G, H requiring
    gradients exp2 falls back to plain autograd (gradients for all four inputs)."""
    gen, G, H, _ = _data(setup)
    geo = gl_pair(metric)
    cache = geo.prepare(G, H) if cached else None
    xi = tuple(x.requires_grad_(True) for x in _tangent(gen, G, H))
    w = _tangent(gen, G, H)

    def loss(E):
        return (torch.sin(E[0]) * w[0]).sum() + (E[1] ** 2 * w[1]).sum()

    E = geo.exp2(G, H, xi, cache=cache)
    assert "SecondOrderGeodesic" in type(E[0].grad_fn).__name__  # the generated-VJP path
    got = torch.autograd.grad(loss(E), xi)
    acc = geo.geodesic_acceleration(G, H, xi, cache=cache)
    ref = torch.autograd.grad(loss((G + xi[0] + 0.5 * acc[0], H + xi[1] + 0.5 * acc[1])), xi)
    assert _rel(got, ref) <= TOL
    Gr, Hr = G.clone().requires_grad_(True), H.clone().requires_grad_(True)
    full = torch.autograd.grad(loss(geo.exp2(Gr, Hr, xi)), (Gr, Hr) + xi)
    assert _rel(full[2:], ref) <= TOL and all(float(g.abs().max()) > 0 for g in full[:2])


@metrics
def test_exp2_custom_backward_passes_gradcheck_and_gradgradcheck(metric):
    gen = torch.Generator().manual_seed(0)
    G, H = _point(gen, (2,), 5, 3), _point(gen, (2,), 4, 3)
    geo = gl_pair(metric)
    cache = geo.prepare(G, H)
    xi = tuple(x.requires_grad_(True) for x in _tangent(gen, G, H))

    def f(a, b):
        return geo.exp2(G, H, (a, b), cache=cache)

    assert torch.autograd.gradcheck(f, xi)
    assert torch.autograd.gradgradcheck(f, xi)


@metrics
@given(setup=setups())
def test_invariant_loss_gradient_identity_and_horizontal_gradient(metric, setup):
    """For L(G Hᵀ): Gᵀ∇_G L = (∇_H L)ᵀ H, and the Riemannian gradient is already horizontal."""
    gen, G, H, A = _data(setup)
    geo = gl_pair(metric)
    W = torch.randn(G.shape[:-1] + (H.shape[-2],), generator=gen, dtype=DT)
    Gr, Hr = G.clone().requires_grad_(), H.clone().requires_grad_()
    M = Gr @ Hr.mT
    L = (torch.sin(M) * W).sum() + 0.1 * (M**2).sum()
    dG, dH = torch.autograd.grad(L, (Gr, Hr))
    lhs, rhs = G.mT @ dG, dH.mT @ H
    assert float((lhs - rhs).abs().max()) <= TOL * max(float(lhs.abs().max()), 1.0)
    r = geo.riemannian_gradient(G, H, (dG, dH))
    res = geo.horizontal_residual(G, H, r)
    # (G, H) have singular values in [0.5, 2], so a generic residual is O(|r|) up to a factor 16
    assert float(res.abs().max()) <= 16 * TOL * max(1.0, float(r[0].abs().max()), float(r[1].abs().max()))
    assert _rel(geo.project_horizontal(G, H, r), r) <= TOL
    # and the moved gradient is the gradient of the same loss at the moved point
    G1, H1 = geo.act(G, H, A)
    G1r, H1r = G1.clone().requires_grad_(), H1.clone().requires_grad_()
    M1 = G1r @ H1r.mT
    L1 = (torch.sin(M1) * W).sum() + 0.1 * (M1**2).sum()
    dG1, dH1 = torch.autograd.grad(L1, (G1r, H1r))
    assert _rel((dG1, dH1), _move_grad((dG, dH), A)) <= 1e-8


@given(setup=setups(), eps=st.floats(1e-8, 1e-2))
def test_relaxation_keeps_orthogonal_invariance(setup, eps):
    """With ε > 0 the Gram matrices become XᵀX + εI: still invariant under orthogonal A (AᵀA = I)."""
    batch, n, m, h, seed, _ = setup
    gen = torch.Generator().manual_seed(seed)
    G, H = _point(gen, batch, n, h), _point(gen, batch, m, h)
    Q = _orthogonal(gen, batch, h)
    xi = _tangent(gen, G, H)
    for metric in METRICS:
        geo = gl_pair(metric, eps)
        G1, H1 = geo.act(G, H, Q)
        assert _rel(geo.inner(G1, H1, _move(xi, Q), _move(xi, Q)), geo.inner(G, H, xi, xi)) <= TOL
        assert _rel(geo.project_horizontal(G1, H1, _move(xi, Q)), _move(geo.project_horizontal(G, H, xi), Q)) <= TOL
        # small ε barely moves the metric on well-conditioned points
        exact = gl_pair(metric).inner(G, H, xi, xi)
        assert _rel(geo.inner(G, H, xi, xi), exact) <= 20 * eps


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------

def test_unknown_metric_and_bad_eps():
    with pytest.raises(ValueError, match="unknown metric 'euclid'"):
        gl_pair("euclid")
    for bad in (-1e-6, float("nan")):
        with pytest.raises(ValueError, match="eps must be >= 0"):
            gl_pair("inv", bad)
    geo = gl_pair("inv", 0)
    assert isinstance(geo, GLPairGeometry) and geo.eps == 0.0 and isinstance(geo.eps, float)
    assert gl_pair().metric == "mix"


@metrics
def test_shape_mismatch_errors(metric):
    geo = gl_pair(metric)
    gen = torch.Generator().manual_seed(0)
    G, H = _point(gen, (2,), 5, 3), _point(gen, (2,), 4, 3)
    xi = _tangent(gen, G, H)
    with pytest.raises(ValueError, match=r"G \(2, 5, 3\) and H \(2, 4, 2\)"):
        geo.inner(G, H[..., :2], xi, xi)
    with pytest.raises(ValueError, match="must share batch dims"):
        geo.project_horizontal(G, _point(gen, (3,), 4, 3), xi)
    bad = (xi[0][..., :4, :], xi[1])
    with pytest.raises(ValueError, match=r"xi_G has shape \(2, 4, 3\), expected \(2, 5, 3\)"):
        geo.inner(G, H, bad, xi)
    with pytest.raises(ValueError, match="eta_H has shape"):
        geo.inner(G, H, xi, (xi[0], xi[1][:1]))
    with pytest.raises(ValueError, match="xi_H has shape"):
        geo.project_horizontal(G, H, (xi[0], xi[1].mT))
    with pytest.raises(ValueError, match="egrad_G has shape"):
        geo.riemannian_gradient(G, H, bad)
    with pytest.raises(ValueError, match="xi_G has shape"):
        geo.geodesic_acceleration(G, H, bad)
    with pytest.raises(ValueError, match="xi_G has shape"):
        geo.exp2(G, H, bad)


# ---------------------------------------------------------------------------------------------
# AdaptiveGeometry
# ---------------------------------------------------------------------------------------------

@given(seed=st.integers(0, 2**31 - 1), offset=st.sampled_from([0.0, 0.1, 1.0]))
def test_adaptive_geometry(seed, offset):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(4, 5, generator=gen, dtype=DT)
    w[0, :2] = 0.0  # coordinates with w = 0
    w[2, 3] = -0.0
    egrad, xi, eta = (torch.randn(4, 5, generator=gen, dtype=DT) for _ in range(3))
    geo = AdaptiveGeometry(offset)
    c = w.abs() + offset
    assert torch.equal(geo.scale(w), c)
    assert torch.allclose(geo.riemannian_gradient(w, egrad), c**2 * egrad, rtol=1e-15, atol=0)
    if offset == 0.0:
        assert torch.equal(geo.riemannian_gradient(w, egrad), w.abs() ** 2 * egrad)
    val = geo.inner(w, xi, eta)
    assert math.isfinite(float(val))
    live = c > 0
    expected = (xi[live] * eta[live] / c[live] ** 2).sum()
    assert abs(float(val - expected)) <= 1e-12 * max(1.0, abs(float(expected)))
    # the Riemannian gradient represents the differential: g(c² ∇, η) = <∇, η> on the live coordinates
    r = geo.riemannian_gradient(w, egrad)
    lhs = geo.inner(w, r, eta)
    rhs = (egrad * eta)[live].sum()
    assert abs(float(lhs - rhs)) <= 1e-12 * max(1.0, float((egrad * eta).abs().sum()))
    if offset == 0.0:
        # zero coordinates contribute nothing, whatever ξ is there (no NaN from 0/0)
        xi2 = xi.clone()
        xi2[0, :2] = 1e6
        assert float(geo.inner(w, xi2, xi2)) == pytest.approx(float(geo.inner(w, xi, xi)), rel=1e-14)
        assert bool((r[~live] == 0).all())


def test_adaptive_geometry_all_zero_weight():
    geo = AdaptiveGeometry()
    w = torch.zeros(3, dtype=DT)
    x = torch.ones(3, dtype=DT)
    assert float(geo.inner(w, x, x)) == 0.0
    assert torch.equal(geo.riemannian_gradient(w, x), torch.zeros(3, dtype=DT))


# ---------------------------------------------------------------------------------------------
# Base-point cache (prepare → cache=): the fast path Auto-PGD uses
# ---------------------------------------------------------------------------------------------

@metrics
@given(setup=setups(), eps=st.sampled_from([0.0, 1e-3]))
def test_cached_methods_equal_uncached(metric, setup, eps):
    gen, G, H, A = _data(setup)
    geo = gl_pair(metric, eps)
    xi, eta = _tangent(gen, G, H), _tangent(gen, G, H)
    cache = geo.prepare(G, H)
    for name, args in (("inner", (xi, eta)), ("project_horizontal", (xi,)), ("horizontal_residual", (xi,)),
                       ("riemannian_gradient", (xi,)), ("geodesic_acceleration", (xi,)), ("exp2", (xi,)),
                       ("norm", (xi,))):
        fn = getattr(geo, name)
        a, b = fn(G, H, *args), fn(G, H, *args, cache=cache)
        assert _rel(b, a) <= 1e-12, name


@metrics
def test_cache_from_another_point_or_relaxation_is_refused(metric):
    gen = torch.Generator().manual_seed(0)
    G, H = _point(gen, (2,), 5, 3), _point(gen, (2,), 4, 3)
    xi = _tangent(gen, G, H)
    cache = gl_pair(metric).prepare(G, H)
    with pytest.raises(ValueError, match="different base point"):
        gl_pair(metric).project_horizontal(G * 2, H, xi, cache=cache)
    with pytest.raises(ValueError, match="eps"):
        gl_pair(metric, 1e-3).inner(G, H, xi, xi, cache=cache)
