"""Exact evaluation of (matrix) expressions at concrete sizes, with first-order dual numbers.

Used by :mod:`derivations.invariant` to assemble the linear system of infinitesimal invariance exactly:
every value is a pair (x, ẋ) of exact rationals (``fractions.Fraction``; matrices as numpy object arrays of
them), and every operation follows the product rule, so evaluating an expression f at θ + t θ̇ gives
(f(θ), d/dt f(θ + t θ̇)|₀) exactly:

    (A, Ȧ)(B, Ḃ) = (AB, ȦB + AḂ),   (A, Ȧ)⁻¹ = (A⁻¹, −A⁻¹ȦA⁻¹),   tr(A, Ȧ) = (tr A, tr Ȧ),
    (a, ȧ)^k = (a^k, k a^{k−1} ȧ)   (integer k).

A derivative part ``None`` stands for zero (constants). Sub-expressions are memoised per point, so the
Gram matrices and inverses shared by many ansatz terms are computed once; the memos are keyed by an int per
distinct expression (:func:`_key`), so that equal sub-expressions built as separate trees meet without SymPy
comparing the trees node by node at every lookup.
"""
from __future__ import annotations

import itertools
import random
from fractions import Fraction

import numpy as np
import sympy as sp
from sympy import (Identity, Inverse, MatAdd, MatMul, MatPow, MatrixSymbol, OneMatrix, Trace, Transpose,
                   ZeroMatrix)

__all__ = ["DualEvaluator", "fraction_matrix", "random_int_matrix", "inverse", "to_fraction", "PRIME",
           "rational_reconstruction", "KEY_LIMIT"]

#: the prime of the modular mode (2⁶¹ − 1): exact arithmetic in GF(p) keeps numbers small
PRIME = 2**61 - 1


def rational_reconstruction(a: int, p: int = PRIME) -> Fraction:
    """The fraction r/s with |r|, s ≤ √(p/2) and r ≡ a s (mod p) (extended Euclid); ValueError if none."""
    a %= p
    r0, r1, s0, s1 = p, a, 0, 1
    bound = int((p // 2) ** 0.5)
    while r1 > bound:
        q = r0 // r1
        r0, r1, s0, s1 = r1, r0 - q * r1, s1, s0 - q * s1
    if s1 == 0 or abs(s1) > bound:
        raise ValueError(f"no small rational for {a} mod {p}")
    return Fraction(r1, s1) if s1 > 0 else Fraction(-r1, -s1)


def _mod_matrix(M, p):
    if isinstance(M, np.ndarray):
        return np.array([[_mod_scalar(x, p) for x in row] for row in M], dtype=object)
    return _mod_scalar(M, p)


def _mod_scalar(x, p):
    x = Fraction(x)
    return x.numerator * pow(x.denominator, -1, p) % p


def _inverse_mod(M, p):
    n = M.shape[0]
    aug = [[int(x) for x in M[i]] + [int(i == j) for j in range(n)] for i in range(n)]
    for c in range(n):
        piv_row = next((r for r in range(c, n) if aug[r][c] % p), None)
        if piv_row is None:
            raise ZeroDivisionError("singular matrix mod p")
        aug[c], aug[piv_row] = aug[piv_row], aug[c]
        iv = pow(aug[c][c], -1, p)
        aug[c] = [x * iv % p for x in aug[c]]
        for r in range(n):
            if r != c and aug[r][c] % p:
                f = aug[r][c]
                aug[r] = [(x - f * y) % p for x, y in zip(aug[r], aug[c])]
    return np.array([row[n:] for row in aug], dtype=object)


def to_fraction(x) -> Fraction:
    x = sp.nsimplify(x) if not isinstance(x, (int, Fraction, sp.Rational)) else x
    if isinstance(x, sp.Rational):
        return Fraction(int(x.p), int(x.q))
    return Fraction(x)


def fraction_matrix(M) -> np.ndarray:
    """A numpy object array of Fractions from a SymPy/nested-list matrix."""
    M = sp.Matrix(M)
    return np.array([[to_fraction(M[i, j]) for j in range(M.cols)] for i in range(M.rows)], dtype=object)


def random_int_matrix(rows, cols, rng: random.Random, lo=-3, hi=3) -> np.ndarray:
    return np.array([[Fraction(rng.randint(lo, hi)) for _ in range(cols)] for _ in range(rows)], dtype=object)


def inverse(M: np.ndarray) -> np.ndarray:
    """Exact inverse by Gauss–Jordan elimination (ZeroDivisionError when singular)."""
    if M.dtype != object:
        return np.linalg.inv(M)
    n = M.shape[0]
    aug = [list(M[i]) + [Fraction(int(i == j)) for j in range(n)] for i in range(n)]
    for c in range(n):
        p = next((r for r in range(c, n) if aug[r][c] != 0), None)
        if p is None:
            raise ZeroDivisionError("singular matrix")
        aug[c], aug[p] = aug[p], aug[c]
        piv = aug[c][c]
        aug[c] = [x / piv for x in aug[c]]
        for r in range(n):
            if r != c and aug[r][c] != 0:
                f = aug[r][c]
                aug[r] = [x - f * y for x, y in zip(aug[r], aug[c])]
    return np.array([row[n:] for row in aug], dtype=object)


#: memo keys (:func:`_key`): expression → its key, id(expression object) → (the object, its key) — holding the
#: object keeps its id from being reused —, (key, volatile-set key) → whether the expression mentions the set, and
#: volatile set → its key (by value: a few distinct sets per solve)
_CANONICAL: dict = {}
_BY_ID: dict = {}
_MENTIONS: dict = {}
_VOLATILE: dict = {}
_NEXT_KEY = itertools.count()
#: the key tables are emptied when they reach this many objects (a key is never reused, so a memo keyed before
#: misses after, nothing more; a joint symmetry's solve at 3 × 2 keys ≈ 4,600 objects, ≈ 1 kB each)
KEY_LIMIT = 1 << 15


def _key(expr) -> int:
    """The memo key of ``expr``: equal expressions get one int, found by the object's identity after its first lookup.

    SymPy compares equal but distinct trees node by node (``Basic.__eq__``), and the ansatz terms share many equal
    sub-expressions built separately, so keying the memos by the expressions themselves spent about a quarter of
    an invariant-metric solve comparing trees."""
    hit = _BY_ID.get(id(expr))
    if hit is not None:
        return hit[1]
    if len(_BY_ID) >= KEY_LIMIT:
        _BY_ID.clear(), _CANONICAL.clear(), _MENTIONS.clear(), _VOLATILE.clear()
    k = _CANONICAL.get(expr)
    if k is None:
        k = _CANONICAL[expr] = next(_NEXT_KEY)
    _BY_ID[id(expr)] = (expr, k)
    return k


def _volatile_key(symbols: frozenset) -> int:
    """The key of a set of volatile symbols, by value (an evaluator's set is a new object each time)."""
    k = _VOLATILE.get(symbols)
    if k is None:
        k = _VOLATILE[symbols] = next(_NEXT_KEY)
    return k


def _mentions(k: int, expr, symbols: frozenset, symbols_key: int) -> bool:
    """Whether ``expr`` (of key ``k``) contains one of ``symbols`` (of key ``symbols_key``), memoised:
    ``free_symbols`` walks the whole tree."""
    hit = _MENTIONS.get((k, symbols_key))
    if hit is None:
        hit = _MENTIONS[(k, symbols_key)] = bool(expr.free_symbols & symbols)
    return hit


def _mul(a, b):
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a @ b
    return a * b


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b


class DualEvaluator:
    """Evaluate SymPy expressions at one concrete point as dual numbers.

    ``sizes``: dimension symbol → int; ``env``: symbol (``MatrixSymbol`` or scalar ``Symbol``) → (value,
    derivative or None). Symbols missing from ``env`` raise KeyError (a bug in the caller). Evaluators given one
    ``shared`` dict must have the same ``volatile`` symbols and the same values of every other symbol (one point
    θ, several tangents): a value that mentions no volatile symbol is computed by the first and reused by the
    others."""

    def __init__(self, sizes: dict, env: dict, exact: bool = True, shared: dict | None = None, volatile=(),
                 modulus: int | None = None):
        self.sizes = {s: int(v) for s, v in sizes.items()}
        self.env = env
        self.exact = exact
        self.memo: dict = {}
        #: values of sub-expressions free of the ``volatile`` symbols, shared between evaluators at one point
        self.shared = shared
        self.volatile = frozenset(volatile)
        self._volatile_key = None if shared is None else _volatile_key(self.volatile)
        #: exact arithmetic in GF(modulus) instead of ℚ (values are ints; inputs given as Fractions are reduced)
        self.modulus = modulus

    def dim(self, d) -> int:
        return int(sp.sympify(d).xreplace(self.sizes))

    def __call__(self, expr):
        k = _key(expr)
        hit = self.memo.get(k)
        if hit is None and self.shared is not None:
            hit = self.shared.get(k)
        if hit is None:
            hit = self._eval(expr)
            if self.shared is not None and not _mentions(k, expr, self.volatile, self._volatile_key):
                self.shared[k] = hit
            else:
                self.memo[k] = hit
        return hit

    def _num(self, x):
        if self.modulus:
            return _mod_scalar(to_fraction(x), self.modulus)
        return to_fraction(x) if self.exact else float(x)

    def _eval(self, e):
        val, der = self._eval_field(e)
        p = self.modulus
        if p:
            val = val % p
            der = None if der is None else der % p
        return val, der

    def _eye(self, n):
        if not self.exact:
            return np.eye(n)
        return np.array([[Fraction(int(i == j)) for j in range(n)] for i in range(n)], dtype=object)

    def value(self, expr):
        return self(expr)[0]

    def _eval_field(self, e):
        if isinstance(e, (MatrixSymbol, sp.Symbol)):
            v, d = self.env[e]
            if self.modulus:
                return _mod_matrix(v, self.modulus), (None if d is None else _mod_matrix(d, self.modulus))
            return v, d
        if isinstance(e, sp.Number) or e.is_Number:
            return self._num(e), None
        if isinstance(e, Identity):
            return self._eye(self.dim(e.shape[0])), None
        if isinstance(e, (ZeroMatrix, OneMatrix)):
            shape = (self.dim(e.shape[0]), self.dim(e.shape[1]))
            fill = int(isinstance(e, OneMatrix))
            return (np.full(shape, Fraction(fill), dtype=object) if self.exact else np.full(shape, float(fill))), None
        if isinstance(e, (MatMul, sp.Mul)):
            val, der = None, None
            for a in e.args:
                av, ad = self(a)
                if val is None:
                    val, der = av, ad
                    continue
                der = _add(_mul(der, av) if der is not None else None, _mul(val, ad) if ad is not None else None)
                val = _mul(val, av)
            return val, der
        if isinstance(e, (MatAdd, sp.Add)):
            val, der = None, None
            for a in e.args:
                av, ad = self(a)
                val = av if val is None else val + av
                der = _add(der, ad)
            return val, der
        if isinstance(e, Transpose):
            v, d = self(e.arg)
            return v.T, (None if d is None else d.T)
        if isinstance(e, Inverse) or (isinstance(e, MatPow) and e.exp == -1):
            v, d = self(e.args[0])
            vi = _inverse_mod(v, self.modulus) if self.modulus else inverse(v)
            return vi, (None if d is None else -(vi @ d @ vi))
        if isinstance(e, MatPow) and e.exp.is_Integer and e.exp != 0:
            k = int(e.exp)
            f = e.base if k > 0 else Inverse(e.base)
            return self(MatMul(*([f] * abs(k)))) if abs(k) > 1 else self(f)
        if isinstance(e, Trace):
            v, d = self(e.arg)
            return np.trace(v), (None if d is None else np.trace(d))
        if isinstance(e, sp.Pow) and e.exp.is_Integer:
            v, d = self(e.base)
            k = int(e.exp)
            if self.modulus:
                p = self.modulus
                return pow(int(v), k, p), (None if d is None else k * pow(int(v), k - 1, p) * d)
            val = v ** k
            return val, (None if d is None else k * v ** (k - 1) * d)
        raise NotImplementedError(f"exact evaluation of {type(e).__name__}: {e}")
