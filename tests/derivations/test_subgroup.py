"""Subgroups of GL(h) given by a Lie subalgebra (RoPE): the declaration derives the commutant of the rotations
exactly, the metric's invariance is recorded as a restriction from GL(h), the geodesic is the total space's, and the
projection system M λ = b solves the subalgebra-restricted horizontal condition — all exact (rationals)."""
import random

import pytest
import sympy as sp

from derivations import (DeclarationError, Subalgebra, builtin_metric, derive_geometry, get_symmetry, gl_pair,
                         rope_pair, subgroup_pair)
from derivations.subgroup import commutant, rope_pairs, rope_rotation
from derivations.symmetry import evaluate, random_point

_GEOS = {}


def geometry(pairing, kind):
    if (pairing, kind) not in _GEOS:
        _GEOS[pairing, kind] = derive_geometry(builtin_metric(rope_pair(pairing), kind))
    return _GEOS[pairing, kind]


def test_pairings_follow_the_implementations():
    assert rope_pairs(6, "half") == [(0, 3), (1, 4), (2, 5)]
    assert rope_pairs(6, "interleaved") == [(0, 1), (2, 3), (4, 5)]
    assert rope_pairs(6, "half", rotary_dim=4) == [(0, 2), (1, 3)]  # rotate_half on the first r coordinates
    assert rope_pairs(6, "interleaved", rotary_dim=4) == [(0, 1), (2, 3)]
    with pytest.raises(DeclarationError):
        rope_pairs(6, "half", rotary_dim=3)
    with pytest.raises(DeclarationError):
        rope_pair("spiral")


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("h,r", [(4, None), (6, None), (6, 4), (5, 2), (3, 0)])
def test_declared_subalgebra_is_exactly_the_commutant_of_the_rotations(pairing, h, r):
    """X R = R X for a rotation with distinct rational angles: the null space is the rotation-scalings per pair ⊕
    gl(h − r), no cross terms between pairs or between rotary and free coordinates; dimension r + (h − r)²."""
    sub = Subalgebra("rope", pairing, r)
    basis = sub.basis(h)
    rr = h if r is None else r
    assert len(basis) == rr + (h - rr) ** 2
    null = commutant([rope_rotation(h, pairing, r)])
    span = sp.Matrix.hstack(*[M.reshape(h * h, 1) for M in basis + null])
    assert len(null) == len(basis) == span.rank()
    for M in basis:  # block structure: nothing between rotary and free coordinates
        assert M[:rr, rr:] == sp.zeros(rr, h - rr) and M[rr:, :rr] == sp.zeros(h - rr, rr)


def test_the_pairing_matters():
    """The half-pairing subalgebra does not commute with an interleaved rotation (h = 4): the validation would
    catch a declaration whose pairing does not match the rotation."""
    R = rope_rotation(4, "interleaved")
    half = Subalgebra("rope", "half").basis(4)
    assert any(M * R != R * M for M in half)
    for pairing in ("half", "interleaved"):
        R = rope_rotation(4, pairing)
        assert all(M * R == R * M for M in Subalgebra("rope", pairing).basis(4))


def test_explicit_basis_declarations_are_checked():
    def E(i, j):
        M = sp.zeros(3, 3)
        M[i, j] = 1
        return M
    so3 = Subalgebra("basis", matrices=(E(0, 1) - E(1, 0), E(0, 2) - E(2, 0), E(1, 2) - E(2, 1)))
    sym = subgroup_pair(so3, "so3_pair")
    assert "closure under commutators checked" in sym.subgroup_proof
    with pytest.raises(DeclarationError, match="not closed under the commutator"):
        subgroup_pair(Subalgebra("basis", matrices=(E(0, 1), E(1, 0))), "bad")
    with pytest.raises(DeclarationError, match="Frobenius-orthogonal"):
        subgroup_pair(Subalgebra("basis", matrices=(E(0, 0), E(0, 0) + E(1, 1))), "bad")
    with pytest.raises(DeclarationError, match="linearly dependent"):
        subgroup_pair(Subalgebra("basis", matrices=(E(0, 0), 2 * E(0, 0))), "bad")


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("kind", ["inv", "mix"])
def test_geometry_is_the_total_space_restricted(pairing, kind):
    """Invariance: proved for GL(h), recorded as restriction to K; vertical map, metric operator, acceleration,
    second-order geodesic and its VJP are the GL pair's (horizontal geodesics of a Riemannian submersion are
    geodesics of the total space); only the projection changes (kind "subalgebra", terms of C(v(Λ)))."""
    geo = geometry(pairing, kind)
    gl = derive_geometry(builtin_metric(gl_pair(), kind))
    assert geo.invariance.status == "proved"
    assert "K-invariant by restriction" in geo.invariance.proof and "null space" in geo.invariance.proof
    assert geo.projection.kind == "subalgebra" and geo.projection.subalgebra.pairing == pairing
    assert geo.vertical == gl.vertical and geo.horizontal_condition == gl.horizontal_condition
    for a, b in [(geo.riemannian_gradient, gl.riemannian_gradient), (geo.geodesic_acceleration, gl.geodesic_acceleration),
                 (geo.second_order_geodesic, gl.second_order_geodesic),
                 (geo.second_order_geodesic_vjp, gl.second_order_geodesic_vjp)]:
        assert a == b
    assert get_symmetry(f"rope_{pairing}").subalgebra == geo.projection.subalgebra


def _exact_point(sym, xi, sizes, seed):
    rng = random.Random(seed)
    dims = {d: sizes[d.name] for d in sym.dims}
    return random_point(list(sym.blocks) + list(xi), dims, rng), dims


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("kind", ["inv", "mix"])
@pytest.mark.parametrize("h,r", [(4, None), (3, 2)])
def test_projection_system_exact(pairing, kind, h, r):
    """Rung 1 for the subgroup: at a rational point, M_kl = Σ ⟨E_k, L_i E_l K_i⟩ equals g(v(E_l), v(E_k)); the
    solution Λ = Σ λ_l E_l makes ξ − v(Λ) horizontal (⟨E_k, C(·)⟩ = 0 for every k), the removed part is
    g-orthogonal to the result, and projecting again removes nothing — exactly."""
    geo = geometry(pairing, kind)
    sym, metric = geo.symmetry, geo.metric
    sizes = {"n": h + 1, "m": h, "h": h}
    vals, dims = _exact_point(sym, geo.xi, sizes, seed=h)
    ev = lambda e, extra={}: evaluate(e, {**vals, **extra}, dims)  # noqa: E731
    basis = Subalgebra("rope", pairing, r).basis(h)
    d = len(basis)
    terms = [(ev(L), ev(K)) for L, K in geo.projection.terms]
    M = sp.Matrix(d, d, lambda k, l: sum(((basis[k].T * L * basis[l] * K).trace() for L, K in terms), sp.S.Zero))
    X = geo.lie
    g = metric(tuple(geo.xi), tuple(metric.eta))
    vert = [[ev(v, {X: E}) for v in geo.vertical] for E in basis]
    for k in range(d):
        for l in range(d):
            gkl = ev(g, {**dict(zip(geo.xi, vert[l])), **dict(zip(metric.eta, vert[k]))})
            assert sp.simplify(M[k, l] - gkl) == 0
    assert M == M.T and M.det() != 0

    def project(xi_vals):
        C = ev(geo.horizontal_condition, dict(zip(geo.xi, xi_vals)))
        b = sp.Matrix([(E.T * C).trace() for E in basis])
        lam = M.LUsolve(b)
        Lam = sum((c * E for c, E in zip(lam, basis)), sp.zeros(h, h))
        return [x - v for x, v in zip(xi_vals, [ev(v, {X: Lam}) for v in geo.vertical])], lam

    xi0 = [vals[x] for x in geo.xi]
    p, lam = project(xi0)
    assert any(c != 0 for c in lam)
    Cp = ev(geo.horizontal_condition, dict(zip(geo.xi, p)))
    assert all((E.T * Cp).trace() == 0 for E in basis)
    removed = [a - b for a, b in zip(xi0, p)]
    assert sp.simplify(ev(g, {**dict(zip(geo.xi, p)), **dict(zip(metric.eta, removed))})) == 0
    p2, lam2 = project(p)
    assert all(c == 0 for c in lam2) and all(a == b for a, b in zip(p, p2))
    # a GL-horizontal vector is K-horizontal (V_K ⊂ V_GL), not conversely: the GL condition C = 0 is stronger
    assert any(x != 0 for x in Cp)
