"""Tests of codegen/runtime.py: batched Sylvester / linear-matrix-equation solvers vs SciPy/NumPy."""
import numpy as np
import pytest
import scipy.linalg
import torch
from hypothesis import given, strategies as st

from codegen.runtime import (
    solve_linear_matrix_equation,
    solve_sylvester,
    solve_sylvester_spd_product,
)

# relative Frobenius-norm tolerances against SciPy (computed in float64)
RTOL = {torch.float64: 1e-11, torch.float32: 1e-4}

batch_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)
sizes = st.integers(1, 6)
seeds = st.integers(0, 2**32 - 1)
dtypes = st.sampled_from([torch.float64, torch.float32])


def spd(rng, shape, h, c=1.0):
    """M Mᵀ / h + c I: SPD with eigenvalues in [c, c + O(1)]."""
    M = rng.standard_normal((*shape, h, h))
    return M @ np.swapaxes(M, -1, -2) / h + c * np.eye(h)


def stable(rng, shape, h):
    """SPD + skew-symmetric: non-normal, complex eigenvalues with real part ≥ 1."""
    K = rng.standard_normal((*shape, h, h))
    return spd(rng, shape, h) + 0.5 * (K - np.swapaxes(K, -1, -2))


def scipy_sylvester(P, Q, C):
    shape = C.shape[:-2]
    P, Q = np.broadcast_to(P, (*shape, *P.shape[-2:])), np.broadcast_to(Q, (*shape, *Q.shape[-2:]))
    out = np.empty(C.shape)
    for idx in np.ndindex(*shape):
        out[idx] = scipy.linalg.solve_sylvester(P[idx], Q[idx], C[idx])
    return out


def rel_err(x, ref):
    x = x.detach().to(torch.float64).numpy()
    return np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-300)


def t(x, dtype=torch.float64):
    return torch.as_tensor(np.ascontiguousarray(x), dtype=dtype)


@given(shape=batch_shapes, n=sizes, m=sizes, seed=seeds, dtype=dtypes)
def test_solve_sylvester_matches_scipy(shape, n, m, seed, dtype):
    rng = np.random.default_rng(seed)
    P, Q, C = stable(rng, shape, n), stable(rng, shape, m), rng.standard_normal((*shape, n, m))
    L = solve_sylvester(t(P, dtype), t(Q, dtype), t(C, dtype))
    assert L.shape == (*shape, n, m) and L.dtype == dtype and not L.is_complex()
    assert rel_err(L, scipy_sylvester(P, Q, C)) < RTOL[dtype]
    # residual, in the working precision
    Pt, Qt, Ct = t(P, dtype), t(Q, dtype), t(C, dtype)
    res = torch.linalg.matrix_norm(Pt @ L + L @ Qt - Ct) / torch.linalg.matrix_norm(Ct)
    assert float(res.max()) < RTOL[dtype]


@given(shape=batch_shapes, h=sizes, seed=seeds, dtype=dtypes)
def test_solve_sylvester_spd_product_matches_scipy(shape, h, seed, dtype):
    rng = np.random.default_rng(seed)
    S1, S2, C = spd(rng, shape, h, 0.5), spd(rng, shape, h, 0.5), rng.standard_normal((*shape, h, h))
    P = S1 @ S2
    ref = scipy_sylvester(P, P, C)
    L = solve_sylvester_spd_product(t(S1, dtype), t(S2, dtype), t(C, dtype))
    assert L.shape == (*shape, h, h) and L.dtype == dtype
    assert rel_err(L, ref) < RTOL[dtype]
    # the general solver agrees on the same problem
    L_gen = solve_sylvester(t(P, dtype), t(P, dtype), t(C, dtype))
    assert rel_err(L_gen, ref) < RTOL[dtype]
    Pt, Ct = t(P, dtype), t(C, dtype)
    res = torch.linalg.matrix_norm(Pt @ L + L @ Pt - Ct) / torch.linalg.matrix_norm(Ct)
    assert float(res.max()) < RTOL[dtype]


@given(h=sizes, seed=seeds)
def test_broadcasting_batch_dims(h, seed):
    """S1 per layer (L,1,h,h), S2 shared (h,h), C per layer × head (L,K,h,h)."""
    rng = np.random.default_rng(seed)
    S1, S2, C = spd(rng, (2, 1), h), spd(rng, (), h), rng.standard_normal((2, 3, h, h))
    P = S1 @ S2
    ref = scipy_sylvester(P, P, C)
    assert rel_err(solve_sylvester_spd_product(t(S1), t(S2), t(C)), ref) < 1e-9
    assert rel_err(solve_sylvester(t(P), t(P), t(C)), ref) < 1e-9
    eye = torch.eye(h, dtype=torch.float64)
    L = solve_linear_matrix_equation([t(P), eye], [eye, t(P)], t(C))
    assert L.shape == (2, 3, h, h) and rel_err(L, ref) < 1e-9


@given(shape=batch_shapes, n=st.integers(1, 4), m=st.integers(1, 4), seed=seeds)
def test_linear_matrix_equation_two_terms_is_sylvester(shape, n, m, seed):
    rng = np.random.default_rng(seed)
    P, Q, C = stable(rng, shape, n), stable(rng, shape, m), rng.standard_normal((*shape, n, m))
    In, Im = torch.eye(n, dtype=torch.float64), torch.eye(m, dtype=torch.float64)
    L = solve_linear_matrix_equation([t(P), In], [Im, t(Q)], t(C))
    assert L.shape == (*shape, n, m)
    assert rel_err(L, solve_sylvester(t(P), t(Q), t(C)).numpy()) < 1e-9


@given(n=st.integers(1, 4), m=st.integers(1, 4), seed=seeds)
def test_linear_matrix_equation_three_terms_vs_numpy_kron(n, m, seed):
    rng = np.random.default_rng(seed)

    def unit(shape):  # random matrix of spectral norm 1
        M = rng.standard_normal(shape)
        return M / np.linalg.norm(M, 2)

    # first term SPD ⊗ SPD with eigenvalues ≥ 4; the two others have norm ≤ 0.5 each: σ_min(A) ≥ 3
    Ls = [spd(rng, (), n, 2.0), 0.5 * unit((n, n)), unit((n, n))]
    Ks = [spd(rng, (), m, 2.0), unit((m, m)), 0.5 * unit((m, m))]
    C = rng.standard_normal((n, m))
    A = sum(np.kron(K.T, L) for L, K in zip(Ls, Ks))
    ref = np.linalg.solve(A, C.flatten(order="F")).reshape((n, m), order="F")
    X = solve_linear_matrix_equation([t(L) for L in Ls], [t(K) for K in Ks], t(C))
    assert X.shape == (n, m)
    assert rel_err(X, ref) < 1e-12
    res = sum(t(L) @ X @ t(K) for L, K in zip(Ls, Ks)) - t(C)
    assert float(torch.linalg.matrix_norm(res)) < 1e-12 * np.linalg.norm(C)


def _gradcheck_inputs(seed, h=3):
    rng = np.random.default_rng(seed)
    S1, S2 = t(spd(rng, (), h)), t(spd(rng, (), h))
    P, Q = t(stable(rng, (), h)), t(stable(rng, (), h))
    C = t(rng.standard_normal((h, h)))
    return [x.requires_grad_() for x in (S1, S2, P, Q, C)]


@pytest.mark.parametrize("seed", [0, 1])
def test_gradcheck_float64(seed):
    S1, S2, P, Q, C = _gradcheck_inputs(seed)
    assert torch.autograd.gradcheck(solve_sylvester, (P, Q, C), check_forward_ad=True)
    assert torch.autograd.gradcheck(solve_sylvester_spd_product, (S1, S2, C), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(solve_sylvester, (P, Q, C))
    assert torch.autograd.gradgradcheck(solve_sylvester_spd_product, (S1, S2, C))
    eye = torch.eye(3, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda a, b, c: solve_linear_matrix_equation([a, eye], [eye, b], c), (P, Q, C))


def test_gradient_finite_at_repeated_eigenvalues():
    """P = I (orthonormal G, H): eig/eigh derivatives blow up there, the implicit ones do not."""
    h = 3
    C = torch.randn(h, h, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for solver in (solve_sylvester, solve_sylvester_spd_product):
        A = torch.eye(h, dtype=torch.float64, requires_grad=True)
        B = torch.eye(h, dtype=torch.float64, requires_grad=True)
        L = solver(A, B, C)
        assert torch.allclose(L, C / 2)
        gA, gB = torch.autograd.grad((L * C).sum(), (A, B))
        assert torch.isfinite(gA).all() and torch.isfinite(gB).all()
    # and they agree with the (smooth) Kronecker-form solution's gradient
    A = torch.eye(h, dtype=torch.float64, requires_grad=True)
    eye = torch.eye(h, dtype=torch.float64)
    Lk = solve_linear_matrix_equation([A, eye], [eye, A], C)
    (gk,) = torch.autograd.grad((Lk * C).sum(), (A,))
    A2 = torch.eye(h, dtype=torch.float64, requires_grad=True)
    (g2,) = torch.autograd.grad((solve_sylvester(A2, A2, C) * C).sum(), (A2,))
    assert torch.allclose(gk, g2, atol=1e-12)


def test_torch_func_vmap_and_grad():
    rng = np.random.default_rng(3)
    S1, S2, C = t(spd(rng, (4,), 3)), t(spd(rng, (4,), 3)), t(rng.standard_normal((4, 3, 3)))

    def f(a, b, c):
        return solve_sylvester_spd_product(a, b, c, check_finite=False)

    def g(a, b, c):
        return solve_sylvester(a @ b, a @ b, c, check_finite=False)

    ref = solve_sylvester_spd_product(S1, S2, C)
    assert torch.allclose(torch.func.vmap(f)(S1, S2, C), ref, atol=1e-12)
    assert torch.allclose(torch.func.vmap(g)(S1, S2, C), ref, atol=1e-10)
    gr = torch.func.grad(lambda a: f(a, S2[0], C[0]).square().sum())(S1[0])
    S1r = S1[0].clone().requires_grad_()
    (ga,) = torch.autograd.grad(solve_sylvester_spd_product(S1r, S2[0], C[0]).square().sum(), S1r)
    assert torch.allclose(gr, ga, atol=1e-12)


def test_errors():
    P = torch.eye(3, dtype=torch.float64)
    C = torch.ones(3, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"C must have shape \(\.\.\., 3, 2\)"):
        solve_sylvester(P, torch.eye(2, dtype=torch.float64), C)
    with pytest.raises(ValueError, match="P must be square"):
        solve_sylvester(torch.ones(3, 2), P, C)
    with pytest.raises(ValueError, match="S2 must have shape"):
        solve_sylvester_spd_product(P, torch.eye(2, dtype=torch.float64), C)
    with pytest.raises(ValueError, match="C must have shape"):
        solve_sylvester_spd_product(P, P, torch.ones(3, 4))
    with pytest.raises(ValueError, match="do not broadcast"):
        solve_sylvester(P.expand(2, 3, 3), P, C.expand(4, 3, 3))
    with pytest.raises(ValueError, match="at least 2 dims"):
        solve_sylvester(torch.ones(3), P, C)
    with pytest.raises(ValueError, match=r"Ks\[1\] must have shape"):
        solve_linear_matrix_equation([P, P], [P, torch.eye(2)], C)
    with pytest.raises(ValueError, match="equal length"):
        solve_linear_matrix_equation([P, P], [P], C)
    bad = C.clone()
    bad[1, 2] = float("nan")
    for call in (lambda: solve_sylvester(P, P, bad),
                 lambda: solve_sylvester_spd_product(P, P, bad),
                 lambda: solve_linear_matrix_equation([P], [P], bad)):
        with pytest.raises(ValueError, match="C contains non-finite"):
            call()
    inf_P = P.clone()
    inf_P[0, 0] = float("inf")
    with pytest.raises(ValueError, match="P contains non-finite"):
        solve_sylvester(inf_P, P, C)
    with pytest.raises(ValueError, match="S1 contains non-finite"):
        solve_sylvester_spd_product(inf_P, P, C)
