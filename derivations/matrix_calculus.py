"""Matrix calculus on SymPy matrix expressions, shape-generic.

Three primitives carry every derivation of the engine:

* :func:`directional_derivative` — the Fréchet derivative ``D f(θ)[δ]`` of a scalar or matrix
  expression along a direction given per symbol (``{G: δ_G, H: δ_H}``), by structural recursion:
  product rule on ``MatMul``/``Mul``, ``D(X⁻¹) = −X⁻¹ (DX) X⁻¹``, ``D(Xᵀ) = (DX)ᵀ``,
  ``D tr X = tr DX`` and the chain rule for scalar functions. It works for symbolic shapes
  (``n × h``), so results hold for every size.
* :func:`trace_gradient` — for a scalar ``f`` *linear* in a matrix ``X``, the matrix ``R`` with
  ``f = tr(Rᵀ X)`` (Riesz representer for the Frobenius product), by cyclic rotation of each trace.
* :func:`linear_terms` — for a matrix expression linear in ``X``, its decomposition
  ``Σ_i c_i L_i X K_i`` (``c_i`` scalar, ``L_i``, ``K_i`` matrices).

SymPy's own ``.diff`` on matrix expressions silently returns 0 for sums of traces (SymPy issues
26585, 27406, 26561) and raises for scalar variables (24725); these routines avoid both by never
differentiating with respect to a matrix symbol directly. Every result is checked numerically in the
tests against finite differences and exact component computations.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp
from sympy import (
    Identity,
    Inverse,
    MatAdd,
    MatMul,
    MatPow,
    MatrixExpr,
    MatrixSymbol,
    Trace,
    Transpose,
    ZeroMatrix,
)

__all__ = [
    "canonicalize",
    "directional_derivative",
    "trace_gradient",
    "trace_gradients",
    "linear_terms",
    "LinearTerm",
    "is_zero",
]


def is_zero(expr) -> bool:
    """True when ``expr`` is structurally zero (after canonicalization)."""
    if isinstance(expr, MatrixExpr):
        return isinstance(expr, ZeroMatrix) or expr == ZeroMatrix(*expr.shape)
    return expr == 0


# --------------------------------------------------------------------------------------------------
# Canonical form
# --------------------------------------------------------------------------------------------------

def _transpose(expr):
    """Push a transpose to the leaves: (AB)ᵀ = BᵀAᵀ, (A⁻¹)ᵀ = (Aᵀ)⁻¹, symmetric Xᵀ = X."""
    if not isinstance(expr, MatrixExpr):
        return expr
    if isinstance(expr, Transpose):
        return _push(expr.arg)
    if isinstance(expr, MatAdd):
        return MatAdd(*[_transpose(a) for a in expr.args]).doit()
    if isinstance(expr, MatMul):
        coeff, mats = expr.as_coeff_matrices()
        return (coeff * MatMul(*[_transpose(m) for m in reversed(mats)])).doit()
    if isinstance(expr, Inverse):
        return Inverse(_transpose(expr.arg))
    if isinstance(expr, MatPow):
        return MatPow(_transpose(expr.base), expr.exp)
    if isinstance(expr, Identity):
        return expr
    if isinstance(expr, ZeroMatrix):
        return ZeroMatrix(expr.shape[1], expr.shape[0])
    return Transpose(expr)


def _push(expr):
    """Recursively rewrite transposes so that only symbols carry them."""
    if isinstance(expr, Transpose):
        return _transpose(_push(expr.arg))
    if isinstance(expr, (MatrixSymbol, Identity, ZeroMatrix)) or expr.is_Atom:
        return expr
    if isinstance(expr, Inverse):
        arg = _push(expr.arg)
        if isinstance(arg, MatMul):
            coeff, mats = arg.as_coeff_matrices()
            if coeff != 1 and mats:  # (c M)⁻¹ = c⁻¹ M⁻¹
                return (1 / coeff) * Inverse(MatMul(*mats).doit())
        return Inverse(arg)
    if isinstance(expr, (MatMul, MatAdd, MatPow, Trace, sp.Add, sp.Mul, sp.Pow, sp.Function)):
        return expr.func(*[_push(a) for a in expr.args])
    return expr


def canonicalize(expr):
    """Expand products over sums, push transposes to symbols, cancel X X⁻¹, collect like terms.

    The result is a sum of products whose factors are symbols, their transposes and inverses of
    (canonical) matrix expressions; traces are split over sums and their scalar factors pulled out.
    """
    expr = _push(expr)
    expr = sp.expand(expr.doit() if hasattr(expr, "doit") else expr)
    expr = _split_traces(expr)
    return expr


def _split_traces(expr):
    """tr(Σ c_i M_i) → Σ c_i tr(M_i); applied bottom-up."""
    if isinstance(expr, Trace):
        arg = sp.expand(_split_traces(expr.arg))
        terms = arg.args if isinstance(arg, MatAdd) else (arg,)
        out = sp.S.Zero
        for t in terms:
            if isinstance(t, MatMul):
                coeff, mats = t.as_coeff_matrices()
                out += coeff * Trace(MatMul(*mats)) if mats else coeff
            elif isinstance(t, ZeroMatrix):
                continue
            else:
                out += Trace(t)
        return out
    if isinstance(expr, (MatrixSymbol,)) or expr.is_Atom:
        return expr
    if expr.args:
        return expr.func(*[_split_traces(a) for a in expr.args])
    return expr


# --------------------------------------------------------------------------------------------------
# Directional derivative
# --------------------------------------------------------------------------------------------------

def directional_derivative(expr, directions: dict):
    """Fréchet derivative ``D expr [δ]`` where ``directions`` maps symbols to their directions δ.

    Symbols absent from ``directions`` are held fixed. Matrix symbols map to matrix expressions of
    the same shape; scalar symbols to scalar expressions. Returns a canonicalized expression of the
    same kind as ``expr`` (scalar or matrix of the same shape).
    """
    return canonicalize(_d(expr, directions))


def _d(expr, dirs):
    if isinstance(expr, MatrixExpr):
        return _d_matrix(expr, dirs)
    return _d_scalar(expr, dirs)


def _d_matrix(expr, dirs):
    if isinstance(expr, MatrixSymbol):
        return dirs.get(expr, ZeroMatrix(*expr.shape))
    if isinstance(expr, (Identity, ZeroMatrix)) or not any(
        s in dirs for s in expr.free_symbols | _matrix_symbols(expr)
    ):
        return ZeroMatrix(*expr.shape)
    if isinstance(expr, MatAdd):
        return MatAdd(*[_d(a, dirs) for a in expr.args])
    if isinstance(expr, MatMul):
        args = expr.args
        terms = []
        for i, a in enumerate(args):
            da = _d(a, dirs)
            if is_zero(da):
                continue
            terms.append(MatMul(*args[:i], da, *args[i + 1:]))
        return MatAdd(*terms) if terms else ZeroMatrix(*expr.shape)
    if isinstance(expr, Transpose):
        return Transpose(_d(expr.arg, dirs))
    if isinstance(expr, Inverse):
        return -MatMul(expr, _d(expr.arg, dirs), expr)
    if isinstance(expr, MatPow):
        e = expr.exp
        if e == -1:
            return _d_matrix(Inverse(expr.base), dirs)
        if e.is_Integer and e > 0:
            return _d_matrix(MatMul(*([expr.base] * int(e))), dirs)
        if e.is_Integer and e < -1:  # A⁻ᵏ = (A⁻¹)ᵏ
            return _d_matrix(MatMul(*([Inverse(expr.base)] * int(-e))), dirs)
    raise NotImplementedError(f"directional derivative of {type(expr).__name__}: {expr}")


def _matrix_symbols(expr):
    return expr.atoms(MatrixSymbol) if hasattr(expr, "atoms") else set()


def _d_scalar(expr, dirs):
    expr = sp.sympify(expr)
    if not (expr.free_symbols & set(dirs)) and not (_matrix_symbols(expr) & set(dirs)):
        return sp.S.Zero
    if isinstance(expr, sp.Symbol):
        return dirs.get(expr, sp.S.Zero)
    if isinstance(expr, Trace):
        return Trace(_d(expr.arg, dirs))
    if isinstance(expr, sp.Add):
        return sp.Add(*[_d(a, dirs) for a in expr.args])
    if isinstance(expr, sp.Mul):
        args = expr.args
        return sp.Add(*[sp.Mul(*args[:i], _d(a, dirs), *args[i + 1:]) for i, a in enumerate(args)])
    if isinstance(expr, sp.Pow):
        b, e = expr.args
        if e.free_symbols & set(dirs):
            return expr * (_d(e, dirs) * sp.log(b) + e * _d(b, dirs) / b)
        return e * b ** (e - 1) * _d(b, dirs)
    if isinstance(expr, sp.Function) and len(expr.args) == 1:
        x = sp.Dummy("x")
        outer = sp.diff(expr.func(x), x).subs(x, expr.args[0])
        return outer * _d(expr.args[0], dirs)
    raise NotImplementedError(f"directional derivative of {type(expr).__name__}: {expr}")


# --------------------------------------------------------------------------------------------------
# Gradients of linear functionals and decomposition of linear operators
# --------------------------------------------------------------------------------------------------

def _terms(expr):
    expr = canonicalize(expr)
    if isinstance(expr, (sp.Add, MatAdd)):
        return list(expr.args)
    return [expr]


def trace_gradient(expr, X):
    """Matrix ``R`` with ``expr = tr(Rᵀ X)`` for a scalar ``expr`` linear in ``X``.

    Terms free of ``X`` are ignored (they belong to other variables; :func:`trace_gradients` checks
    that every term is accounted for). For a scalar symbol ``X`` returns the coefficient of ``X``.
    Raises ``ValueError`` when a term involving ``X`` is not linear in it.
    """
    if not isinstance(X, MatrixExpr):
        part = sp.Add(*[t for t in _terms(expr) if t.has(X)])
        coeff = sp.expand(part).coeff(X, 1)
        if sp.expand(part - coeff * X) != 0:
            raise ValueError(f"expression is not linear in {X}: {expr}")
        return canonicalize(coeff)
    grad = ZeroMatrix(*X.shape)
    for term in _terms(expr):
        if not term.has(X):
            continue  # belongs to another variable: see trace_gradients
        carriers = [f for f in sp.Mul.make_args(term) if f.has(X)]
        if len(carriers) != 1 or not isinstance(carriers[0], Trace):
            raise ValueError(f"term is not a scalar multiple of one trace linear in {X}: {term}")
        trace = carriers[0]
        coeff = sp.Mul(*[f for f in sp.Mul.make_args(term) if f is not trace])
        arg = trace.arg
        mcoeff, mats = (arg.as_coeff_matrices() if isinstance(arg, MatMul) else (sp.S.One, [arg]))
        coeff = coeff * mcoeff
        idx = [i for i, m in enumerate(mats) if m.has(X)]
        if len(idx) != 1 or mats[idx[0]] not in (X, Transpose(X)):
            raise ValueError(f"trace is not linear in {X} with {X} as a plain factor: {trace}")
        i = idx[0]
        rotated = mats[i + 1:] + mats[:i]  # tr(P X Q) = tr(Q P X)
        QP = MatMul(*rotated) if rotated else Identity(X.shape[1] if mats[i] == X else X.shape[0])
        if mats[i] == X:
            grad = grad + coeff * _transpose(QP.doit())  # tr(QP X) = tr(((QP)ᵀ)ᵀ X)
        else:
            grad = grad + coeff * QP  # tr(QP Xᵀ) = tr(X (QP)ᵀ)... = tr((QP)ᵀ ... ) → R = QP
    return canonicalize(grad)


def trace_gradients(expr, variables) -> list:
    """``[R_1, …, R_k]`` with ``expr = Σ_j tr(R_jᵀ X_j)`` for ``expr`` jointly linear in the ``X_j``.

    Raises ``ValueError`` if a term involves none or several of the variables.
    """
    for term in _terms(expr):
        if is_zero(term):
            continue
        hits = [X for X in variables if term.has(X)]
        if len(hits) != 1:
            raise ValueError(
                f"term {term} must be linear in exactly one of {', '.join(map(str, variables))}"
            )
    return [trace_gradient(expr, X) for X in variables]


@dataclass(frozen=True)
class LinearTerm:
    """One term ``c · L · X · K`` (or ``c · L · Xᵀ · K`` when ``transposed``) of a linear operator."""

    coeff: sp.Expr
    left: MatrixExpr | None
    right: MatrixExpr | None
    transposed: bool = False


def linear_terms(expr, X) -> list[LinearTerm]:
    """Decompose an expression linear in ``X`` into terms ``c_i L_i X K_i``.

    ``L``/``K`` are ``None`` where absent (identity). For a scalar ``X`` (a ``Symbol``) the single
    term holds the coefficient. Raises ``ValueError`` for a term that is not linear in ``X``.
    """
    if not isinstance(X, MatrixExpr):
        if isinstance(expr, MatrixExpr):
            # matrix-valued expression linear in a scalar group parameter: expr = X · M
            M = canonicalize(expr.subs(X, 1))
            if M.has(X) or not is_zero(canonicalize(expr.subs(X, 2) - 2 * M)):
                raise ValueError(f"expression is not linear in {X}: {expr}")
            return [LinearTerm(sp.S.One, M, None)]
        expanded = sp.expand(expr)
        coeff = expanded.coeff(X, 1)
        if coeff.has(X) or sp.expand(expanded - coeff * X) != 0:
            raise ValueError(f"expression is not linear in {X}: {expr}")
        return [LinearTerm(coeff, None, None)]
    out = []
    for term in _terms(expr):
        if is_zero(term):
            continue
        if term in (X, Transpose(X)):
            out.append(LinearTerm(sp.S.One, None, None, term != X))
            continue
        if not isinstance(term, MatMul):
            raise ValueError(f"term is not a product linear in {X}: {term}")
        coeff, mats = term.as_coeff_matrices()
        idx = [i for i, m in enumerate(mats) if m.has(X)]
        if coeff.has(X) or len(idx) != 1 or mats[idx[0]] not in (X, Transpose(X)):
            raise ValueError(f"term is not linear in {X} with {X} as a plain factor: {term}")
        i = idx[0]
        left = MatMul(*mats[:i]).doit() if i > 0 else None
        right = MatMul(*mats[i + 1:]).doit() if i + 1 < len(mats) else None
        out.append(LinearTerm(coeff, left, right, mats[i] != X))
    return out
