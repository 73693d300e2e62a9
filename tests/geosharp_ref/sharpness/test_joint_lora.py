"""LoRA GL(r) × attention GL(h) quotiented jointly (geosharp_ref/sharpness/joint_lora.py), on tiny float64 BERTs
with peft LoRA (r = 2, B random): on query and value (adapters into the heads), and on query, key, value and
attention.output.dense (two adapters per pair, one of them out of the heads).

Independent references: the metric from the effective weights (the adapter's share s·B A written into the
lifted blocks by hand from the parameter names) and the generated ``gl_<metric>`` kernels; the vertical space
from ``torch.func.jvp`` of the bindings' own ``act`` (LoRABinding, PairGroup); the g-orthogonal projection by
dense least squares; the closed-form γ̈ against torch.func (jvp, grad) of the metric matrix and by the Koszul
identity g(γ̈, η) = ½ D_η g(ξ, ξ) − D_ξ g(ξ, η) with central finite differences of that independent metric;
E(tξ) against an RK4-integrated geodesic (error O(t³)); whole-model geodesic sharpness along every orbit at once;
the Riemannian Hessian through this factor equivariant along every orbit at once (the Euclidean one is not).
"""
from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

from geosharp_ref.apgd import apgd
from geosharp_ref.forward import model_loss
from geosharp_ref.kernels import load_kernels
from geosharp_ref.sharpness.hessian import QuotientHessian
from geosharp_ref.sharpness.joint_lora import JointLoRAFactor, joint_lora_factors
from geosharp_ref.sharpness.space import ProductSpace
from geosharp_ref.symmetry import NoAttentionPairsWarning, lora_bindings, symmetry_map
from geosharp_ref.testing import orbit_points
from tests import cases

pytest.importorskip("peft")
DT = torch.float64
METRICS = ("inv", "mix")
ALL4 = ("query", "key", "value", "attention.output.dense")


def _case(targets):
    torch.manual_seed(0)
    model = cases.lora(cases.bert(initializer_range=cases.IR), targets=targets).to(DT).eval()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=NoAttentionPairsWarning)
        smap = symmetry_map(model)
    params = {n: p.detach() for n, p in model.named_parameters()}
    batch = ({"input_ids": torch.randint(3, 50, (4, 7), generator=torch.Generator().manual_seed(1))},
             torch.tensor([0, 1, 2, 1]))
    return model, smap, params, batch


@pytest.fixture(scope="module")
def qv():
    return _case(("query", "value"))


@pytest.fixture(scope="module")
def qkvo():
    return _case(ALL4)


def _factor(case, index, metric, eps=0.0):
    model, smap, params, _ = case
    f = joint_lora_factors(model, smap.groups, metric, eps)[0][index]
    return f, f.at(params)


def _as_dict(fa, params, xi):
    """ξ as a parameter dict (zeros outside the factor)."""
    return fa.insert({n: torch.zeros_like(p) for n, p in params.items()}, xi)


def _blocks(factor, d):
    """The factor's blocks of a parameter dict (pairs' extract, then each adapter's block outside the pairs)."""
    out = [X for p in factor.pairs for X in p.extract(d)]
    names = {n for p in factor.pairs for n in p.param_names}
    return out + [d[a.a_weight] if a.b_weight in names else d[a.b_weight] for a in factor.lora]


def _rel(a, b):
    num = max(float((x - y).abs().max()) for x, y in zip(a, b))
    return num / max(float(x.abs().max()) for x in a)


# -- the independent metric: lifted blocks from the parameter names ------------------------------------------

def _proj(d, mod):
    if f"{mod}.base_layer.weight" in d:
        return (d[f"{mod}.base_layer.weight"], d[f"{mod}.base_layer.bias"], d[f"{mod}.lora_A.default.weight"],
                d[f"{mod}.lora_B.default.weight"])
    return d[f"{mod}.weight"], d[f"{mod}.bias"], None, None


def _lifted_side(base, d, mod, into, s, heads=2, h=8):
    """(heads, rows, h): into a head [W0[cols]ᵀ; b[cols]; (s B[cols] A)ᵀ] with A (the factor outside the pair)
    taken from ``base``; out of a head [W0[:, cols]; s B A[:, cols]] with B from ``base``."""
    W0, b, A, B = _proj(d, mod)
    _, _, A0, B0 = _proj(base, mod)
    out = []
    for i in range(heads):
        c = slice(i * h, (i + 1) * h)
        if into:
            rows = [W0[c].T, b[c][None]] + ([(s * B[c] @ A0).T] if A is not None else [])
        else:
            rows = [W0[:, c]] + ([s * B0 @ A[:, c]] if A is not None else [])
        out.append(torch.cat(rows))
    return torch.stack(out)


def independent_metric(metric, base, x, e, layer, kind, s=2.0):
    """g_θ(ξ, η) for the factor of ``kind`` ("qk"/"vo") in ``layer``, θ/ξ/η as parameter dicts."""
    K = load_kernels(f"gl_{metric}")
    pre = f"base_model.model.bert.encoder.layer.{layer}.attention"
    mods = [(f"{pre}.self.query", True), (f"{pre}.self.key", True)] if kind == "qk" else \
        [(f"{pre}.self.value", True), (f"{pre}.output.dense", False)]
    lift = [[_lifted_side(base, t, m, into, s) for m, into in mods] for t in (base, x, e)]
    total = K.inner(*lift[0], *lift[1], *lift[2]).sum()
    for m, into in mods:
        _, _, A, B = _proj(base, m)
        if A is None:
            continue
        (_, _, xA, xB), (_, _, eA, eB) = _proj(x, m), _proj(e, m)
        total = total + (torch.trace(torch.linalg.solve(A @ A.T, xA @ eA.T)) if into
                         else torch.trace(torch.linalg.solve(B.T @ B, xB.T @ eB)))
    return total


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("index,kind", [(0, "qk"), (1, "vo")])
def test_metric_is_the_pair_metric_of_the_effective_weights_plus_the_adapter_term(qkvo, metric, index, kind):
    _, _, params, _ = qkvo
    f, fa = _factor(qkvo, index, metric)
    g = torch.Generator().manual_seed(3)
    xi, eta = fa.random(g), fa.random(g)
    ref = independent_metric(metric, params, _as_dict(fa, params, xi), _as_dict(fa, params, eta), 0, kind)
    assert abs(float(fa.inner(xi, eta)) - float(ref)) <= 1e-12 * abs(float(ref))


# -- invariance and equivariance under the joint group -------------------------------------------------------

@pytest.mark.parametrize("metric", METRICS)
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_metric_projection_and_geodesic_are_invariant_under_random_joint_elements(qkvo, metric, data):
    """At ψ(θ) with GL(r) of both adapters and GL(h) of the pair at once (a ∈ [1e-2, 1e2]): g(ψξ, ψη) = g(ξ, η)
    (≤ 1e-10), P(ψξ) = ψ(Pξ), E(ψξ) = ψ(E(ξ)) (relative ≤ 1e-8); tangents move by the same linear action."""
    _, _, params, _ = qkvo
    f, fa = _factor(qkvo, data.draw(st.sampled_from([0, 1])), metric)
    point = data.draw(orbit_points(list(f.lora) + list(f.pairs), params))
    moved = f.at(point.params)
    g = torch.Generator().manual_seed(point.seed % 1000)
    xi, eta = fa.random(g), fa.random(g)

    def act(v):
        d = _as_dict(fa, params, v)
        for b, e in zip(point.bindings, point.elements):
            d = b.act(d, e.value)
        return _blocks(f, d)
    g0, g1 = float(fa.inner(xi, eta)), float(moved.inner(act(xi), act(eta)))
    assert abs(g1 - g0) <= 1e-10 * abs(g0), (point, g0, g1)
    h = fa.project(xi)
    assert _rel(act(h), moved.project(act(xi))) <= 1e-8
    E = fa.geodesic2([0.1 * x for x in h])
    assert _rel(act(E), moved.geodesic2([0.1 * x for x in act(h)])) <= 1e-8  # the action is linear


@pytest.mark.parametrize("metric", METRICS)
@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_riemannian_hessian_is_equivariant_under_random_joint_elements(qkvo, metric, data):
    """The quotient Hessian of the loss through this factor (joint_lora_hessian) at ψ(θ): Hess'(ψξ) = ψ(Hess ξ)
    and the Rayleigh quotient g(ψξ, Hess' ψξ) / g(ψξ, ψξ) = g(ξ, Hess ξ) / g(ξ, ξ) (relative ≤ 1e-8, a ∈ [1e-2,
    1e2]); the Euclidean Rayleigh quotient ∇²L[ξ, ξ] / ‖ξ‖² (what the Euclidean trace and eigenvalues are made
    of) changes, since ψ is not orthogonal (∇²L[ψξ, ψξ] at ψ(θ) itself equals ∇²L[ξ, ξ]: L∘ψ = L, ψ linear)."""
    model, _, params, batch = qkvo
    f, fa = _factor(qkvo, data.draw(st.sampled_from([0, 1])), metric)
    point = data.draw(orbit_points(list(f.lora) + list(f.pairs), params))
    loss = lambda p: model_loss(model, p, batch)  # noqa: E731
    op0 = QuotientHessian(ProductSpace(params, [f], adaptive_masks={}), loss)
    op1 = QuotientHessian(ProductSpace(point.params, [f], adaptive_masks={}), loss)

    def act(v):
        d = _as_dict(fa, params, v)
        for b, e in zip(point.bindings, point.elements):
            d = b.act(d, e.value)
        return _blocks(f, d)
    xi = fa.project(fa.random(torch.Generator().manual_seed(point.seed % 1000)))
    assert _rel(act(op0.matvec(xi)), op1.matvec(act(xi))) <= 1e-8
    r0, r1 = (op.quadratic_form(v) / float(op.inner(v, v)) for op, v in ((op0, xi), (op1, act(xi))))
    assert abs(r1 - r0) <= 1e-8 * abs(r0), (point, r0, r1)

    def euclidean_rayleigh(op, v):
        d = op.to_params(v)
        hv = op.hvp(d)
        return sum(float((hv[n] * d[n]).sum()) for n in op.names) / sum(float((d[n] ** 2).sum()) for n in op.names)
    e0, e1 = euclidean_rayleigh(op0, xi), euclidean_rayleigh(op1, act(xi))
    assert abs(e1 - e0) > 1e-3 * abs(e0), (point, e0, e1)


# -- the projection against dense least squares ----------------------------------------------------------------

def _vertical_basis(f, fa, params):
    """Every vertical vector d/dt ψ(exp tE)θ at t = 0 for the unit matrices E of every adapter's gl(r) and every
    head's gl(h), by torch.func.jvp of the bindings' own ``act``: columns of a dense matrix."""
    cols = []
    for b in list(f.lora) + list(f.pairs):
        shape = (b.num_heads, b.head_dim, b.head_dim) if hasattr(b, "num_heads") else \
            (params[b.b_weight].shape[1],) * 2
        I = torch.eye(shape[-1], dtype=DT).expand(shape)
        for j in range(I.numel()):
            E = torch.zeros(I.numel(), dtype=DT)
            E[j] = 1
            _, v = torch.func.jvp(lambda t: tuple(_blocks(f, b.act(params, I + t * E.reshape(shape)))),
                                  (torch.zeros((), dtype=DT),), (torch.ones((), dtype=DT),))
            cols.append(torch.cat([x.reshape(-1) for x in v]))
    return torch.stack(cols, 1)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("index,eps", [(0, 0.0), (1, 0.0), (1, 0.3)])
def test_projection_is_the_dense_least_squares_g_orthogonal_projection(qkvo, metric, index, eps):
    """Also with a Gram relaxation eps > 0 (T = S + εI ≠ S in the Sylvester form of the pair block)."""
    _, _, params, _ = qkvo
    f, fa = _factor(qkvo, index, metric, eps)
    shapes = [x.shape for x in fa.point]

    def unflat(v):
        out, i = [], 0
        for s in shapes:
            n = s.numel()
            out.append(v[i:i + n].reshape(s))
            i += n
        return out
    flat = lambda xs: torch.cat([x.reshape(-1) for x in xs])  # noqa: E731
    n = sum(s.numel() for s in shapes)
    M = torch.stack([flat(fa.metric_apply(fa.point, unflat(e))) for e in torch.eye(n, dtype=DT)], 1)
    assert float((M - M.T).abs().max()) <= 1e-12 * float(M.abs().max())
    V = _vertical_basis(f, fa, params)
    L = torch.linalg.cholesky(M)
    xi = fa.random(torch.Generator().manual_seed(5))
    x = flat(xi)
    c = torch.linalg.lstsq(L.T @ V, L.T @ x[:, None]).solution
    ref = x - (V @ c)[:, 0]
    Px = flat(fa.project(xi))
    assert float((Px - ref).abs().max()) <= 1e-9 * float(ref.abs().max())
    assert float((V.T @ M @ Px).abs().max()) <= 1e-9 * float((V.T @ M @ x).abs().max())  # horizontal
    assert float((flat(fa.project(unflat(Px))) - Px).abs().max()) <= 1e-12 * float(Px.abs().max())  # idempotent
    assert abs(float((x - Px) @ M @ Px)) <= 1e-10 * float(x @ M @ x)  # g-orthogonal
    # the explicit adjoint of v is the adjoint: ⟨v(X, Λ), w⟩ = ⟨(X, Λ), v*(w)⟩
    g = torch.Generator().manual_seed(6)
    Xs = [torch.randn(r, r, generator=g, dtype=DT) for r in fa.ranks]
    Ls = [torch.randn(fa.point[2 * k].shape[0], 8, 8, generator=g, dtype=DT) for k in range(len(f.pairs))]
    aX, aL = fa.vertical_adjoint(xi)
    lhs = float(flat(fa.vertical(Xs, Ls)) @ x)
    assert abs(lhs - float(flat(Xs) @ flat(aX) + flat(Ls) @ flat(aL))) <= 1e-12 * max(1.0, abs(lhs))


# -- the geodesic ----------------------------------------------------------------------------------------------

def autodiff_acceleration(fa, p, xi):
    """γ̈ = −𝕄⁻¹[(D_ξ𝕄)ξ − ½∇_θ⟨ξ, 𝕄(θ)ξ⟩] with both derivatives by torch.func of the factor's metric matrix."""
    p, xi = tuple(p), tuple(xi)
    _, dM = torch.func.jvp(lambda *q: tuple(fa.metric_apply(list(q), list(xi))), p, xi)
    grad = torch.func.grad(lambda *q: fa.metric_inner(list(q), list(xi), list(xi)), argnums=tuple(range(len(p))))(*p)
    return [-c for c in fa.metric_apply(list(p), [d - 0.5 * g for d, g in zip(dM, grad)], inverse=True)]


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("index,eps", [(0, 0.0), (1, 0.0), (1, 0.3)])
def test_closed_form_acceleration_equals_autodiff_of_the_metric(qkvo, metric, index, eps):
    f, fa = _factor(qkvo, index, metric, eps)
    g = torch.Generator().manual_seed(9)
    for p in (fa.point, [x + 0.3 * d for x, d in zip(fa.point, fa.random(g))]):  # also away from the base point
        xi = fa.random(g)
        assert _rel(autodiff_acceleration(fa, p, xi), fa.acceleration(p, xi)) <= 1e-12


@pytest.mark.parametrize("metric", METRICS)
def test_acceleration_satisfies_the_koszul_identity_by_finite_differences(qkvo, metric):
    """g(γ̈, η) = ½ D_η g(ξ, ξ) − D_ξ g(ξ, η) (constant fields), the right side by central differences (step
    1e-4) of the independent metric of the effective weights; relative agreement ≤ 1e-6 for random η."""
    _, _, params, _ = qkvo
    f, fa = _factor(qkvo, 1, metric)
    g = torch.Generator().manual_seed(7)
    xi = fa.project(fa.random(g))
    acc = fa.acceleration(fa.point, xi)
    d = lambda v: _as_dict(fa, params, v)  # noqa: E731
    at = lambda t, v: fa.insert(dict(params), [p + t * x for p, x in zip(fa.point, v)])  # noqa: E731
    gi = lambda base, x, e: float(independent_metric(metric, base, d(x), d(e), 0, "vo"))  # noqa: E731
    t = 1e-4
    for _ in range(3):
        eta = fa.random(g)
        dxi = (gi(at(t, xi), xi, eta) - gi(at(-t, xi), xi, eta)) / (2 * t)
        deta = (gi(at(t, eta), xi, xi) - gi(at(-t, eta), xi, xi)) / (2 * t)
        rhs = 0.5 * deta - dxi
        lhs = float(fa.inner(acc, eta))
        assert abs(lhs - rhs) <= 1e-6 * (abs(0.5 * deta) + abs(dxi)), (lhs, rhs)


def test_second_order_geodesic_matches_the_integrated_geodesic_to_third_order(qkvo):
    """RK4 (8 steps) of γ̈ = −Γ(γ̇, γ̇) to time τ vs E(τξ) (unit ξ): the error falls by ≈ 8 when τ halves."""
    f, fa = _factor(qkvo, 0, "mix")
    xi = fa.project(fa.random(torch.Generator().manual_seed(8)))
    xi = [x / float(fa.inner(xi, xi)) ** 0.5 for x in xi]

    def integrate(tau, steps=8):
        x, v, dt = list(fa.point), list(xi), tau / steps

        def f_(x, v):
            return v, fa.acceleration(x, v)
        for _ in range(steps):
            k1 = f_(x, v)
            k2 = f_([a + 0.5 * dt * b for a, b in zip(x, k1[0])], [a + 0.5 * dt * b for a, b in zip(v, k1[1])])
            k3 = f_([a + 0.5 * dt * b for a, b in zip(x, k2[0])], [a + 0.5 * dt * b for a, b in zip(v, k2[1])])
            k4 = f_([a + dt * b for a, b in zip(x, k3[0])], [a + dt * b for a, b in zip(v, k3[1])])
            x = [a + dt / 6 * (p + 2 * q + 2 * r + s) for a, p, q, r, s in zip(x, k1[0], k2[0], k3[0], k4[0])]
            v = [a + dt / 6 * (p + 2 * q + 2 * r + s) for a, p, q, r, s in zip(v, k1[1], k2[1], k3[1], k4[1])]
        return x
    errs = []
    for tau in (0.02, 0.01):
        E = fa.geodesic2([tau * x for x in xi])
        errs.append(max(float((a - b).abs().max()) for a, b in zip(E, integrate(tau))))
    assert 7 < errs[0] / errs[1] < 9, errs  # measured 8.00


@pytest.mark.parametrize("metric", METRICS)
def test_ascent_step_pairings_and_the_vjp_of_E(qkvo, metric):
    """The ascent hook with E's pullback from ``forward``: ⟨ξ, ∇⟩_F (∇ = (∂E/∂ξ)ᵀū) equals the central difference
    of ⟨ū, E(ξ + tξ)⟩; g(d, d) = ⟨d, ∇⟩_F and g(ξ, d) = ⟨ξ, ∇⟩_F for d = P 𝕄⁻¹ ∇ (P g-orthogonal, ξ horizontal)."""
    f, fa = _factor(qkvo, 1, metric)
    g = torch.Generator().manual_seed(11)
    xi = [0.1 * x for x in fa.project(fa.random(g))]
    cot = [torch.randn(x.shape, generator=g, dtype=DT) for x in xi]
    E, pull = fa.forward(xi, None)
    assert _rel(E, fa.perturbed(xi)) <= 1e-14
    d, _, dd, xd = fa.ascent(xi, cot, pull)
    F = lambda t: sum(float((c * e).sum()) for c, e in zip(cot, fa.geodesic2([(1 + t) * x for x in xi])))  # noqa
    fd = (F(1e-5) - F(-1e-5)) / 2e-5
    assert abs(float(xd) - fd) <= 1e-6 * abs(fd)
    assert abs(float(fa.inner(d, d)) - float(dd)) <= 1e-10 * abs(float(dd))
    assert abs(float(fa.inner(xi, d)) - float(xd)) <= 1e-10 * abs(float(dd)) ** 0.5 * float(fa.inner(xi, xi)) ** 0.5


# -- whole-model geodesic sharpness ----------------------------------------------------------------------------

def _sharpness(case, params, factors, rho=0.05, n_iter=4, seed=0):
    model, smap, _, batch = case
    covered = {n for f in factors for n in f.param_names}
    masks = {n: m for n, m in smap.adaptive_masks.items() if not (m is None and n in covered)} if factors else None
    space = ProductSpace(params, factors, masks)
    l0 = float(model_loss(model, params, batch))
    res = apgd(space.value_and_grad(lambda p: model_loss(model, p, batch)), space, rho, n_iter=n_iter,
               random_start=True, generator=torch.Generator().manual_seed(seed))
    return res.best_value - l0


@settings(max_examples=2, deadline=None)
@given(data=st.data())
def test_whole_model_geodesic_sharpness_is_invariant_along_lora_and_pair_orbits_at_once(qv, data):
    """Tiny BERT, LoRA on query and value: every adapter's GL(r) and every pair's GL(h) move at once
    (a ∈ [1e-2, 1e2]); joint geodesic sharpness (mix) unchanged ≤ 1e-8 relative, adaptive sharpness changes."""
    model, smap, params, _ = qv
    factors, left = joint_lora_factors(model, smap.groups, "mix")
    assert not left and len(factors) == 4
    point = data.draw(orbit_points(lora_bindings(model) + list(smap.groups), params))
    s0, s1 = _sharpness(qv, params, factors), _sharpness(qv, point.params, factors)
    assert s0 > 0 and abs(s1 - s0) <= 1e-8 * abs(s0), (point, s0, s1)
    a0, a1 = _sharpness(qv, params, []), _sharpness(qv, point.params, [])
    assert abs(a1 - a0) > 1e-3 * abs(a0), (point, a0, a1)


@settings(max_examples=1, deadline=None)
@given(data=st.data())
def test_gpt2_fused_qkv_adapter_joins_both_pairs_of_its_layer_and_stays_invariant(data):
    """GPT-2 with LoRA on the fused c_attn (B rows in Q, K and V heads) and on attn.c_proj (A columns out of the
    heads): one factor per layer holding both adapters and both pairs; geodesic sharpness (inv) unchanged
    ≤ 1e-8 along every orbit at once."""
    torch.manual_seed(0)
    model = cases.lora(cases.gpt2(initializer_range=cases.IR), targets=("c_attn", "attn.c_proj")).to(DT).eval()
    smap = symmetry_map(model)
    params = {n: p.detach() for n, p in model.named_parameters()}
    ids = torch.randint(1, 50, (3, 8), generator=torch.Generator().manual_seed(1))
    case = (model, smap, params, ({"input_ids": ids}, ids))
    factors, left = joint_lora_factors(model, smap.groups, "inv")
    assert not left and [(len(f.lora), len(f.pairs)) for f in factors] == [(2, 2), (2, 2)]
    fa = factors[0].at(params)
    assert fa.into == [True, False] and [len(r) for r in fa.rows] == [1, 1, 1, 1]  # Q, K, V rows; O columns
    xi = fa.random(torch.Generator().manual_seed(2))  # adapter rows on both sides of a pair: closed form vs autodiff
    assert _rel(autodiff_acceleration(fa, fa.point, xi), fa.acceleration(fa.point, xi)) <= 1e-12
    point = data.draw(orbit_points(lora_bindings(model) + list(smap.groups), params))
    s0, s1 = _sharpness(case, params, factors), _sharpness(case, point.params, factors)
    assert s0 > 0 and abs(s1 - s0) <= 1e-8 * abs(s0), (point, s0, s1)


# -- construction ----------------------------------------------------------------------------------------------

def test_factors_group_adapters_that_share_a_pair_and_refuse_bad_input(qkvo):
    model, smap, params, _ = qkvo
    factors, left = joint_lora_factors(model, smap.groups, "inv")
    assert not left and [len(f.lora) for f in factors] == [2, 2, 2, 2]
    assert all(f.scaling == (2.0, 2.0) for f in factors)  # alpha / r = 4 / 2
    fa = factors[1].at(params)
    assert fa.into == [True, False] and fa.ranks == [2, 2]
    qk, vo = smap.groups[0], smap.groups[1]
    with pytest.raises(ValueError, match="exactly one of lora_B"):
        JointLoRAFactor(factors[0].lora[0], (vo,)).at(params)  # the query adapter is not held by V/O
    with pytest.raises(ValueError, match="metric"):
        JointLoRAFactor(factors[0].lora, (qk,), "frobenius")
    # a rotary pair (the RoPE subgroup) solves in its commutant: fewer vertical directions, a larger horizontal part
    xi = [torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=DT) for x in factors[0].at(params).point]
    full = factors[0].at(params).project(xi)
    sub = JointLoRAFactor(factors[0].lora, (dataclasses.replace(qk, rotary=("half", 8)),), "inv",
                          scaling=factors[0].scaling).at(params).project(xi)
    gap = max(float((a - b).abs().max()) for a, b in zip(full, sub))
    assert gap > 1e-6 * max(float(x.abs().max()) for x in xi)
    assert set(factors[0].param_names) >= set(qk.param_names) | set(factors[0].lora[0].param_names)
