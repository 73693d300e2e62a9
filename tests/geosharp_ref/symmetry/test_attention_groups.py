"""SymmetryMap and its pair groups (geosharp_ref.symmetry.attention.groups) on real (tiny, float64) transformer models.

The central property: acting with random per-head A = a·Ã (a log-uniform in [1e-2, 1e2], Ã
orthogonal × diag[0.5, 2]) on every detected group leaves the model's outputs unchanged to 1e-8
relative while changing the parameters; this proves the orientation of every G and H. Plus: the action
is a right group action, the invariant-loss gradient identity, extract/insert round trips and coverage,
inserts composing on shared parameters, differentiability, the printed table.
"""
from __future__ import annotations


import pytest
import torch
from hypothesis import given, strategies as st
from torch.func import functional_call

from geosharp_ref.precision import keep_float64

from tests import cases
from tests.cases import rel_error as _rel
from tests.cases import forward as _run, params_of as _params, random_gl as _random_A, symmetry_case as build

transformers = cases.quiet_transformers()

DT = torch.float64
TOL = 1e-8
ARCHS = cases.SYMMETRY_NAMES


# ---------------------------------------------------------------------------------------------
# Invariance along GL(h) orbits (hypothesis over seeds and scales)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ARCHS)
@given(seed=st.integers(0, 2**31 - 1), log10_a=st.floats(-2.0, 2.0))
def test_action_leaves_outputs_invariant(name, seed, log10_a):
    model, make_inputs, out, smap = build(name)
    gen = torch.Generator().manual_seed(seed)
    kwargs = make_inputs(gen)
    params = _params(model)
    As = _random_A(smap, gen, log10_a)
    moved = smap.act(params, As)
    y0, y1 = _run(model, params, kwargs, out), _run(model, moved, kwargs, out)
    assert torch.isfinite(y0).all()
    assert _rel(y1, y0) <= TOL, (name, _rel(y1, y0))
    # the parameters did move: every group's G changed
    for g in smap.groups:
        G0, _ = g.extract(params)
        G1, _ = g.extract(moved)
        assert _rel(G1, G0) > 1e-3
    # and nothing outside the groups changed
    for k, mask in smap.adaptive_masks.items():
        sel = ... if mask is None else mask
        assert torch.equal(moved[k][sel], params[k][sel])


def test_action_composes_as_group_action():
    """ψ(A₂, ψ(A₁, θ)) = ψ(A₁A₂, θ) (right action), up to round-off."""
    model, _, _, smap = build("mha-cross")
    gen = torch.Generator().manual_seed(3)
    params = _params(model)
    A1, A2 = _random_A(smap, gen, 0.5), _random_A(smap, gen, -0.7)
    lhs = smap.act(smap.act(params, A1), A2)
    rhs = smap.act(params, {k: A1[k] @ A2[k] for k in A1})
    for k in params:
        assert _rel(lhs[k], rhs[k]) < 1e-12


@pytest.mark.parametrize("name", ["bert", "gpt2", "mha-cross", "gqa-custom", "llama", "phi3"])
def test_gradient_identity(name):
    """Invariance ⇒ Gᵀ ∇_G L = (∇_H L)ᵀ H per head (docs/MATH.md), here through extract/insert."""
    model, make_inputs, out, smap = build(name)
    kwargs = make_inputs(torch.Generator().manual_seed(1))
    params = _params(model)
    blocks = {g.key: tuple(t.requires_grad_() for t in g.extract(params)) for g in smap.groups}
    p = params
    for g in smap.groups:
        p = g.insert(p, blocks[g.key])
    with keep_float64():
        o = functional_call(model, p, args=(), kwargs=dict(kwargs, **cases.hidden_kw(model)))
    loss = (out(o) ** 2).sum() * 1e-2
    flat = [t for gh in blocks.values() for t in gh]
    grads = torch.autograd.grad(loss, flat)
    for i, g in enumerate(smap.groups):
        G, H = blocks[g.key]
        dG, dH = grads[2 * i], grads[2 * i + 1]
        lhs, rhs = G.mT @ dG, dH.mT @ H
        if g.rotary is not None:  # invariant under the RoPE subgroup only: equal on its Lie algebra
            from geosharp_ref.kernels import load_kernels
            E = load_kernels(g.kernels).subalgebra_basis(g.head_dim, g.rotary[1]).matrices(DT)  # (d, h, h)
            lhs, rhs = torch.einsum("nij,kij->nk", lhs, E), torch.einsum("nij,kij->nk", rhs, E)
        assert float((lhs - rhs).detach().norm()) <= 1e-9 * float(lhs.detach().norm()) + 1e-12, g.key


# ---------------------------------------------------------------------------------------------
# extract / insert, coverage, table
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ARCHS)
def test_extract_insert_roundtrip_and_coverage(name):
    model, _, _, smap = build(name)
    params = _params(model)
    p = params
    for g in smap.groups:
        G, H = g.extract(p)
        q = g.insert(p, (G, H))
        assert q is not p and set(q) == set(p)
        for k in p:
            assert torch.equal(q[k], p[k]), (g.key, k)
        p = q
    # every element covered exactly once by the groups (through insert) and the adaptive masks
    counts = smap.coverage_counts(params)
    total = sum(v.numel() for v in params.values())
    assert all(bool((c == 1).all()) for c in counts.values()), {k: c.unique() for k, c in counts.items()}
    covered = sum(g.num_heads * (g.n + g.m) * g.head_dim for g in smap.groups)
    adaptive = sum(params[k].numel() if m is None else int(m.sum()) for k, m in smap.adaptive_masks.items())
    assert covered + adaptive == total


@pytest.mark.parametrize("name", ["mha-batch-first", "gpt2", "mha-cross", "qknorm-custom"])
def test_insert_composes_on_shared_parameters(name):
    """Groups sharing a fused parameter (in_proj_weight, c_attn, W_O with adaptive bias) insert
    one after another; each reads back what it wrote, and uncovered parts are untouched."""
    model, _, _, smap = build(name)
    params = _params(model)
    gen = torch.Generator().manual_seed(7)
    new = {}
    p = params
    for g in smap.groups:
        G = torch.randn(g.num_heads, g.n, g.head_dim, generator=gen, dtype=DT)
        H = torch.randn(g.num_heads, g.m, g.head_dim, generator=gen, dtype=DT)
        new[g.key] = (G, H)
        p = g.insert(p, (G, H))
    for g in smap.groups:
        G, H = g.extract(p)
        assert torch.equal(G, new[g.key][0]) and torch.equal(H, new[g.key][1])
    for k, m in smap.adaptive_masks.items():
        assert torch.equal(p[k][... if m is None else m], params[k][... if m is None else m])


def test_extract_insert_differentiable_no_inplace():
    model, _, _, smap = build("mha-batch-first")
    params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    snapshot = {k: v.detach().clone() for k, v in params.items()}
    g = smap.groups[1]  # vo: in_proj_weight rows 32:48 + out_proj.weight
    G, H = g.extract(params)
    p = g.insert(params, (2 * G, 3 * H))
    loss = sum((t ** 2).sum() for t in p.values())
    loss.backward()
    w = "layers.0.self_attn.in_proj_weight"
    grad = params[w].grad
    # rows of V: d/dW (2W)² = 8W; other rows: 2W
    assert torch.allclose(grad[32:], 8 * snapshot[w][32:]) and torch.allclose(grad[:32], 2 * snapshot[w][:32])
    for k in params:
        assert torch.equal(params[k].detach(), snapshot[k])


@pytest.mark.parametrize("name", ["bert", "llama", "clip"])
def test_table_one_line_per_group(name):
    _, _, _, smap = build(name)
    text = str(smap)
    lines = text.splitlines()
    header = lines[1].split()
    assert header[:2] == ["layer", "kind"] and "geometry" in header
    rows = [ln for ln in lines if "per head" in ln]
    assert len(rows) == len(smap.groups)
    for g in smap.groups:
        assert sum(ln.split()[:2] == [g.layer, g.kind] for ln in rows) == 1
        assert f"({g.num_heads}, {g.n}, {g.head_dim})" in text
    for key, _ in smap.refused:
        assert key in text


# ---------------------------------------------------------------------------------------------------------
# PairGroup is a Binding: kernels, act, random_element; the older insert(params, G, H) still works
# ---------------------------------------------------------------------------------------------------------

def test_pair_group_is_a_binding_with_its_geometry():
    from dataclasses import replace

    from geosharp_ref.symmetry import Binding
    _, _, _, smap = build("bert")
    g = smap.groups[0]
    assert isinstance(g, Binding) and g.kernels == "gl_mix"
    assert g.with_metric("inv").kernels == "gl_inv" and replace(g, kernels="gl_inv") == g.with_metric("inv")
    assert g.with_metric("inv").key == g.key and g.kernels == "gl_mix"  # frozen: a new group


def test_pair_group_act_is_the_map_action_and_both_insert_forms_agree():
    model, _, _, smap = build("gpt2")
    params = _params(model)
    for i, g in enumerate(smap.groups):
        A = g.random_element(params, scale=1e2, seed=i)
        assert A.shape == (g.num_heads, g.head_dim, g.head_dim)
        s = torch.linalg.svdvals(A / 1e2)
        assert float(s.min()) >= 0.5 - 1e-12 and float(s.max()) <= 2 + 1e-12  # Q·diag(u), u in [0.5, 2], times a
        by_group, by_map = g.act(params, A), smap.act(params, {g.key: A})
        assert all(torch.equal(by_group[k], by_map[k]) for k in params)
        G, H = g.extract(params)
        old, new = g.insert(params, 2 * G, 3 * H), g.insert(params, (2 * G, 3 * H))
        assert all(torch.equal(old[k], new[k]) for k in params)
    with pytest.raises(ValueError, match="A has shape"):
        smap.groups[0].act(params, torch.eye(2, dtype=torch.float64))
