"""The independent numerical side of the matrix-calculus tests: symbols with symbolic shapes, a NumPy
tree-walking evaluator of SymPy matrix expressions (it shares no code with derivations/matrix_calculus.py and is
cross-checked against the exact rational evaluator ``derivations.symmetry.evaluate``), random values and the
tolerances, and the finite-difference check of ``directional_derivative``."""
import functools

import numpy as np
import sympy as sp
from hypothesis import strategies as st
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

from derivations.matrix_calculus import directional_derivative

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


@functools.lru_cache(maxsize=None)
def derivative(expr, directions):
    return directional_derivative(expr, dict(directions))


def fd_check(expr, directions, sizes, seed):
    """Compare directional_derivative(expr, directions) with central differences. ``directions``
    maps symbols to direction expressions (the direction symbols get random values too)."""
    d = derivative(expr, tuple(directions.items()))
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
