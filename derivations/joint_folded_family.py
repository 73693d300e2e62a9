"""Invariant metrics of norm × Q/K in the *folded ansatz*: the ansatz pulled back by the fold.

The two-sided ansatz of :func:`derivations.joint.joint_invariant_metrics`, tr(W ξ_iᵀ V η_j) over blocks of equal
shape, has no term that pairs ξ_Γ with η_G, so the folded metrics of :mod:`derivations.joint_folded` (which have
Ξ G = diag(ξ_γ) G terms) lie outside its family. :func:`folded_invariant_metrics` searches instead, with the same
exact method (Lie derivative along random generators of both parts = 0, solved exactly; every basis element then
proved invariant under both parts, every size, by :func:`derivations.joint.prove_joint_invariance`), the family

* (F1) every candidate T(ξ, η) of the GL pair's ansatz (:class:`derivations.invariant.Ansatz`, ``degree``,
  ``products``) evaluated on the fold: T at (Ĝ, Ĥ) = (ΓG, ΓH) on (ξ̂, η̂) = ((Γξ_G + ΞG, Γξ_H + ΞH), …);
* (F2) tr(Γᵏ ξ_Γ η_Γ), |k| ≤ 2, and tr(Γᵏ ξ_Γ) tr(Γˡ η_Γ), |k|, |l| ≤ 1 (symmetrised);
* (F3) tr(Γᵏ ξ_Γ) · tr(W B̂ᵀ η̂_C), |k| ≤ 1, B̂ ∈ {Ĝ, Ĥ} of C's shape, W ∈ {I, Ŝ_G, Ŝ_G⁻¹, Ŝ_H, Ŝ_H⁻¹}
  (Ŝ_B = B̂ᵀB̂), symmetrised: products of a D-invariant 1-form on γ and a pair 1-form.

In folded coordinates the two parts act on disjoint blocks, so the invariant members are sums of a Γ-invariant
form (F2: Σ ξ_γη_γ/γ², (Σ ξ_γ/γ)(Σ η_γ/γ)), pulled-back pair-invariant forms (F1: the pair's family, which
contains ``inv`` and ``mix``) and products of invariant 1-forms (F3); ``folded_inv`` and ``folded_mix`` are in it.
"""
from __future__ import annotations

import itertools
import random

import sympy as sp
from sympy import Identity, Inverse, Trace

from .invariant import Ansatz, _matrix_candidates, solve_invariant_span
from .invariant_proofs import pd_text, tidy
from .joint import (JointFamily, JointInvariantMetric, JointMetric, JointSymmetry, _joint_evaluators, _symmetric,
                    joint_definiteness, prove_joint_invariance, vertical_context)
from .joint_folded import _structure, fold, fold_tangent
from .matrix_calculus import canonicalize, is_zero

__all__ = ["folded_candidates", "folded_invariant_metrics"]


def folded_candidates(joint: JointSymmetry, ansatz: Ansatz | None = None) -> list:
    """(label, symmetrised candidate) pairs of the folded ansatz (module docstring)."""
    ansatz = ansatz or Ansatz()
    (G, H), _, Gam = _structure(joint)
    pair = joint.parts[0]
    xi, eta = joint.tangent("xi"), joint.tangent("eta")
    swap = {**dict(zip(xi, eta)), **dict(zip(eta, xi))}
    pt, fx, fe = fold(joint), fold_tangent(joint, xi), fold_tangent(joint, eta)
    (pxG, pxH), (peG, peH) = pair.tangent("xi"), pair.tangent("eta")
    S = {G: pt[0], H: pt[1], pxG: fx[0], pxH: fx[1], peG: fe[0], peH: fe[1]}
    out = [(f"fold({label})", t.xreplace(S)) for label, t in _matrix_candidates(pair, ansatz, [])]
    xg, eg = xi[2], eta[2]

    def power(k):
        return Identity(Gam.shape[0]) if k == 0 else Gam ** k

    raw = [(f"tr(Gam^{k} xi_Gam eta_Gam)", Trace(power(k) * xg * eg)) for k in range(-2, 3)]
    raw += [(f"tr(Gam^{k} xi_Gam) tr(Gam^{m} eta_Gam)", Trace(power(k) * xg) * Trace(power(m) * eg))
            for k, m in itertools.product((-1, 0, 1), repeat=2)]
    h = G.shape[1]
    grams = [Identity(h)] + [w for B in pt[:2] for w in (B.T * B, Inverse(B.T * B))]
    for k in (-1, 0, 1):
        for c, tc in enumerate(fe[:2]):
            for B in (b for b in pt[:2] if b.shape == tc.shape):
                for W in grams:
                    raw.append((f"tr(Gam^{k} xi_Gam) tr(W B^T eta_{c})", Trace(power(k) * xg) * Trace(W * B.T * tc)))
    out += [(lab, t + t.xreplace(swap)) for lab, t in raw]
    diag = tuple(joint.diagonal_blocks) + (xg, eg)
    cleaned = []
    for lab, t in out:
        t = canonicalize(_symmetric(canonicalize(t), diag))
        if not is_zero(t):
            cleaned.append((lab, t))
    return cleaned


def folded_invariant_metrics(joint: JointSymmetry, sizes: dict, ansatz: Ansatz | None = None,
                             seed: int = 0) -> JointFamily:
    """The invariant, symmetric, bilinear metrics of ``joint`` (:func:`derivations.joint.norm_qk`) in the folded
    ansatz, solved exactly at ``sizes`` {dimension name: int} and each proved invariant under both parts."""
    sizes = {s: sizes[s.name] for b in joint.blocks for d in b.shape for s in sp.sympify(d).free_symbols
             if s.name in sizes}
    cands = folded_candidates(joint, ansatz)
    xi, eta = joint.tangent("xi"), joint.tangent("eta")
    ctx = vertical_context(joint)
    rng = random.Random(seed)
    n_all = len(cands)
    cands, dense, _ = solve_invariant_span(cands, lambda p: _joint_evaluators(joint, sizes, rng, ctx))
    fam = JointFamily(joint, [], n_all, len(cands), sizes)
    if dense is None:
        return fam
    diag = tuple(joint.diagonal_blocks) + (xi[2], eta[2])
    for r in range(dense.rows):
        expr = tidy(sp.Add(*[dense[r, k] * cands[k][1] for k in range(dense.cols) if dense[r, k] != 0]))
        expr = _symmetric(expr, diag).as_content_primitive()[1]
        metric = JointMetric(joint, expr, f"m{r}")
        kind, pos = joint_definiteness(metric, joint, sizes)
        fam.basis.append(JointInvariantMetric(f"m{r}", metric, tuple(prove_joint_invariance(metric, joint)), kind, pos))
    fam.pd_conditions = pd_text(fam).replace(". `metric(choice)` + check_metric re-checks a combination exactly", "")
    return fam
