"""Proofs and definiteness for :mod:`derivations.invariant` (and :mod:`derivations.joint`).

* :func:`prove_invariance` — :func:`derivations.metric.check_invariance` (symbolic, every size), and for a metric
  with a subgroup's centralizer constants Z_k the same proof with A Z_k = Z_k A used as a rewrite
  (:func:`move_group_factors_left`: group factors are moved left past constants, powers and inverses of products
  expanded, traces rotated cyclically, then the usual cancellation).
* :func:`classify` — a metric's definiteness at random points from its float64 coordinate Gram matrix g(e_i, e_j):
  positive definite, positive semidefinite (and on which blocks it is positive) or indefinite.
* :func:`tidy` — canonical form with tr M = tr Mᵀ, so that equal terms merge.
"""
from __future__ import annotations

import random

import numpy as np
import sympy as sp
from sympy import Inverse, MatMul, MatrixSymbol, Trace

from .exact_eval import DualEvaluator
from .invariant_points import random_point_evaluator
from .matrix_calculus import canonicalize, is_zero
from .metric import (InvarianceResult, Metric, _canonical_trace, _expand_group_inverses, check_invariance,
                     simplify_under_group)

__all__ = ["prove_invariance", "classify", "tidy", "pd_text", "elementwise_pd", "move_group_factors_left"]


def tidy(expr):
    """Canonical form with every trace replaced by the shortest of its cyclic rotations and those of its
    transpose (tr M = tr Mᵀ), so equal terms merge."""
    def one(tr):
        cands = [_canonical_trace(tr), _canonical_trace(Trace(canonicalize(tr.arg.T)))]
        return min(cands, key=lambda c: (len(str(c)), str(c)))

    expr = canonicalize(expr)
    return sp.expand(expr.replace(lambda e: isinstance(e, Trace), one))



# ------------------------------------------------------------------------------------------------
# Proofs and definiteness
# ------------------------------------------------------------------------------------------------

def move_group_factors_left(expr, A, constants):
    """Rewrite every product so that factors in A (A, A⁻¹, Aᵀ, A⁻ᵀ) stand left of adjacent constants Z_k
    (valid when the group commutes with the constants and their transposes). Integer powers and inverses of
    products of such factors are expanded first ((A Γ)² = A Γ A Γ, (A Γ)⁻¹ = Γ⁻¹ A⁻¹) so that they can move."""
    const = set(constants)

    def is_const(f):  # any expression in the constants alone (Z, Zᵀ, Z⁻¹, products)
        return isinstance(f, sp.MatrixExpr) and bool(f.free_symbols) and f.free_symbols <= const

    def is_group(f):
        return isinstance(f, sp.MatrixExpr) and f.free_symbols <= {A} and f.has(A)

    def flat(m):
        if isinstance(m, Inverse):
            return flat_inv(m.arg)
        if isinstance(m, sp.MatPow) and m.exp.is_Integer and m.exp != 0:
            k = int(m.exp)
            return (flat(m.base) if k > 0 else flat_inv(m.base)) * abs(k)
        if isinstance(m, MatMul):
            coeff, mats = m.as_coeff_matrices()
            if coeff == 1:
                return [f for x in mats for f in flat(x)]
        return [move_group_factors_left(m, A, constants)]

    def flat_inv(b):
        parts = flat(b)
        if len(parts) > 1 and all(is_group(f) or is_const(f) for f in parts):
            return [f.arg if isinstance(f, Inverse) else Inverse(f) for f in reversed(parts)]
        return [Inverse(move_group_factors_left(b, A, constants))]

    cyclic = isinstance(expr, Trace) and isinstance(expr.arg, (MatMul, Inverse, sp.MatPow))
    if cyclic or isinstance(expr, (MatMul, Inverse, sp.MatPow)):
        arg = expr.arg if cyclic else expr
        coeff, mats = arg.as_coeff_matrices() if isinstance(arg, MatMul) else (1, [arg])
        mats = [f for m in mats for f in flat(m)]
        for _ in range(2 if cyclic else 1):
            changed = True
            while changed:
                changed = False
                for k in range(1, len(mats)):
                    if is_group(mats[k]) and is_const(mats[k - 1]):
                        mats[k - 1], mats[k] = mats[k], mats[k - 1]
                        changed = True
            for _ in range(len(mats) if cyclic else 0):  # tr: a trailing run of constants goes to the front
                if not is_const(mats[-1]):
                    break
                mats.insert(0, mats.pop())
        out = (coeff * MatMul(*mats)).doit()
        return canonicalize(Trace(out)) if cyclic else out
    if getattr(expr, "is_Atom", False) or not getattr(expr, "args", ()) or isinstance(expr, MatrixSymbol):
        return expr
    return expr.func(*[move_group_factors_left(a, A, constants) for a in expr.args])


def prove_invariance(metric: Metric, constants=(), transpose_closed: bool = True) -> InvarianceResult:
    """:func:`check_invariance`, and for metrics with subgroup constants Z_k a proof that uses A Z_k = Z_k A."""
    used = [Z for Z in constants if metric.expr.has(Z)]
    res = check_invariance(metric) if not used else None
    if res is not None and res.status == "proved":
        proof = "symbolic: g(psi(A,theta))(dpsi xi, dpsi eta) - g(xi, eta) canonicalizes to 0 for every size"
        if metric.symmetry.subalgebra is not None and not used:
            proof += "; invariant under all of GL(h), hence under the subgroup by restriction"
        return InvarianceResult("proved", res.difference, proof=proof)
    if not used:
        return res
    sym = metric.symmetry
    A = sym.group_element
    moved = metric(sym.pushforward(metric.xi), sym.pushforward(metric.eta),
                   point=tuple(sym.act()[b] for b in sym.blocks))
    diff = canonicalize(moved - canonicalize(metric.expr))
    for _ in range(2):
        diff = canonicalize(_expand_group_inverses(diff, A))
    if transpose_closed:
        diff = canonicalize(move_group_factors_left(diff, A, used))
    diff = simplify_under_group(diff, A)
    if is_zero(diff):
        return InvarianceResult("proved", diff, proof=(
            "symbolic for every A commuting with the centralizer constants " + ", ".join(map(str, used))
            + " and their transposes (every A in the subgroup: the constants commute with its Lie algebra, "
            "which is closed under transposition): the difference canonicalizes to 0"))
    return InvarianceResult("numerical", diff, proof=(
        "the Lie derivative vanishes exactly on the subalgebra (solved system); the finite symbolic proof with "
        "constants did not close"))


def _gram(metric: Metric, sizes, rng, fam) -> tuple[np.ndarray, list]:
    """Float Gram matrix g(e_i, e_j) of ``metric`` in coordinates at a random point, and each coordinate's block
    (the θ-only sub-expressions, e.g. Gram inverses, are evaluated once)."""
    sym = metric.symmetry

    ev0 = random_point_evaluator(fam, sizes, rng, lie=False)
    xi, eta = sym.tangent("xi"), sym.tangent("eta")

    def flt(v):
        return np.array(v, dtype=float) if isinstance(v, np.ndarray) else float(v)

    env = {k: (flt(v[0]), None) for k, v in ev0.env.items()}
    shapes = [np.shape(env[x][0]) for x in xi]
    sizes_flat = [int(np.prod(s)) if s else 1 for s in shapes]
    owners = [b for b, n in zip(sym.blocks, sizes_flat) for _ in range(n)]
    N = len(owners)

    def unit(k):
        out, off = [], 0
        for s, n in zip(shapes, sizes_flat):
            v = np.zeros(n)
            if off <= k < off + n:
                v[k - off] = 1.0
            out.append(v.reshape(s) if s else float(v[0]))
            off += n
        return out

    units = [unit(k) for k in range(N)]
    shared, volatile = {}, (*xi, *eta)
    G = np.zeros((N, N))
    for i in range(N):
        for j in range(i, N):
            e = dict(env)
            e.update({x: (u, None) for x, u in zip(xi, units[i])})
            e.update({t: (u, None) for t, u in zip(eta, units[j])})
            ev = DualEvaluator(sizes, e, exact=False, shared=shared, volatile=volatile)
            G[i, j] = G[j, i] = float(ev.value(metric.expr))
    return G, owners


def classify(metric: Metric, fam, trials: int = 2, seed: int = 3) -> tuple[str, tuple]:
    rng = random.Random(seed)
    worst, positive_on = "positive definite", None
    for t in range(trials):
        G, owners = _gram(metric, fam._sizes[t % len(fam._sizes)], rng, fam)
        scale = max(1.0, np.abs(G).max())
        ev = np.linalg.eigvalsh(G)
        kind = ("positive definite" if ev.min() > 1e-9 * scale else
                "positive semidefinite" if ev.min() > -1e-9 * scale else "indefinite")
        if ["positive definite", "positive semidefinite", "indefinite"].index(kind) > \
                ["positive definite", "positive semidefinite", "indefinite"].index(worst):
            worst = kind
        pos = tuple(b for b in metric.symmetry.blocks
                    if np.linalg.eigvalsh(G[np.ix_(*[[k for k, o in enumerate(owners) if o == b]] * 2)]).min()
                    > 1e-9 * scale)
        positive_on = pos if positive_on is None else tuple(b for b in positive_on if b in pos)
    return worst, positive_on


def elementwise_pd(sym, basis) -> str:
    c = sp.symbols(f"c0:{len(basis)}")
    g = sp.expand(sum(ci * m.metric.expr for ci, m in zip(c, basis)))
    xi, eta = sym.tangent("xi"), sym.tangent("eta")
    M = sp.Matrix(len(xi), len(eta), lambda i, j: sp.factor(g.coeff(xi[i]).coeff(eta[j])))
    minors = [sp.factor(M[:k, :k].det()) for k in range(1, M.rows + 1)]
    return (f"g = sum c_k m_k is positive definite iff, for all positive {', '.join(map(str, sym.blocks))}, the "
            f"per-coordinate Gram matrix {M.tolist()} has positive leading minors: "
            + "; ".join(f"{mi} > 0" for mi in minors))



def pd_text(fam) -> str:
    semi = [m.name for m in fam.basis if m.definiteness != "indefinite"]
    indef = [m.name for m in fam.basis if m.definiteness == "indefinite"]
    pd = [m.name for m in fam.basis if m.definiteness == "positive definite"]
    cover = {str(b): [m.name for m in fam.basis if b in m.positive_on and m.definiteness != "indefinite"]
             for b in fam.symmetry.blocks}
    return ("sufficient: sum c_k m_k with c_k >= 0 on the semidefinite elements (" + ", ".join(semi) + "), "
            + (f"c_k = 0 on the indefinite ones ({', '.join(indef)}), " if indef else "")
            + "and a positive definite sum"
            + (f" (each of {', '.join(pd)} is positive definite alone)" if pd else "")
            + "; per block, the elements positive on it: " + "; ".join(f"{b}: {', '.join(v) or 'none'}"
                                                                      for b, v in cover.items())
            + ". `metric(choice)` + check_metric re-checks a combination exactly")
