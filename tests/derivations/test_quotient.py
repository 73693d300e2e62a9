"""Rung 1 (symbolic) and rung 2 (elementwise Christoffel) of the verification ladder, plus the
closed forms of docs/MATH.md — all exact (rational arithmetic, zero tolerance)."""
import random

import pytest
import sympy as sp
from sympy import Inverse, Trace

from derivations import Metric, builtin_metric, derive_geometry, get_symmetry, gl_pair
from derivations.christoffel import geodesic_acceleration_elementwise
from derivations.matrix_calculus import canonicalize
from derivations.symmetry import evaluate, random_point

BUILTINS = [("gl_pair", "inv"), ("gl_pair", "mix"), ("elementwise_rescaling", "inv"),
            ("elementwise_rescaling", "mix"), ("positive_scaling", "scale_invariant"),
            ("translation", "euclidean")]


def _custom_metrics():
    s = gl_pair()
    G, H = s.blocks
    (xG, xH), (eG, eH) = s.tangent("xi"), s.tangent("eta")
    hybrid = Trace(Inverse(G.T * G) * xG.T * eG) + Trace(G.T * G * xH.T * eH)
    weighted = (2 * Trace(Inverse(G.T * G) * xG.T * eG) + 3 * Trace(Inverse(H.T * H) * xH.T * eH)
                + Trace(H.T * H * xG.T * eG) + Trace(G.T * G * xH.T * eH))
    return {"hybrid": Metric(s, hybrid, "hybrid"), "weighted": Metric(s, weighted, "weighted")}


_GEOS = {}


def geometry(key):
    if key not in _GEOS:
        if isinstance(key, tuple):
            _GEOS[key] = derive_geometry(builtin_metric(get_symmetry(key[0]), key[1]))
        else:
            _GEOS[key] = derive_geometry(_custom_metrics()[key])
    return _GEOS[key]


ALL = BUILTINS + ["hybrid", "weighted"]
SIZES = [{"n": 3, "m": 2, "h": 2, "k": 2}, {"n": 2, "m": 3, "h": 1, "k": 3}]


def _point(geo, seed, sizes):
    sym = geo.symmetry
    rng = random.Random(seed)
    syms = list(sym.blocks) + list(geo.xi)
    vals = random_point(syms, {d: sizes.get(d.name, 3) for d in _dims(sym)}, rng,
                        positive=set(sym.blocks) if sym.positive_blocks else set())
    return vals


def _dims(sym):
    out = set()
    for b in sym.blocks:
        for d in getattr(b, "shape", ()):
            out |= sp.sympify(d).free_symbols
    return out


def _ev(expr, vals, sizes, sym):
    return evaluate(expr, vals, {d: sizes.get(d.name, 3) for d in _dims(sym)})


def _is_zero(v):
    return all(x == 0 for x in v) if isinstance(v, sp.MatrixBase) else sp.simplify(v) == 0


def _solve_lambda(geo, vals, sizes):
    """Exact Λ from the derived solution (explicit, Sylvester or Kronecker) at a concrete point."""
    sym, proj = geo.symmetry, geo.projection
    C = _ev(geo.horizontal_condition, vals, sizes, sym)
    if proj.kind == "explicit":
        return _ev(proj.solution.xreplace({proj.rhs: geo.horizontal_condition}), vals, sizes, sym)
    h = C.shape[0]
    Lam = sp.Matrix(h, h, lambda i, j: sp.Symbol(f"l{i}{j}"))
    if proj.kind == "sylvester":
        P, Q = _ev(proj.P, vals, sizes, sym), _ev(proj.Q, vals, sizes, sym)
        C2 = _ev(proj.rhs_transform.xreplace({proj.rhs: geo.horizontal_condition}), vals, sizes, sym)
        eqs = P * Lam + Lam * Q - C2
    else:
        eqs = -C
        for L, K in proj.terms:
            eqs += _ev(L, vals, sizes, sym) * Lam * _ev(K, vals, sizes, sym)
    sol = sp.solve(list(eqs), list(Lam), dict=True)[0]
    return Lam.subs(sol)


@pytest.mark.parametrize("key", ALL, ids=str)
def test_invariance_is_proved(key):
    assert geometry(key).invariance.status == "proved"


@pytest.mark.parametrize("key", ALL, ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_projection_horizontal_idempotent_and_lambda_solves(key, seed):
    geo = geometry(key)
    sym = geo.symmetry
    sizes = SIZES[seed % 2]
    vals = _point(geo, seed, sizes)
    Lam = _solve_lambda(geo, vals, sizes)
    # Λ solves C(v(Λ)) = C(ξ)
    C_xi = _ev(geo.horizontal_condition, vals, sizes, sym)
    vert_lam = [canonicalize(v.xreplace({geo.lie: geo.lambda_symbol})) for v in geo.vertical]
    C_vlam = _ev(geo.horizontal_condition.xreplace(dict(zip(geo.xi, vert_lam))),
                 {**vals, geo.lambda_symbol: Lam}, sizes, sym)
    assert _is_zero(C_vlam - C_xi)
    # the projected vector is horizontal
    projected = [_ev(p, {**vals, geo.lambda_symbol: Lam}, sizes, sym) for p in geo.projected]
    C_proj = _ev(geo.horizontal_condition, {**vals, **dict(zip(geo.xi, projected))}, sizes, sym)
    assert _is_zero(C_proj)
    # idempotent: projecting again changes nothing (Λ of a horizontal vector is 0)
    vals2 = {**vals, **dict(zip(geo.xi, projected))}
    Lam2 = _solve_lambda(geo, vals2, sizes)
    assert _is_zero(Lam2)
    # and what was removed is vertical and metric-orthogonal to the result
    removed = [x - p for x, p in zip([vals[x] for x in geo.xi], projected)]
    g = geo.metric(tuple(geo.xi), tuple(geo.metric.eta))
    inner = _ev(g, {**vals, **dict(zip(geo.xi, projected)), **dict(zip(geo.metric.eta, removed))}, sizes, sym)
    assert sp.simplify(inner) == 0


@pytest.mark.parametrize("key", ALL, ids=str)
def test_riemannian_gradient_represents_the_differential(key):
    """g(grad f, η) = Df[η] = Σ tr(∇_Bᵀ η_B) for arbitrary ∇ and η (exact)."""
    geo = geometry(key)
    sym = geo.symmetry
    sizes = SIZES[0]
    rng = random.Random(3)
    syms = list(sym.blocks) + list(geo.egrad) + list(geo.metric.eta)
    vals = random_point(syms, {d: sizes.get(d.name, 3) for d in _dims(sym)}, rng,
                        positive=set(sym.blocks) if sym.positive_blocks else set())
    rg = [_ev(r, vals, sizes, sym) for r in geo.riemannian_gradient]
    g = _ev(geo.metric(tuple(geo.xi), tuple(geo.metric.eta)), {**vals, **dict(zip(geo.xi, rg))}, sizes, sym)
    df = 0
    for e, eta in zip(geo.egrad, geo.metric.eta):
        a, b = vals[e], vals[eta]
        df += (a.T * b).trace() if isinstance(a, sp.MatrixBase) else a * b
    assert sp.simplify(g - df) == 0


@pytest.mark.parametrize("key", ALL, ids=str)
@pytest.mark.parametrize("sizes", [{"n": 3, "m": 2, "h": 2, "k": 2}, {"n": 2, "m": 2, "h": 1, "k": 2}], ids=["n3m2h2", "n2m2h1"])
def test_matrix_level_acceleration_equals_elementwise_christoffel(key, sizes):
    """Rung 2: the shape-generic γ̈(0) equals −Γ^k_ij ξ^i ξ^j from the coordinate Christoffel
    symbols, exactly, at a random rational point."""
    geo = geometry(key)
    sym = geo.symmetry
    if key == ("translation", "euclidean"):
        sizes = {"n": 3}
    vals = _point(geo, 11, sizes)
    point = {b: vals[b] for b in sym.blocks}
    vel = {b: vals[x] for b, x in zip(sym.blocks, geo.xi)}
    conc = {d: sizes.get(d.name, 3) for d in _dims(sym)}
    reference = geodesic_acceleration_elementwise(geo.metric, conc, point, vel)
    for b, acc in zip(sym.blocks, geo.geodesic_acceleration):
        got = _ev(acc, vals, sizes, sym)
        assert _is_zero(sp.Matrix(got) - sp.Matrix(reference[b])) if isinstance(got, sp.MatrixBase) \
            else sp.simplify(got - reference[b]) == 0, (key, b)


# -- docs/MATH.md closed forms (cross-check, never used by the engine) ---------------------------------

def _closed_forms(kind, G, H, xG, xH):
    S, T = G.T * G, H.T * H
    if kind == "inv":
        aG = xG * Inverse(S) * (xG.T * G + G.T * xG) - G * Inverse(S) * xG.T * xG
        aH = xH * Inverse(T) * (xH.T * H + H.T * xH) - H * Inverse(T) * xH.T * xH
        rg = lambda eG, eH: (eG * S, eH * T)
    else:
        aG = (G * xH.T * xH - xG * (xH.T * H + H.T * xH)) * Inverse(T)
        aH = (H * xG.T * xG - xH * (xG.T * G + G.T * xG)) * Inverse(S)
        rg = lambda eG, eH: (eG * Inverse(T), eH * Inverse(S))
    return (aG, aH), rg


@pytest.mark.parametrize("kind", ["inv", "mix"])
def test_gl_formulas_match_design_closed_forms(kind):
    geo = geometry(("gl_pair", kind))
    G, H = geo.symmetry.blocks
    xG, xH = geo.xi
    (aG, aH), rg = _closed_forms(kind, G, H, xG, xH)
    sizes = {"n": 3, "m": 2, "h": 2}
    for seed in range(2):
        vals = _point(geo, seed, sizes)
        for derived, closed in zip(geo.geodesic_acceleration, (aG, aH)):
            assert _is_zero(_ev(derived - closed, vals, sizes, geo.symmetry))
        eG, eH = geo.egrad
        vals.update(random_point([eG, eH], {d: sizes[d.name] for d in _dims(geo.symmetry)}, random.Random(seed)))
        for derived, closed in zip(geo.riemannian_gradient, rg(eG, eH)):
            assert _is_zero(_ev(derived - closed, vals, sizes, geo.symmetry))
    if kind == "inv":
        S, T = G.T * G, H.T * H
        assert geo.projection.kind == "sylvester"
        assert geo.projection.P == canonicalize(T * S) == geo.projection.Q
    else:
        assert geo.projection.kind == "explicit"


def test_diagonal_net_closed_forms():
    """Metric (5): ξ = (u a, v a) horizontal, γ̈ = (u a², v a²) (u e^{at}); metric (6): β(t) linear."""
    u, v, a, t = sp.symbols("u v a t", positive=True)
    inv = geometry(("elementwise_rescaling", "inv"))
    xu, xv = inv.xi
    sub = {xu: u * a, xv: v * a}
    assert sp.simplify(inv.horizontal_condition.subs(sub)) == 0
    acc = [sp.simplify(x.subs(sub)) for x in inv.geodesic_acceleration]
    assert acc == [u * a**2, v * a**2]
    mix = geometry(("elementwise_rescaling", "mix"))
    b = sp.Symbol("b")
    sub = {mix.xi[0]: u * b, mix.xi[1]: v * b}
    au, av = [sp.simplify(x.subs(sub)) for x in mix.geodesic_acceleration]
    # β = u v: β̈(0) = ü v + 2 u̇ v̇ + u v̈ = 0 along a horizontal mix geodesic (β(t) linear)
    assert sp.simplify(au * v + 2 * (u * b) * (v * b) + u * av) == 0


def test_custom_metrics_choose_solver_from_structure():
    assert geometry("hybrid").projection.kind == "explicit"
    assert geometry("weighted").projection.kind == "kronecker"


@pytest.mark.parametrize("key", ALL, ids=str)
def test_second_order_geodesic_and_its_vjp_are_exact(key):
    """E(ξ) = θ + ξ + ½γ̈(0) and Σ⟨ξ̄_B, δ_B⟩ = Σ⟨ū_B, DE_B(ξ)[δ]⟩ for arbitrary ξ, δ, ū (exact).

    E is quadratic in ξ, so the central difference (E(ξ+δ) − E(ξ−δ))/2 is its exact derivative
    along δ: the check uses neither the engine's differentiation nor its transposition rules."""
    geo = geometry(key)
    sym = geo.symmetry
    sizes = SIZES[0]
    delta = sym.tangent("delta")
    rng = random.Random(5)
    syms = list(sym.blocks) + list(geo.xi) + list(geo.cotangent) + list(delta)
    vals = random_point(syms, {d: sizes.get(d.name, 3) for d in _dims(sym)}, rng,
                        positive=set(sym.blocks) if sym.positive_blocks else set())
    E = [_ev(e, vals, sizes, sym) for e in geo.second_order_geodesic]
    acc = [_ev(a, vals, sizes, sym) for a in geo.geodesic_acceleration]
    for e, b, x, a in zip(E, sym.blocks, geo.xi, acc):
        assert _is_zero(e - (vals[b] + vals[x] + a / 2))

    def E_at(sign):
        moved = {x: vals[x] + sign * vals[d] for x, d in zip(geo.xi, delta)}
        return [_ev(e, {**vals, **moved}, sizes, sym) for e in geo.second_order_geodesic]

    directional = [(p - q) / 2 for p, q in zip(E_at(1), E_at(-1))]
    vjp = [_ev(v, vals, sizes, sym) for v in geo.second_order_geodesic_vjp]

    def pair(a, b):
        return (a.T * b).trace() if isinstance(a, sp.MatrixBase) else a * b

    lhs = sum(pair(v, vals[d]) for v, d in zip(vjp, delta))
    rhs = sum(pair(vals[u], dE) for u, dE in zip(geo.cotangent, directional))
    assert sp.simplify(lhs - rhs) == 0
