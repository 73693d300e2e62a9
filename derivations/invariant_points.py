"""Random exact evaluation points of an invariant-metric family (:mod:`derivations.invariant`), shared by the
family's solver and its proofs (:mod:`derivations.invariant_proofs`).

:func:`random_point_evaluator` draws, at concrete ``sizes``, rational blocks θ (full column rank where they are
matrices), tangents ξ, η and a Lie algebra element X (of the symmetry's subalgebra where it has one), and returns a
:class:`~derivations.exact_eval.DualEvaluator` whose dual parts are the infinitesimal action: θ̇ = v_X(θ),
ξ̇ = D v_X[ξ], η̇ = D v_X[η] (``lie=False``: the plain point, no dual parts).
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import sympy as sp

from .exact_eval import DualEvaluator, fraction_matrix, inverse, random_int_matrix

__all__ = ["random_point_evaluator"]


def _lie_basis(family_or_sym, h):
    sym = family_or_sym
    if sym.subalgebra is not None:
        return [fraction_matrix(E) for E in sym.subalgebra.basis(h)]
    return None


def random_point_evaluator(fam, sizes, rng, lie=True):
    """A DualEvaluator at a random point: blocks θ (dual part v_X(θ)), tangents ξ, η (dual part D v_X[·]),
    random Lie algebra element X (a random combination of a subalgebra's basis)."""
    sym = fam.symmetry
    ctx = fam._ctx
    env = {Z: (val, None) for Z, val in fam.constants.items()}
    if sym.elementwise:
        for s in sym.blocks:
            env[s] = (Fraction(rng.randint(1, 9), rng.randint(1, 4)), None)
        for t in (*sym.tangent("xi"), *sym.tangent("eta")):
            env[t] = (Fraction(rng.randint(-6, 6), rng.randint(1, 3)), None)
        env[ctx["X"]] = (Fraction(rng.randint(-5, 5) or 1, 2), None)
    else:
        h = int(sym.group_element.shape[0].xreplace(sizes))
        for s in (*sym.blocks, *sym.tangent("xi"), *sym.tangent("eta")):
            r, c = (int(sp.sympify(d).xreplace(sizes)) for d in s.shape)
            M = random_int_matrix(r, c, rng)
            while s in sym.blocks and _singular(M.T @ M):
                M = random_int_matrix(r, c, rng)
            env[s] = (M, None)
        basis = _lie_basis(sym, h)
        X = (random_int_matrix(h, h, rng) if basis is None
             else sum((rng.randint(-3, 3) * E for E in basis), np.zeros((h, h), dtype=object) + Fraction(0)))
        env[ctx["X"]] = (X, None)
    ev = DualEvaluator(sizes, env)
    if lie:  # the dual parts: θ̇ = v_X(θ), ξ̇ = D v_X[ξ], η̇ = D v_X[η]
        plain = DualEvaluator(sizes, dict(env))
        for b, v, dx, de, x, e in zip(sym.blocks, ctx["v"], ctx["dv_xi"], ctx["dv_eta"], ctx["xi"], ctx["eta"]):
            env[b] = (env[b][0], plain.value(v))
            env[x] = (env[x][0], plain.value(dx))
            env[e] = (env[e][0], plain.value(de))
    return ev


def _singular(S) -> bool:
    try:
        inverse(S)
        return False
    except ZeroDivisionError:
        return True
