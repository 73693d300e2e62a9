"""Exact dual-number evaluation (derivations/exact_eval.py): the memoised evaluator — memo keys shared by equal
expressions built as distinct objects, values free of the volatile symbols shared between evaluators at one point —
against fresh evaluators that share nothing and against float64 numpy with a central difference for the derivative
part, and unchanged when the key tables are emptied mid-evaluation."""
from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest
import sympy as sp
from sympy import Inverse, MatrixSymbol, Trace

from derivations import exact_eval
from derivations.exact_eval import PRIME, DualEvaluator, random_int_matrix

n, k = sp.Symbol("n"), sp.Symbol("k")
SIZES = {n: 3, k: 2}


@pytest.fixture(autouse=True)
def fresh_key_tables(monkeypatch):
    """Each test starts from empty key tables (no key or clear left by earlier tests in the process)."""
    for name in ("_CANONICAL", "_BY_ID", "_MENTIONS", "_VOLATILE"):
        monkeypatch.setattr(exact_eval, name, {})


def _fresh(G, dG, xi, eta, term, modulus=None):
    """A reference: ``term`` evaluated by an evaluator that shares nothing, not even the key tables."""
    tables = {name: getattr(exact_eval, name) for name in ("_CANONICAL", "_BY_ID", "_MENTIONS", "_VOLATILE")}
    for name in tables:
        setattr(exact_eval, name, {})
    try:
        return DualEvaluator(SIZES, _env(G, dG, xi, eta), modulus=modulus)(term)
    finally:
        for name, table in tables.items():
            setattr(exact_eval, name, table)


def _symbols():
    """Fresh symbol objects (equal to those of another call, but not the same objects)."""
    return MatrixSymbol("G", n, k), MatrixSymbol("xi", n, k), MatrixSymbol("eta", n, k)


def _terms():
    """Ansatz-like terms, each built from its own symbol objects: equal sub-expressions (the Gram inverse) recur as
    distinct trees."""
    out = []
    for build in (lambda G, x, e: Trace(Inverse(G.T * G) * x.T * e),
                  lambda G, x, e: Trace(Inverse(G.T * G) * x.T * G * Inverse(G.T * G) * G.T * e),
                  lambda G, x, e: Trace(x.T * e) + 2 * Trace(G.T * G)):
        out.append(build(*_symbols()))
    return out


def _point(seed):
    rng = random.Random(seed)
    G, dG = random_int_matrix(3, 2, rng), random_int_matrix(3, 2, rng)
    G[0, 0] += 5  # full column rank at every seed used
    G[1, 1] += 5
    return G, dG, random_int_matrix(3, 2, rng), random_int_matrix(3, 2, rng)


def _env(G, dG, xi, eta):
    g, x, e = _symbols()
    return {g: (G, dG), x: (xi, None), e: (eta, None)}


def _float_reference(term_index, G, xi, eta, t=0.0, dG=None):
    G = np.array(G, dtype=float) + (0 if dG is None else t * np.array(dG, dtype=float))
    xi, eta = np.array(xi, dtype=float), np.array(eta, dtype=float)
    Ginv = np.linalg.inv(G.T @ G)
    return [np.trace(Ginv @ xi.T @ eta), np.trace(Ginv @ xi.T @ G @ Ginv @ G.T @ eta),
            np.trace(xi.T @ eta) + 2 * np.trace(G.T @ G)][term_index]


@pytest.mark.parametrize("modulus", [None, PRIME])
def test_one_memoised_evaluator_equals_fresh_evaluators_and_float64(modulus):
    G, dG, xi, eta = _point(0)
    one = DualEvaluator(SIZES, _env(G, dG, xi, eta), modulus=modulus)
    inverses, inner = [0], one._eval
    one._eval = lambda expr: (inverses.__setitem__(0, inverses[0] + isinstance(expr, Inverse)), inner(expr))[1]
    for i, term in enumerate(_terms()):
        val, der = one(term)
        assert (val, der) == _fresh(G, dG, xi, eta, term, modulus)
        if modulus is not None:  # GF(p) against ℚ reduced mod p (Fraction arithmetic, a separate path)
            exact = _fresh(G, dG, xi, eta, term)
            assert (val, der) == tuple(x.numerator * pow(x.denominator, -1, PRIME) % PRIME for x in exact)
        if modulus is None:
            assert float(val) == pytest.approx(_float_reference(i, G, xi, eta), rel=1e-12)
            h = 1e-5
            fd = (_float_reference(i, G, xi, eta, h, dG) - _float_reference(i, G, xi, eta, -h, dG)) / (2 * h)
            assert float(der) == pytest.approx(fd, rel=1e-6, abs=1e-9)
    assert sum(isinstance(s, Inverse) for t in _terms() for s in sp.preorder_traversal(t)) == 3
    assert inverses[0] == 1  # three distinct but equal Gram inverses, evaluated once


def test_values_free_of_the_volatile_symbols_are_shared_and_the_others_are_not():
    G, dG, _, _ = _point(1)
    shared, calls = {}, [0]
    results = []
    for seed in (2, 3):  # two tangents at one point θ
        _, _, xi, eta = _point(seed)
        g, x, e = _symbols()
        ev = DualEvaluator(SIZES, _env(G, dG, xi, eta), shared=shared, volatile=(x, e))
        inner = ev._eval
        ev._eval = lambda expr, inner=inner: (calls.__setitem__(0, calls[0] + 1), inner(expr))[1]
        results.append([ev(t) for t in _terms()])
        assert results[-1] == [_fresh(G, dG, xi, eta, t) for t in _terms()]
        if seed == 2:
            first_calls = calls[0]
    assert results[0] != results[1]  # the tangents differ, and so do the values that mention them
    assert shared and calls[0] - first_calls < first_calls  # the second evaluator reused the shared Gram parts


def test_whether_a_value_is_shared_depends_on_the_volatile_set():
    """An evaluator for which nothing is volatile shares every value (ξ's included) in its dict; two later evaluators
    sharing another dict, with ξ and η volatile, at two tangents, must each return their own tangent's value."""
    G, dG, xi1, eta = _point(5)
    xi2 = _point(6)[2]
    g, x, e = _symbols()
    term = _terms()[0]
    everything = {}
    DualEvaluator(SIZES, _env(G, dG, xi1, eta), shared=everything, volatile=())(term)
    assert len(everything) > 3  # ξ's values too
    shared = {}
    v1 = DualEvaluator(SIZES, _env(G, dG, xi1, eta), shared=shared, volatile=(x, e))(term)
    v2 = DualEvaluator(SIZES, _env(G, dG, xi2, eta), shared=shared, volatile=(x, e))(term)
    assert v1 == _fresh(G, dG, xi1, eta, term) and v2 == _fresh(G, dG, xi2, eta, term) != v1


def test_emptied_key_tables_change_nothing(monkeypatch):
    G, dG, xi, eta = _point(4)
    want = [_fresh(G, dG, xi, eta, t) for t in _terms()]
    shared = {}
    g, x, e = _symbols()
    DualEvaluator(SIZES, _env(G, dG, xi, eta), shared=shared, volatile=(x, e))(_terms()[1])
    assert exact_eval._MENTIONS and exact_eval._VOLATILE
    monkeypatch.setattr(exact_eval, "KEY_LIMIT", 3)  # emptied again and again during one evaluation
    got = [DualEvaluator(SIZES, _env(G, dG, xi, eta))(t) for t in _terms()]
    assert got == want
    assert len(exact_eval._BY_ID) <= 3 and len(exact_eval._CANONICAL) <= 3
    assert not exact_eval._MENTIONS and not exact_eval._VOLATILE  # emptied with them (no evaluator shared since)
    assert all(isinstance(v, Fraction) for v, _ in got)
