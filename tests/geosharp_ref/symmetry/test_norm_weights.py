"""Norm weights quotiented jointly with their readers (geosharp_ref/symmetry/norm_weights.py): detection on the case
tables, the action's exactness, the fold's algebra, and whole-model invariance along every quotiented orbit at once
(norm weights included) on GPT-2, ViT and the decoder families, with a control showing the fold is what makes it hold.

Observed (float64, n_iter 3, ρ 0.05, every quotiented group acting at once with elements of scale 1e-2 and 1e2,
inv and mix): geodesic sharpness changes by ≤ 3.9e-13 (relative) on GPT-2, ViT and the nine decoder cases (Llama,
Mistral, Qwen2, Gemma, Phi-3, GPT-NeoX, GPT-J), adaptive sharpness by ≥ 1.4e-3; with the readers' geometries left
unfolded, the norm action alone changes geodesic sharpness by 7e-2 … 1.4e1.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from geosharp_ref.sharpness import adaptive_sharpness, geodesic_sharpness
from geosharp_ref.symmetry import GatedUnitsBinding, NormWeightsBinding, Quotient, fold_binding
from geosharp_ref.symmetry.check import log_probabilities
from geosharp_ref.symmetry.norm_weights import norm_weight_candidates
from geosharp_ref.forward import call_model
from geosharp_ref.verification.orbits import model_with_params
from tests import cases
from tests.cases.orbits import moved_along_every_orbit

cases.quiet_transformers()

TOL = 1e-8
RHO = 0.05
N_ITER = 3
EXAMPLES = max(2, settings.default.max_examples // 20)

#: table, case → {norm module suffix: reader parameter suffixes} of the bound norms (one layer shown), and the
#: number of norms bound
EXPECTED = {
    ("sharpness", "gpt2"): ({"h.0.ln_1": ["h.0.attn.c_attn.weight"], "h.0.ln_2": ["h.0.mlp.c_fc.weight"]}, 4),
    ("sharpness", "vit"): ({"layers.0.layernorm_before": ["q_proj.weight", "k_proj.weight", "v_proj.weight"],
                            "layers.0.layernorm_after": ["mlp.fc1.weight"]}, 5),
    ("decoder", "llama"): ({"layers.0.input_layernorm": ["q_proj.weight", "k_proj.weight", "v_proj.weight"],
                            "layers.0.post_attention_layernorm": ["gate_proj.weight", "up_proj.weight"],
                            "model.norm": ["lm_head.weight"]}, 5),
    ("decoder", "phi3"): ({"layers.0.input_layernorm": ["qkv_proj.weight"],
                           "layers.0.post_attention_layernorm": ["gate_up_proj.weight"]}, 5),
    ("decoder", "gemma"): ({"layers.0.input_layernorm": ["q_proj.weight", "k_proj.weight", "v_proj.weight"]}, 4),
}


def _batch(table, name, seed=0):
    M = cases.sharpness_case(name, table)
    return M, M.make_batch(torch.Generator().manual_seed(seed))


def _quotient(M, batch, metric="mix"):
    return Quotient.resolve(M.model, batch, metric=metric, symmetries="all")


@pytest.mark.parametrize("table,name", sorted(EXPECTED))
def test_norms_and_their_readers_are_found_and_bound(table, name):
    M, batch = _batch(table, name)
    q = _quotient(M, batch)
    norms = [b for b in q.bindings if isinstance(b, NormWeightsBinding)]
    readers, count = EXPECTED[(table, name)]
    assert len(norms) == count, [b.key for b in norms]
    for suffix, expected in readers.items():
        (b,) = [b for b in norms if b.fold.norm.endswith(suffix)]
        got = b.fold.reader_names
        assert len(got) == len(expected) and all(any(g.endswith(e) for g in got) for e in expected), got
        assert b.param_names == (b.fold.gamma,) and b.fold.gamma not in q.adaptive_masks
        if b.fold.bias is not None:  # LayerNorm's β stays adaptive
            assert b.fold.bias in q.adaptive_masks
    assert q.yielded == [] and not any("belong to" in why for _, _, why in q.refused)
    # every symmetry reading a bound norm sees it folded; the joint groups name them
    joint = dict(q.joint)
    for s in q.all:
        reads = {b.key for b in norms if set(b.fold.reader_names) & set(s.param_names)}
        assert {b.key for b in norms if b.fold in getattr(s, "norm_folds", ())} == reads
        for key in reads:
            assert s.key in joint[key]


def test_gemma_norm_stores_w_with_gamma_one_plus_w_and_tied_heads_are_refused():
    M, batch = _batch("decoder", "gemma")
    cands = norm_weight_candidates(M.model, batch)
    bound = [c.binding for c in cands if c.binding is not None]
    assert bound and all(b.fold.offset == 1.0 for b in bound)
    (tied,) = [c for c in cands if c.binding is None]
    assert tied.key == "model.norm:norm-weights" and "tied" in tied.reason


def test_post_ln_models_have_no_candidate_and_gpt2_final_norm_is_refused_as_tied():
    M, batch = _batch("sharpness", "bert")
    assert norm_weight_candidates(M.model, batch) == []  # every LayerNorm output also feeds the residual stream
    M, batch = _batch("sharpness", "gpt2")
    refused = [c for c in norm_weight_candidates(M.model, batch) if c.binding is None]
    assert [c.key for c in refused] == ["transformer.ln_f:norm-weights"] and "lm_head.weight" in refused[0].reason


@pytest.mark.parametrize("table,name", [("decoder", "llama"), ("decoder", "gemma"), ("sharpness", "gpt2")])
def test_the_action_leaves_the_output_unchanged_and_moves_gamma_beta_and_readers(table, name):
    """Independent of the binding's check: act with elements of scale 1e-2 and 1e2 (random signs) and compare the
    log-probabilities of the model's own forward."""
    M, batch = _batch(table, name)
    params = cases.params_of(M.model)
    base = log_probabilities(call_model(M.model, params, batch[0]))
    for c in norm_weight_candidates(M.model, batch):
        if c.binding is None:
            continue
        for i, scale in enumerate((1e-2, 1e2)):
            d = c.binding.random_element(params, scale=scale, seed=i, signs=True)
            assert bool((d < 0).any()) and bool((d > 0).any())  # the whole group, sign flips included
            assert bool((c.binding.random_element(params, scale=scale, seed=i) > 0).all())  # the default: d > 0
            moved = c.binding.act(params, d)
            f = c.binding.fold
            assert torch.allclose(f.gamma_of(moved), d * f.gamma_of(params), rtol=1e-12)
            assert all(not torch.equal(moved[n], params[n]) for n in f.reader_names)
            out = log_probabilities(call_model(M.model, moved, batch[0]))
            assert float((out - base).abs().max() / base.abs().max()) <= 1e-10, (c.key, scale)


def test_fold_binding_extracts_folded_blocks_inserts_back_and_keeps_the_class():
    M, batch = _batch("decoder", "llama")
    q = _quotient(M, batch)
    params = cases.params_of(M.model)
    (gated,) = [b for b in q.bindings if isinstance(b, GatedUnitsBinding) and ".layers.0." in b.key]
    norm = next(b for b in q.bindings if isinstance(b, NormWeightsBinding) and b.fold in gated.norm_folds)
    plain = GatedUnitsBinding.__new__(GatedUnitsBinding)
    plain.__dict__.update({k: v for k, v in gated.__dict__.items() if k != "norm_folds"})
    assert type(plain) is GatedUnitsBinding and isinstance(gated, GatedUnitsBinding)
    g = norm.fold.gamma_of(params)
    folded_params = {n: (params[n] * g if n in norm.fold.reader_names else params[n]) for n in params}
    for x, y in zip(gated.extract(params), plain.extract(folded_params)):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    # insert(θ, extract(θ)) = θ: bit for bit outside the bound slice, to round-off on it
    back = gated.insert(params, gated.extract(params))
    for n in params:
        torch.testing.assert_close(back[n], params[n], rtol=1e-15, atol=0)
    # a perturbation δ of the folded block moves W by δ Γ⁻¹
    blocks = gated.extract(params)
    delta = [torch.randn(b.shape, dtype=b.dtype, generator=torch.Generator().manual_seed(3)) * 1e-3 for b in blocks]
    moved = gated.insert(params, [b + d for b, d in zip(blocks, delta)])
    ref = plain.insert(folded_params, [b + d for b, d in zip(blocks, delta)])
    up = gated.up_weight
    torch.testing.assert_close(moved[up], ref[up] / g, rtol=1e-12, atol=1e-15)
    # folding twice with the same fold is folding once
    assert fold_binding(gated, [norm.fold]).norm_folds == gated.norm_folds


CASES_ALL = [("sharpness", "gpt2"), ("sharpness", "vit"), ("decoder", "llama"), ("decoder", "phi3"),
             ("decoder", "gemma")]


@pytest.mark.parametrize("table,name", CASES_ALL)
@settings(max_examples=EXAMPLES, deadline=None)
@given(seed=st.integers(0, 2 ** 16), log10_a=st.floats(-2.0, 2.0), metric=st.sampled_from(["inv", "mix"]))
def test_geodesic_sharpness_is_invariant_along_every_orbit_at_once_norm_weights_included(table, name, seed,
                                                                                         log10_a, metric):
    M, batch = _batch(table, name, seed)
    q = _quotient(M, batch, metric)
    assert any(isinstance(b, NormWeightsBinding) for b in q.bindings)
    m1 = moved_along_every_orbit(M, q, log10_a, seed)
    kw = dict(metric=metric, n_iter=N_ITER, loss_fn=M.loss_fn, symmetries="all")
    s0 = geodesic_sharpness(M.model, [batch], RHO, **kw)
    s1 = geodesic_sharpness(m1, [batch], RHO, **kw)
    assert s0.mean > 0 and abs(s1.mean - s0.mean) <= TOL * abs(s0.mean), (name, metric, s0.mean, s1.mean)
    assert s0.config["yielded"] == [] and len(s0.config["joint"]) == sum(
        isinstance(b, NormWeightsBinding) for b in q.bindings)
    a0 = adaptive_sharpness(M.model, [batch], RHO, n_iter=N_ITER, loss_fn=M.loss_fn).mean
    a1 = adaptive_sharpness(m1, [batch], RHO, n_iter=N_ITER, loss_fn=M.loss_fn).mean
    assert abs(a1 - a0) > 1e-4 * abs(a0), (name, a0, a1)


@pytest.mark.parametrize("table,name", [("sharpness", "gpt2"), ("decoder", "llama")])
def test_without_the_fold_the_norm_action_changes_geodesic_sharpness(table, name):
    """The control: the same quotient with the readers' geometries on the raw (unfolded) weights is not invariant
    under the norm group, so the invariance above is the fold's doing."""
    M, batch = _batch(table, name)
    q = _quotient(M, batch, "inv")
    raw = [b for b in q.report().bindings if not isinstance(b, NormWeightsBinding)]  # the search's, unfolded
    assert not any(hasattr(b, "norm_folds") for b in raw)
    m1 = moved_along_every_orbit(M, q, 1.0, 0, kinds=NormWeightsBinding)
    kw = dict(metric="inv", n_iter=N_ITER, loss_fn=M.loss_fn, symmetries=raw)
    s0 = geodesic_sharpness(M.model, [batch], RHO, **kw)
    s1 = geodesic_sharpness(m1, [batch], RHO, **kw)
    assert s0.config["joint"] == [] and abs(s1.mean - s0.mean) > 1e-4 * abs(s0.mean), (s0.mean, s1.mean)


def test_lora_adapters_reading_a_norm_are_folded_and_the_whole_model_stays_invariant():
    """peft LoRA on q/v (A adaptive, B in the pairs) and on up/down (LoRA's GL(r) bound, its A reads the MLP norm):
    every norm is still bound (dropout = identity passes the norm's output on unchanged), the LoRA bindings whose A
    reads a norm are folded, and geodesic sharpness is invariant along every orbit at once."""
    case = cases.CASES["decoder"]["llama"]
    model = cases.lora(cases.lora(cases.make(case), targets=("q_proj", "v_proj")), targets=("up_proj", "down_proj"))
    model = model.double().eval()
    batch = case.batch(torch.Generator().manual_seed(0))
    q = Quotient.resolve(model, batch, metric="mix", symmetries="all")
    assert sum(isinstance(b, NormWeightsBinding) for b in q.bindings) == 5
    up = [b for b in q.bindings if b.key.endswith("up_proj:lora")]
    down = [b for b in q.bindings if b.key.endswith("down_proj:lora")]
    assert len(up) == len(down) == 2
    assert all(len(b.norm_folds) == 1 for b in up) and not any(hasattr(b, "norm_folds") for b in down)
    qk = [g for g in q.pairs if g.key.endswith(":qk")]
    assert all(any(n.endswith("lora_A.default.weight") for n in g.norm_folds[0].reader_names) for g in qk)
    M = cases.SharpnessModel(model, case.batch, case.loss_fn, case.output, None)
    m1 = moved_along_every_orbit(M, q, 1.5, 3)
    kw = dict(metric="mix", n_iter=N_ITER, loss_fn=case.loss_fn, symmetries="all")
    s0 = geodesic_sharpness(model, [batch], RHO, **kw).mean
    s1 = geodesic_sharpness(m1, [batch], RHO, **kw).mean
    assert abs(s1 - s0) <= TOL * abs(s0), (s0, s1)


@pytest.mark.parametrize("table,name", [("sharpness", "gpt2"), ("decoder", "llama")])
def test_geodesic_sharpness_is_invariant_under_sign_flips_of_the_norm_weights(table, name):
    """The norm group's other components (γᵢ ↦ −γᵢ, the readers' column negated): the fold divides by γ itself,
    so the quotient geometry follows the sign."""
    M, batch = _batch(table, name)
    q = _quotient(M, batch, "mix")
    params = cases.params_of(M.model)
    for i, b in enumerate(b for b in q.bindings if isinstance(b, NormWeightsBinding)):
        params = b.act(params, b.random_element(params, scale=3.0, seed=i, signs=True))
    kw = dict(metric="mix", n_iter=N_ITER, loss_fn=M.loss_fn, symmetries="all")
    s0 = geodesic_sharpness(M.model, [batch], RHO, **kw).mean
    s1 = geodesic_sharpness(model_with_params(M.model, params), [batch], RHO, **kw).mean
    assert abs(s1 - s0) <= TOL * abs(s0), (s0, s1)
