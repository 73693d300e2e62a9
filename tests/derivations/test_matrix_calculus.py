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
import functools
import random

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, strategies as st
from sympy import (
    Identity,
    Inverse,
    MatAdd,
    MatMul,
    MatPow,
    MatrixExpr,
    MatrixSymbol,
    OneMatrix,
    Trace,
    Transpose,
    ZeroMatrix,
)

from derivations.matrix_calculus import (
    LinearTerm,
    canonicalize,
    directional_derivative,
    linear_terms,
    trace_gradient,
    trace_gradients,
)
from derivations.symmetry import evaluate, random_point

# --------------------------------------------------------------------------------------------------
# Symbols (symbolic shapes: every result must hold for all sizes)
# --------------------------------------------------------------------------------------------------

n, m, h, k = sp.symbols("n m h k", integer=True, positive=True)
G, dG = MatrixSymbol("G", n, h), MatrixSymbol("dG", n, h)
H, dH = MatrixSymbol("H", m, h), MatrixSymbol("dH", m, h)
A, dA = MatrixSymbol("A", h, h), MatrixSymbol("dA", h, h)
B, dB = MatrixSymbol("B", h, h), MatrixSymbol("dB", h, h)
C = MatrixSymbol("C", h, h)
W, dW = MatrixSymbol("W", n, m), MatrixSymbol("dW", n, m)
X = MatrixSymbol("X", n, h)           # the variable of linear functionals / operators
Y = MatrixSymbol("Y", m, h)
S = MatrixSymbol("S", h, h)           # a square variable
P = MatrixSymbol("P", h, n)
Q = MatrixSymbol("Q", k, h)
R = MatrixSymbol("R", n, k)
u, v, du, dv = sp.symbols("u v du dv", positive=True)
x = sp.Symbol("x", real=True)

T_FD = 1e-6        # finite-difference step
RTOL_FD = 1e-6     # tolerance of derivative checks (relative to the size of f and Df)
RTOL_EXACT = 1e-12  # float64 checks of identities that hold exactly
RTOL_CANON = 1e-9  # canonical form vs original (deep random products: some rounding growth)


# --------------------------------------------------------------------------------------------------
# Independent numerical evaluator
# --------------------------------------------------------------------------------------------------

_FUNCS = {sp.exp: np.exp, sp.log: np.log, sp.sin: np.sin, sp.cos: np.cos, sp.tanh: np.tanh}


def _dim(d, sizes):
    d = sp.sympify(d)
    return int(d.xreplace({s: sizes[s.name] for s in d.free_symbols}))


def num(expr, vals, sizes):
    """Evaluate a SymPy (matrix) expression with NumPy: ``vals`` maps symbol names to float arrays
    or floats, ``sizes`` maps dimension names to ints. Raises on anything it does not know."""
    memo = {}

    def ev(e):
        if e not in memo:
            memo[e] = ev_(e)
        return memo[e]

    def ev_(e):
        if isinstance(e, MatrixSymbol):
            val = np.asarray(vals[e.name], dtype=float)
            assert val.shape == tuple(_dim(d, sizes) for d in e.shape), e
            return val
        if isinstance(e, Identity):
            return np.eye(_dim(e.shape[0], sizes))
        if isinstance(e, ZeroMatrix):
            return np.zeros(tuple(_dim(d, sizes) for d in e.shape))
        if isinstance(e, OneMatrix):
            return np.ones(tuple(_dim(d, sizes) for d in e.shape))
        if isinstance(e, MatMul):
            parts = [ev(a) for a in e.args]
            scal = [p for p in parts if np.ndim(p) == 0]
            mats = [p for p in parts if np.ndim(p) == 2]
            return functools.reduce(np.multiply, scal, 1.0) * functools.reduce(np.matmul, mats)
        if isinstance(e, MatAdd):
            return functools.reduce(np.add, [ev(a) for a in e.args])
        if isinstance(e, Transpose):
            return ev(e.arg).T
        if isinstance(e, Inverse):
            return np.linalg.inv(ev(e.arg))
        if isinstance(e, MatPow):
            return np.linalg.matrix_power(ev(e.base), int(e.exp))
        if isinstance(e, Trace):
            return float(np.trace(ev(e.arg)))
        if isinstance(e, sp.Add):
            return functools.reduce(np.add, [ev(a) for a in e.args])
        if isinstance(e, sp.Mul):
            parts = [ev(a) for a in e.args]
            assert sum(np.ndim(p) == 2 for p in parts) <= 1, f"product of matrices in a Mul: {e}"
            return functools.reduce(np.multiply, parts)
        if isinstance(e, sp.Pow):
            return float(ev(e.base)) ** float(ev(e.exp))
        if isinstance(e, sp.Symbol):  # a scalar, or a dimension (Trace(Identity(h)) = h)
            return float(vals[e.name] if e.name in vals else sizes[e.name])
        if isinstance(e, (sp.Number, sp.NumberSymbol)):
            return float(e)
        if isinstance(e, sp.Function) and e.func in _FUNCS:
            return _FUNCS[e.func](ev(e.args[0]))
        raise NotImplementedError(f"test evaluator: {type(e).__name__}: {e}")

    return ev(sp.sympify(expr))


def random_values(symbols, sizes, rng, shift=3.0):
    """Float values: matrices standard normal plus ``shift``·I (rectangular eye), so square ones and
    Gram matrices GᵀG of tall ones are comfortably invertible; scalars in [0.5, 2]."""
    out = {}
    for s in symbols:
        if isinstance(s, MatrixSymbol):
            r, c = (_dim(d, sizes) for d in s.shape)
            out[s.name] = rng.standard_normal((r, c)) + shift * np.eye(r, c)
        else:
            out[s.name] = float(rng.uniform(0.5, 2.0))
    return out


def _symbols(*exprs):
    out = set()
    for e in exprs:
        e = sp.sympify(e)
        out |= e.atoms(MatrixSymbol)
        out |= {s for s in e.free_symbols if isinstance(s, sp.Symbol) and not s.is_integer}
    return sorted(out, key=lambda s: s.name)


def _max_abs(a):
    return float(np.max(np.abs(a))) if np.size(a) else 0.0


def assert_close(got, ref, rtol, scale=0.0, what=""):
    got, ref = np.asarray(got, dtype=float), np.asarray(ref, dtype=float)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    err = _max_abs(got - ref)
    tol = rtol * max(1.0, _max_abs(ref), scale)
    assert err <= tol, f"{what}: max abs error {err:.3e} > {tol:.3e}\ngot={got}\nref={ref}"


# Sizes: h ≤ n so that Inverse(Gᵀ G) exists.
@st.composite
def sizes_st(draw):
    hh = draw(st.integers(1, 3))
    return {"h": hh, "n": hh + draw(st.integers(0, 2)), "m": draw(st.integers(1, 3)),
            "k": draw(st.integers(1, 3))}


seeds = st.integers(0, 2**32 - 1)


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


@functools.lru_cache(maxsize=None)
def _derivative(expr, directions):
    return directional_derivative(expr, dict(directions))


def _fd_check(expr, directions, sizes, seed):
    """Compare directional_derivative(expr, directions) with central differences. ``directions``
    maps symbols to direction expressions (the direction symbols get random values too)."""
    d = _derivative(expr, tuple(directions.items()))
    if isinstance(expr, MatrixExpr):
        assert isinstance(d, MatrixExpr) and d.shape == expr.shape, (expr, d)
    else:
        assert not isinstance(d, MatrixExpr), (expr, d)
    rng = np.random.default_rng(seed)
    vals = random_values(_symbols(expr, d, *directions, *directions.values()), sizes, rng)
    delta = {s.name: num(dirn, vals, sizes) for s, dirn in directions.items()}

    def f_at(t):
        moved = dict(vals)
        for name, dl in delta.items():
            moved[name] = vals[name] + t * dl
        return num(expr, moved, sizes)

    f0 = f_at(0.0)
    fd = (f_at(T_FD) - f_at(-T_FD)) / (2 * T_FD)
    exact = num(d, vals, sizes)
    assert_close(exact, fd, RTOL_FD, scale=_max_abs(f0), what=f"D[{expr}] = {d}")
    return exact, fd


@pytest.mark.parametrize("name", sorted(DERIVATIVE_CASES))
@given(sizes=sizes_st(), seed=seeds)
def test_directional_derivative_matches_finite_differences(name, sizes, seed):
    expr = DERIVATIVE_CASES[name]
    dirs = {s: dirn for s, dirn in ALL_DIRS.items() if s in _symbols(expr)}
    _fd_check(expr, dirs, sizes, seed)


@given(sizes=sizes_st(), seed=seeds)
def test_directional_derivative_partial_and_expression_directions(sizes, seed):
    """Symbols absent from the directions are held fixed; directions may be expressions (here the
    vertical direction G ↦ G X of the GL action, and a scalar direction u ↦ 2 v)."""
    expr = Trace(Inverse(G.T * G) * H.T * H) * u + Trace(G * A * G.T)
    _fd_check(expr, {G: G * B}, sizes, seed)                  # H, A, u fixed
    _fd_check(expr, {H: dH, u: 2 * v}, sizes, seed + 1)        # G, A fixed
    _fd_check(G * Inverse(G.T * G) * H.T, {G: G * B, H: H * Inverse(B).T}, sizes, seed + 2)


def test_directional_derivative_zero_when_no_symbol_moves():
    expr = Trace(Inverse(G.T * G) * H.T * H) * u
    assert directional_derivative(expr, {W: dW, v: dv}) == 0
    Z = directional_derivative(G * H.T, {A: dA})
    assert isinstance(Z, ZeroMatrix) and Z.shape == (n, m)


def test_directional_derivative_sum_of_traces_is_not_zero():
    """SymPy's own .diff returns 0 for sums of traces; the engine must not."""
    d = directional_derivative(Trace(G.T * G) + Trace(G.T * G * A), {G: dG})
    assert d != 0
    _fd_check(Trace(G.T * G) + Trace(G.T * G * A), {G: dG}, {"n": 3, "h": 2}, 0)


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


# --------------------------------------------------------------------------------------------------
# linear_terms: expr = Σ c L X K
# --------------------------------------------------------------------------------------------------

LINEAR_OPERATORS = {
    # h×h valued
    "gram_like": G.T * X + X.T * G + u * A * G.T * X * Inverse(A) - 2 * Transpose(X.T * G),
    # n×h valued
    "left_right": X + 2 * X * A + G * Inverse(G.T * G) * G.T * X - X * Transpose(B * A) / v,
    "cancellation": (X + G) * A - G * A,
    "trace_coefficient": Trace(G.T * G) * X * B + sp.sqrt(u) * G * Transpose(X.T * G),
    # m×n valued, transposed variable
    "transposed": H * X.T + Trace(A) * H * B * X.T * W * Inverse(W.T * W + Identity(m)) * W.T,
}


def _rebuild(terms, X_, vals, sizes):
    Xv = vals[X_.name]
    out = 0
    for t in terms:
        assert isinstance(t, LinearTerm)
        M = Xv.T if t.transposed else Xv
        if t.left is not None:
            M = num(t.left, vals, sizes) @ M
        if t.right is not None:
            M = M @ num(t.right, vals, sizes)
        out = out + num(t.coeff, vals, sizes) * M
    return out


@pytest.mark.parametrize("name", sorted(LINEAR_OPERATORS))
@given(sizes=sizes_st(), seed=seeds)
def test_linear_terms_reconstruct_the_operator(name, sizes, seed):
    expr = LINEAR_OPERATORS[name]
    terms = linear_terms(expr, X)
    assert terms
    syms = _symbols(expr, X, *[t.coeff for t in terms], *[t.left for t in terms if t.left is not None],
                    *[t.right for t in terms if t.right is not None])
    vals = random_values(syms, sizes, np.random.default_rng(seed))
    ref = num(expr, vals, sizes)
    got = _rebuild(terms, X, vals, sizes)
    assert_close(got, ref, RTOL_EXACT, scale=_max_abs(vals["X"]), what=f"{expr} -> {terms}")


def test_linear_terms_exact():
    expr = LINEAR_OPERATORS["gram_like"] + LINEAR_OPERATORS["gram_like"].T
    terms = linear_terms(expr, X)
    dims = {n: 3, h: 2}
    vals = random_point(_symbols(expr, X), dims, random.Random(5), positive={u})
    out = sp.zeros(2, 2)
    for t in terms:
        M = vals[X].T if t.transposed else vals[X]
        L = evaluate(t.left, vals, dims) if t.left is not None else sp.eye(M.shape[0])
        K = evaluate(t.right, vals, dims) if t.right is not None else sp.eye(M.shape[1])
        out += evaluate(t.coeff, vals, dims) * L * M * K
    assert (out - evaluate(expr, vals, dims)).applyfunc(sp.simplify) == sp.zeros(2, 2)


def test_linear_terms_scalar_variable():
    terms = linear_terms(u**2 * x + v * x, x)
    assert len(terms) == 1 and sp.simplify(terms[0].coeff - (u**2 + v)) == 0
    terms = linear_terms(x * G * A + G * x * u, x)  # matrix-valued, linear in a scalar
    sizes = {"n": 3, "h": 2}
    vals = random_values([G, A, u], sizes, np.random.default_rng(2))
    got = sum(num(t.coeff, vals, sizes) * 0.8 * num(t.left if t.left is not None else Identity(n), vals, sizes)
              for t in terms)
    assert_close(got, num(x * G * A + G * x * u, {**vals, "x": 0.8}, sizes), RTOL_EXACT)


@pytest.mark.parametrize("expr,var", [
    (S * S, S), (S.T * A * S, S), (X * X.T, X), (Inverse(S), S), (X + G, X), (A * S * B * S.T, S),
], ids=str)
def test_linear_terms_rejects_nonlinear(expr, var):
    with pytest.raises(ValueError):
        linear_terms(expr, var)


@pytest.mark.parametrize("expr", [Trace(S) * S, Trace(A * S) * A * S.T], ids=str)
def test_linear_terms_rejects_variable_in_coefficient(expr):
    with pytest.raises(ValueError):
        linear_terms(expr, S)


@pytest.mark.parametrize("expr", [x**2 + 3 * x, x**2 * G], ids=["scalar", "matrix"])
def test_linear_terms_rejects_nonlinear_scalar_variable(expr):
    with pytest.raises(ValueError):
        linear_terms(expr, x)


# --------------------------------------------------------------------------------------------------
# canonicalize
# --------------------------------------------------------------------------------------------------

def _transposes_only_on_symbols(expr):
    return all(isinstance(t.arg, MatrixSymbol) for t in sp.sympify(expr).atoms(Transpose))


CANONICAL_CASES = [
    Transpose(G * A * H.T),
    Transpose(Inverse(A) * B) * (A + B).T,
    Inverse(Transpose(2 * A * B)),
    Transpose(Inverse(G.T * G) * G.T),
    Trace(Transpose(A + B) * (G.T * G + u * A)),
    (G + G * A) * (A - B).T * Inverse(A.T * A),
    Transpose(MatPow(A, 2) * B),
    Transpose(Trace(A) * A * Transpose(B * Transpose(C))),
    Trace(Transpose(G * A) * (G * B - 3 * G)) / Trace(G.T * G) + u,
]


_canonicalize = functools.lru_cache(maxsize=None)(canonicalize)


def _check_canonical(expr, sizes, seed):
    c = _canonicalize(expr)
    assert _transposes_only_on_symbols(c), f"{expr} -> {c}"
    if isinstance(expr, MatrixExpr):
        assert isinstance(c, MatrixExpr) and c.shape == expr.shape
    vals = random_values(_symbols(expr, c), sizes, np.random.default_rng(seed))
    ref = num(expr, vals, sizes)
    assert_close(num(c, vals, sizes), ref, RTOL_CANON, what=f"{expr} -> {c}")


@pytest.mark.parametrize("expr", CANONICAL_CASES, ids=str)
@given(sizes=sizes_st(), seed=seeds)
def test_canonicalize_preserves_value_and_pushes_transposes(expr, sizes, seed):
    _check_canonical(expr, sizes, seed)


# random square expression trees (h × h): sums, products, transposes, scalar multiples, traces and
# inverses of always-invertible matrices M Mᵀ + I
_leaves = st.sampled_from([A, B, C, A.T, Identity(h), 2 * B])


def _extend(children):
    pairs = st.tuples(children, children)
    return st.one_of(
        pairs.map(lambda p: p[0] + p[1]),
        pairs.map(lambda p: p[0] - p[1]),
        pairs.map(lambda p: MatMul(p[0], p[1])),
        children.map(Transpose),
        children.map(lambda e: Inverse(MatMul(e, Transpose(e)) + Identity(h))),
        st.tuples(st.sampled_from([sp.Rational(1, 2), -3, u]), children).map(lambda p: p[0] * p[1]),
        pairs.map(lambda p: Trace(p[0]) * p[1]),
    )


square_trees = st.recursive(_leaves, _extend, max_leaves=5)


def _extend_flat(children):
    """As _extend, but inverses only of leaf Gram matrices (derivatives of inverses of long products
    expand into thousands of terms)."""
    pairs = st.tuples(children, children)
    return st.one_of(
        pairs.map(lambda p: p[0] + p[1]),
        pairs.map(lambda p: MatMul(p[0], p[1])),
        children.map(Transpose),
        st.tuples(st.sampled_from([sp.Rational(1, 2), -3, u]), children).map(lambda p: p[0] * p[1]),
        pairs.map(lambda p: Trace(p[0]) * p[1]),
    )


_inverse_leaves = _leaves.map(lambda e: Inverse(MatMul(e, Transpose(e)) + Identity(h)))
flat_square_trees = st.recursive(st.one_of(_leaves, _inverse_leaves), _extend_flat, max_leaves=5)


@given(expr=square_trees, hh=st.integers(1, 3), seed=seeds)
def test_canonicalize_random_trees(expr, hh, seed):
    _check_canonical(expr, {"h": hh}, seed)
    _check_canonical(Trace(expr), {"h": hh}, seed)


@given(expr=flat_square_trees, hh=st.integers(1, 3), seed=seeds)
def test_directional_derivative_random_trees(expr, hh, seed):
    _fd_check(expr, {A: dA, B: dB}, {"h": hh}, seed)  # C held fixed


@pytest.mark.parametrize("expr", [Inverse(A) * Inverse(A), Trace(B * Inverse(A) * Inverse(A)),
                                  MatPow(A, -3)], ids=str)
def test_directional_derivative_negative_matpow(expr):
    _fd_check(expr, {A: dA}, {"h": 3}, 0)
