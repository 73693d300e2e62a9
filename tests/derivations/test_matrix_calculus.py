"""Tests of derivations/matrix_calculus.py against independent numerical computations.

Every symbolic result is evaluated with NumPy at concrete sizes by a small tree-walking evaluator
defined here (it shares no code with the module under test; it is itself cross-checked against the
exact rational evaluator ``derivations.symmetry.evaluate``):

* ``directional_derivative`` vs central finite differences (f(θ+tδ) − f(θ−tδ)) / 2t, t = 1e-6,
  tolerance 1e-6 relative to the size of f and of the derivative;
* ``trace_gradient`` / ``trace_gradients``: f(X) = Σ tr(Rᵀ X) at random X, to 1e-12 in float64
  (relative to Σ|R_ij X_ij|) and exactly in rational arithmetic;
* ``linear_terms``: Σ c L X K rebuilt numerically equals the expression (1e-12, and exactly);
* ``canonicalize``: same values before and after (1e-9 relative), transposes only on symbols.
"""
import random

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from sympy import Identity, Inverse, MatPow, MatrixExpr, MatrixSymbol, OneMatrix, Trace, Transpose, ZeroMatrix

from derivations.matrix_calculus import directional_derivative, trace_gradient, trace_gradients
from derivations.symmetry import evaluate, random_point

from tests.derivations.matrix_numeric import (_symbols, A, assert_close, B, C, dA, dB, dG, dH, du, dv, dW, fd_check, G, H, h, k, m, n, num, P, Q, R, random_values, RTOL_EXACT, RTOL_FD, S, seeds, sizes_st, T_FD, u, v, W, X, x, Y)

def test_evaluator_agrees_with_exact_evaluate():
    """The harness itself: the float evaluator equals derivations.symmetry.evaluate (exact)."""
    expr = (Trace(Inverse(G.T * G) * H.T * H) * G * A.T + u**2 / v * G * Inverse(A) * B
            + sp.sqrt(Trace(W.T * W)) * W * OneMatrix(m, h) + G * MatPow(A, 2).T)
    sizes = {"n": 3, "m": 2, "h": 2}
    dims = {n: 3, m: 2, h: 2}
    rng = random.Random(7)
    syms = _symbols(expr)
    exact_vals = random_point(syms, dims, rng, positive={u, v})
    exact = evaluate(expr, exact_vals, dims, simplify=False)
    fvals = {s.name: (np.array(val.tolist(), dtype=float) if isinstance(val, sp.MatrixBase)
                      else float(val)) for s, val in exact_vals.items()}
    got = num(expr, fvals, sizes)
    assert_close(got, np.array(exact.evalf(20).tolist(), dtype=float), 1e-13)


# --------------------------------------------------------------------------------------------------
# directional_derivative vs central finite differences
# --------------------------------------------------------------------------------------------------

ALL_DIRS = {G: dG, H: dH, A: dA, B: dB, W: dW, u: du, v: dv}

DERIVATIVE_CASES = {
    "product": G * H.T,
    "transpose_of_product": Transpose(G * A) * G,
    "inverse_gram": Inverse(G.T * G),
    "projector": G * Inverse(G.T * G) * G.T,
    "inverse_transposed": Transpose(Inverse(A)) * B * Inverse(A * B),
    "matpow": MatPow(A, 3) + MatPow(B, -1),
    "trace_inverse_metric": Trace(Inverse(G.T * G) * H.T * H),
    "sum_of_traces": Trace(G.T * G) + Trace(H.T * H) + Trace(A * B) + Trace(A.T * G.T * G),
    "inverse_of_trace": 1 / Trace(W.T * W),
    "sqrt_of_trace": sp.sqrt(Trace(W.T * W)),
    "normalised_matrix": W / sp.sqrt(Trace(W.T * W)),
    "scalar_symbols": u**2 / v,
    "scalar_times_trace": u * Trace(G.T * G) + sp.exp(v) * Trace(A) - sp.log(Trace(W.T * W)),
    "function_times_matrix": sp.sin(Trace(A)) * H + u * H * B.T,
    "variable_exponent": Trace(W.T * W) ** u,
    "product_of_traces": Trace(A) * Trace(B * A) / Trace(G.T * G),
    "trace_of_projector_is_constant": Trace(G * Inverse(G.T * G) * G.T),
    "inverse_of_sum": Inverse(A.T * A + B * B.T + u * Identity(h)),
}


@pytest.mark.parametrize("name", sorted(DERIVATIVE_CASES))
@given(sizes=sizes_st(), seed=seeds)
def test_directional_derivative_matches_finite_differences(name, sizes, seed):
    expr = DERIVATIVE_CASES[name]
    dirs = {s: dirn for s, dirn in ALL_DIRS.items() if s in _symbols(expr)}
    fd_check(expr, dirs, sizes, seed)


@given(sizes=sizes_st(), seed=seeds)
def test_directional_derivative_partial_and_expression_directions(sizes, seed):
    """Symbols absent from the directions are held fixed; directions may be expressions (here the
    vertical direction G ↦ G X of the GL action, and a scalar direction u ↦ 2 v)."""
    expr = Trace(Inverse(G.T * G) * H.T * H) * u + Trace(G * A * G.T)
    fd_check(expr, {G: G * B}, sizes, seed)                  # H, A, u fixed
    fd_check(expr, {H: dH, u: 2 * v}, sizes, seed + 1)        # G, A fixed
    fd_check(G * Inverse(G.T * G) * H.T, {G: G * B, H: H * Inverse(B).T}, sizes, seed + 2)


def test_directional_derivative_zero_when_no_symbol_moves():
    expr = Trace(Inverse(G.T * G) * H.T * H) * u
    assert directional_derivative(expr, {W: dW, v: dv}) == 0
    Z = directional_derivative(G * H.T, {A: dA})
    assert isinstance(Z, ZeroMatrix) and Z.shape == (n, m)


def test_directional_derivative_sum_of_traces_is_not_zero():
    """SymPy's own .diff returns 0 for sums of traces; the engine must not."""
    d = directional_derivative(Trace(G.T * G) + Trace(G.T * G * A), {G: dG})
    assert d != 0
    fd_check(Trace(G.T * G) + Trace(G.T * G * A), {G: dG}, {"n": 3, "h": 2}, 0)


def test_finite_difference_check_is_not_vacuous():
    """The tolerance rejects a derivative that is off by a single term or a factor."""
    sizes, rng = {"n": 3, "h": 2}, np.random.default_rng(0)
    vals = random_values([G, dG], sizes, rng)
    f = lambda t: num(Trace(G.T * G), {**vals, "G": vals["G"] + t * vals["dG"]}, sizes)  # noqa: E731
    fd = (f(T_FD) - f(-T_FD)) / (2 * T_FD)
    wrong = num(Trace(G.T * dG), vals, sizes)  # missing the factor 2
    with pytest.raises(AssertionError):
        assert_close(wrong, fd, RTOL_FD, scale=f(0.0))
    assert_close(2 * wrong, fd, RTOL_FD, scale=f(0.0))


# --------------------------------------------------------------------------------------------------
# trace_gradient / trace_gradients: f(X) = tr(Rᵀ X)
# --------------------------------------------------------------------------------------------------

# linear (homogeneous) in X ∈ R^{n×h}
LINEAR_FUNCTIONALS = {
    "plain": Trace(P * X),
    "transposed_with_coeff": 3 * Trace(Q * X.T * R),
    "scalar_coeff_inverse": u * Trace(Inverse(G.T * G) * X.T * G),
    "trace_ratio": Trace(G.T * X) / Trace(G.T * G),
    "sum_inside_trace": Trace(A * (X.T * G + G.T * X)),
    "transpose_of_product": Trace((X * A).T * G),
    "mixed_sum": (Trace(P * X) - u**2 / v * Trace(X.T * G * B) + sp.sqrt(Trace(W.T * W)) * Trace(Q * X.T * R)
                  + Trace(Transpose(G * Inverse(A) * B) * X * C)),
}


def _check_gradient(expr, X_, Rg, sizes, seed, affine_ok=False):
    """f(X) − f(0) = tr(Rᵀ X) at random values (f(0) = 0 unless ``affine_ok``)."""
    rng = np.random.default_rng(seed)
    vals = random_values(_symbols(expr, Rg, X_), sizes, rng)
    Rv, Xv = num(Rg, vals, sizes), vals[X_.name]
    lhs = num(expr, vals, sizes)
    f0 = num(expr, {**vals, X_.name: np.zeros_like(Xv)}, sizes)
    if not affine_ok:
        assert abs(f0) <= 1e-12 * max(1.0, abs(lhs))
    rhs = float(np.sum(Rv * Xv))
    assert_close(lhs - f0, rhs, RTOL_EXACT, scale=float(np.sum(np.abs(Rv * Xv))) + abs(f0),
                 what=f"grad of {expr}: {Rg}")


@pytest.mark.parametrize("name", sorted(LINEAR_FUNCTIONALS))
@given(sizes=sizes_st(), seed=seeds)
def test_trace_gradient_represents_linear_functional(name, sizes, seed):
    expr = LINEAR_FUNCTIONALS[name]
    Rg = trace_gradient(expr, X)
    assert isinstance(Rg, MatrixExpr) and Rg.shape == X.shape
    _check_gradient(expr, X, Rg, sizes, seed)


@pytest.mark.parametrize("name", sorted(LINEAR_FUNCTIONALS))
def test_trace_gradient_exact(name):
    """The same identity in exact rational arithmetic (zero tolerance)."""
    expr = LINEAR_FUNCTIONALS[name]
    Rg = trace_gradient(expr, X)
    dims = {n: 3, m: 2, h: 2, k: 2}
    vals = random_point(_symbols(expr, Rg, X), dims, random.Random(11), positive={u, v})
    if W in vals:  # sqrt(tr WᵀW) rational: W = diag-ish with tr WᵀW a square
        vals[W] = sp.Matrix([[3, 0], [0, 4], [0, 0]])
    lhs = evaluate(expr, vals, dims)
    Rv = evaluate(Rg, vals, dims)
    assert sp.simplify(lhs - (Rv.T * vals[X]).trace()) == 0


def test_trace_gradient_square_and_transposed_variable():
    sizes = {"h": 3}
    for expr, ref in [(Trace(S), Identity(h)), (Trace(S.T), Identity(h)),
                      (2 * Trace(A * S.T), 2 * A), (Trace(A * S), A.T)]:
        Rg = trace_gradient(expr, S)
        vals = random_values([A, S], sizes, np.random.default_rng(0))
        assert_close(num(Rg, vals, sizes), num(ref, vals, sizes), RTOL_EXACT, what=str(expr))


@given(sizes=sizes_st(), seed=seeds)
def test_trace_gradient_ignores_terms_free_of_the_variable(sizes, seed):
    expr = Trace(P * X) + Trace(G.T * G) * u + Trace(H.T * Y)
    Rg = trace_gradient(expr, X)
    _check_gradient(expr, X, Rg, sizes, seed, affine_ok=True)


def test_trace_gradient_scalar_variable():
    expr = u**2 * x + v * x * Trace(G.T * G) + Trace(x * A)
    c = trace_gradient(expr, x)
    sizes = {"n": 3, "h": 2}
    vals = random_values([G, A, u, v], sizes, np.random.default_rng(1))
    for xv in (0.7, -1.3):
        assert_close(num(expr, {**vals, "x": xv}, sizes), num(c, vals, sizes) * xv, RTOL_EXACT)
    with pytest.raises(ValueError):
        trace_gradient(x**2 + x, x)


@pytest.mark.parametrize("expr", [
    Trace(X.T * X), Trace(P * X) ** 2, Trace(P * X) * Trace(P * X), Trace(Inverse(S)),
    Trace(S * S), sp.sqrt(Trace(P * X)),
], ids=str)
def test_trace_gradient_rejects_nonlinear(expr):
    var = S if S in expr.atoms(MatrixSymbol) else X
    with pytest.raises(ValueError):
        trace_gradient(expr, var)


@given(sizes=sizes_st(), seed=seeds)
def test_trace_gradients_jointly_linear(sizes, seed):
    expr = (Trace(P * X) + 2 * Trace(Inverse(G.T * G) * Y.T * H) - u * Trace(Y * B * H.T)
            + Trace(Transpose(X * A) * G) + x * Trace(A * B))
    RX, RY, Rx = trace_gradients(expr, [X, Y, x])
    assert RX.shape == X.shape and RY.shape == Y.shape and not isinstance(Rx, MatrixExpr)
    rng = np.random.default_rng(seed)
    vals = random_values(_symbols(expr, RX, RY, Rx), sizes, rng)
    pieces = [np.sum(num(RX, vals, sizes) * vals["X"]), np.sum(num(RY, vals, sizes) * vals["Y"]),
              num(Rx, vals, sizes) * vals["x"]]
    assert_close(num(expr, vals, sizes), sum(pieces), RTOL_EXACT,
                 scale=sum(abs(float(p)) for p in pieces))


@pytest.mark.parametrize("expr", [
    Trace(X.T * G) + Trace(P * X * Transpose(Y) * H),  # X and Y in one term
    Trace(P * X) + Trace(G.T * G),   # a term with no variable
    Trace(P * X) + x * Trace(P * X),  # x and X in one term
], ids=["two_matrix_variables", "no_variable", "scalar_and_matrix_variable"])
def test_trace_gradients_rejects_terms_with_two_or_no_variables(expr):
    with pytest.raises(ValueError):
        trace_gradients(expr, [X, Y, x])
