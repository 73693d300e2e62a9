"""Invariant metrics from the symmetry alone (derivations.invariant): the solved families contain the built-in
metrics, every basis element's finite invariance is checked independently (exact evaluation of g after a random
group element, with SymPy's explicit matrices), the family's dimension matches an independent count, and the
RoPE subgroup's family is strictly larger than GL(h)'s (its extra members are K-invariant, not GL-invariant)."""
import itertools
import os
import random

import pytest
import sympy as sp
from sympy import Inverse, Trace

from derivations import (DeclarationError, Metric, UnsupportedStructureError, builtin_metric, elementwise_rescaling,
                         gl_pair, positive_scaling, rope_pair)
from derivations.invariant import Ansatz, invariant_metrics
from derivations.metric import check_metric
from derivations.subgroup import rope_rotation
from derivations.symmetry import evaluate, random_point


@pytest.mark.skipif(os.environ.get("SYMPY_GROUND_TYPES", "auto") not in ("auto", "flint"),
                    reason="SYMPY_GROUND_TYPES chooses other ground types")
def test_the_exact_solves_run_in_flint():
    """The solves' matrices over GF(p) and ℚ are FLINT matrices (DFM), not SymPy's pure-Python DDM: SymPy uses the
    installed python-flint only in versions it has tested and falls back silently otherwise (pyproject bounds it)."""
    from sympy import GF, QQ
    import flint
    from sympy.polys.matrices import DomainMatrix

    from derivations.exact_eval import PRIME

    for K, one in ((GF(PRIME), GF(PRIME)(1)), (QQ, QQ(1, 2))):
        rep = DomainMatrix([[one, one], [one, one + one]], (2, 2), K).rep
        assert type(rep).__name__ == "DFM", (f"SymPy {sp.__version__} keeps {K} matrices in {type(rep).__name__} with "
                                      f"python-flint {flint.__version__}: install a version SymPy has tested")


_FAM = {}


def family(key):
    if key not in _FAM:
        sym, ansatz = {"gl": (gl_pair(), Ansatz()), "diag": (elementwise_rescaling(), Ansatz(monomial_degree=2)),
                       "rope2": (rope_pair("half"), Ansatz(degree=2, h=2))}[key]
        _FAM[key] = invariant_metrics(sym, ansatz)
    return _FAM[key]


def finite_invariance_gap(metric, A_value, sizes, seed=0, constants=None):
    """g_{ψ(A,θ)}(dψ ξ, dψ η) − g_θ(ξ, η) evaluated exactly with explicit matrices (SymPy), independent of the
    dual-number solve."""
    sym = metric.symmetry
    rng = random.Random(seed)
    pt = random_point([*sym.blocks, *metric.xi, *metric.eta], sizes, rng)
    pt.update(constants or {})
    acted = {b: evaluate(e, {**pt, sym.group_element: A_value}, sizes) for b, e in sym.act().items()}
    pushed = [evaluate(e, {**pt, sym.group_element: A_value}, sizes) for e in sym.pushforward(metric.xi)]
    pushed_eta = [evaluate(e, {**pt, sym.group_element: A_value}, sizes) for e in sym.pushforward(metric.eta)]
    moved = {**pt, **acted, **dict(zip(metric.xi, pushed)), **dict(zip(metric.eta, pushed_eta))}
    return sp.simplify(evaluate(metric.expr, moved, sizes) - evaluate(metric.expr, pt, sizes))


def test_gl_pair_family_is_spanned_by_inv_and_mix_parts():
    fam = family("gl")
    assert len(fam.basis) == 4 and all(m.invariance.status == "proved" for m in fam.basis)
    sym = fam.symmetry
    inv, mix = fam.coordinates(builtin_metric(sym, "inv")), fam.coordinates(builtin_metric(sym, "mix"))
    assert inv is not None and mix is not None
    # inv and mix use disjoint basis elements and together span the family (4 = 2 + 2)
    assert {k for k, c in inv.items() if c} | {k for k, c in mix.items() if c} == {m.name for m in fam.basis}
    G, H = sym.blocks
    (xG, xH), (eG, eH) = sym.tangent("xi"), sym.tangent("eta")
    euclid = Metric(sym, Trace(xG.T * eG) + Trace(xH.T * eH), "euclidean")
    assert fam.coordinates(euclid) is None
    hybrid = Metric(sym, Trace(Inverse(G.T * G) * xG.T * eG) + 3 * Trace(G.T * G * xH.T * eH), "hybrid")
    assert set(fam.coordinates(hybrid).values()) == {0, 1, 3}


def test_gl_pair_basis_is_invariant_under_a_random_finite_group_element():
    sizes = {sp.Symbol(n, integer=True, positive=True): v for n, v in (("n", 3), ("m", 4), ("h", 2))}
    A = sp.Matrix([[2, 1], [-1, sp.Rational(1, 3)]])
    for m in family("gl").basis:
        assert finite_invariance_gap(m.metric, A, sizes) == 0


def test_gl_pair_combination_is_a_positive_definite_metric_and_semidefinite_parts_are_flagged():
    fam = family("gl")
    assert all(m.definiteness == "positive semidefinite" and len(m.positive_on) == 1 for m in fam.basis)
    by_block = {}
    for m in fam.basis:
        by_block.setdefault(m.positive_on[0], []).append(m.name)
    choice = "+".join(v[0] for v in by_block.values())
    check_metric(fam.metric(choice))  # exact Sylvester criterion at random points: raises if not PD


def test_diagonal_net_family_contains_metrics_5_and_6_and_has_the_counted_dimension():
    fam = family("diag")
    sym = fam.symmetry
    assert fam.coordinates(builtin_metric(sym, "inv")) is not None  # metric (5)
    assert fam.coordinates(builtin_metric(sym, "mix")) is not None  # metric (6)
    # independent count: u^a v^b ξ_i η_j scales by a^(a − b + w_i + w_j) with w_u = 1, w_v = −1
    d, count = 2, 0
    for a, b in itertools.product(range(-d, d + 1), repeat=2):
        for wi, wj in ((1, 1), (-1, -1), (1, -1)):
            count += (a - b + wi + wj) == 0
    assert len(fam.basis) == count
    assert all(m.invariance.status == "proved" for m in fam.basis)
    # the exact PD condition is stated in the coefficients
    assert "leading minors" in fam.pd_conditions


def test_rope_family_is_larger_than_gl_and_its_extra_members_are_only_subgroup_invariant():
    fam = family("rope2")
    sym = fam.symmetry
    assert fam.coordinates(builtin_metric(sym, "inv")) is not None
    assert fam.coordinates(builtin_metric(sym, "mix")) is not None
    extra = [m for m in fam.basis if any(m.metric.expr.has(Z) for Z in fam.constants)]
    assert extra and all(m.invariance.status == "proved" for m in fam.basis)
    consts = {Z: sp.Matrix(v.tolist()) for Z, v in fam.constants.items()}
    sizes = {sp.Symbol(n, integer=True, positive=True): v for n, v in (("n", 3), ("m", 2), ("h", 2))}
    K_elem = 2 * rope_rotation(2, "half")  # a rotation-scaling: in the subgroup
    GL_elem = sp.Matrix([[2, 1], [0, 1]])  # not in it
    for m in extra:
        assert finite_invariance_gap(m.metric, K_elem, sizes, constants=consts) == 0
        assert finite_invariance_gap(m.metric, GL_elem, sizes, constants=consts) != 0


@pytest.mark.slow
def test_rope_family_at_two_pairs_has_per_pair_weights():
    """At h = 4 (two frequency pairs) the centralizer has 4 elements (I_p, J_p per pair): more invariants."""
    fam4 = invariant_metrics(rope_pair("half"), Ansatz(degree=2, h=4))
    assert len(fam4.constants) == 4  # the centralizer span{I_1, J_1, I_2, J_2}
    assert len(fam4.basis) > len(family("rope2").basis)
    assert all(m.invariance.status in ("proved", "numerical") for m in fam4.basis)


@pytest.mark.parametrize("kwargs", [{"degree": -1}, {"h": 0}, {"products": "yes"}, {"monomial_degree": 1.5}])
def test_bad_ansatz_is_refused_in_one_line(kwargs):
    with pytest.raises(DeclarationError, match="Ansatz"):
        Ansatz(**kwargs)


def test_symmetry_outside_the_ansatz_is_refused_with_the_reason():
    with pytest.raises(UnsupportedStructureError, match="covers"):
        invariant_metrics(positive_scaling())
