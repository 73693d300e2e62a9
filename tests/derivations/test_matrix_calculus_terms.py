"""Tests of derivations/matrix_calculus.py, continued: ``linear_terms`` (Σ c L X K rebuilt numerically equals the
expression, 1e-12 and exactly) and ``canonicalize`` (same values before and after, 1e-9 relative; transposes
only on symbols), against the independent evaluator of :mod:`tests.derivations.matrix_numeric`."""
import functools
import random

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, strategies as st
from sympy import Identity, Inverse, MatMul, MatPow, MatrixExpr, MatrixSymbol, Trace, Transpose

from derivations.matrix_calculus import LinearTerm, canonicalize, linear_terms
from derivations.symmetry import evaluate, random_point

from tests.derivations.matrix_numeric import (_max_abs, _symbols, A, assert_close, B, C, dA, dB, fd_check, G, H, h, m, n, num, random_values, RTOL_CANON, RTOL_EXACT, S, seeds, sizes_st, u, v, W, X, x)

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
    fd_check(expr, {A: dA, B: dB}, {"h": hh}, seed)  # C held fixed


@pytest.mark.parametrize("expr", [Inverse(A) * Inverse(A), Trace(B * Inverse(A) * Inverse(A)),
                                  MatPow(A, -3)], ids=str)
def test_directional_derivative_negative_matpow(expr):
    fd_check(expr, {A: dA}, {"h": 3}, 0)
