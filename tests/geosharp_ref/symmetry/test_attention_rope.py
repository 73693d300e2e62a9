"""Rotary Q/K pairs (geosharp_ref.symmetry.attention.rope): bound under the RoPE subgroup of GL(h) in the decoder
families of the case tables (rotate-half and interleaved pairings, partial rotary, GQA, q/k biases, fused
projections), GL(h) itself refused on them, and the variants that are refused with their reason."""
from __future__ import annotations

import pytest
import torch

from geosharp_ref.symmetry import PairSpec, symmetry_map
from tests import cases
from tests.cases import rel_error as _rel
from tests.cases import (forward as _run, params_of as _params, random_gl as _random_A,
                         symmetry_case as build)

transformers = cases.quiet_transformers()

DT = torch.float64
TOL = 1e-8
ARCHS = cases.SYMMETRY_NAMES



@pytest.mark.parametrize("name, rotary", [("llama", ("half", 4)), ("mistral", ("half", 4)), ("qwen2", ("half", 4)),
                                          ("gemma", ("half", 4)), ("phi3", ("half", 2)), ("gpt-neox", ("half", 4)),
                                          ("gptj", ("interleaved", 4))])
def test_rope_qk_bound_under_the_subgroup_vo_kept(name, rotary):
    """Rotary Q/K pairs are bound under the RoPE subgroup with the pairing and rotary dimension read from the
    model (Phi-3: partial_rotary_factor 0.5 of head dim 4), their kernels rope_<pairing>_<metric>; V/O stays GL(h)."""
    model, _, _, smap = build(name)
    assert not smap.refused
    qks = [g for g in smap.groups if g.kind == "qk"]
    assert len(qks) == 2
    for qk in qks:
        assert qk.rotary == rotary and qk.kernels == f"rope_{rotary[0]}_mix"
        assert qk.kernel_options == {"rotary_dim": rotary[1]}
        assert qk.with_metric("inv").kernels == f"rope_{rotary[0]}_inv"
        assert qk.num_heads == 2 and qk.head_dim in (4, 8)
        assert not any(n in smap.adaptive for n in qk.param_names)  # Q and K rows wholly in the pair
        vo = smap.group(f"{qk.layer}:vo")
        assert vo.rotary is None and vo.kernels == "gl_mix"


def test_rope_qk_carries_the_qwen2_biases_and_stacks_the_gqa_query_heads():
    model, _, _, smap = build("qwen2")
    named = dict(model.named_parameters())
    qk = smap.group("model.layers.0.self_attn:qk")
    assert (qk.n, qk.m) == (2 * 17, 17)  # 2 query heads of (16 + bias) rows per KV head; K with its bias
    assert "model.layers.0.self_attn.q_proj.bias" in qk.param_names
    G, H = qk.extract(named)
    Wq, bq = named["model.layers.0.self_attn.q_proj.weight"], named["model.layers.0.self_attn.q_proj.bias"]
    assert torch.equal(G[1, :16], Wq[8:12].T) and torch.equal(G[1, 16], bq[8:12])
    assert torch.equal(G[1, 17:33], Wq[12:16].T)


def test_phi3_fused_qkv_is_cut_into_q_k_v():
    model, _, _, smap = build("phi3")
    named = dict(model.named_parameters())
    W = named["model.layers.0.self_attn.qkv_proj.weight"]  # [Q (4 heads × 4) | K (2 × 4) | V (2 × 4)] rows
    qk, vo = smap.group("model.layers.0.self_attn:qk"), smap.group("model.layers.0.self_attn:vo")
    G, H = qk.extract(named)
    assert torch.equal(G[0, :16], W[0:4].T) and torch.equal(G[0, 16:], W[4:8].T)
    assert torch.equal(H[1], W[16 + 4:16 + 8].T)
    Gv, _ = vo.extract(named)
    assert torch.equal(Gv[1], W[24 + 4:24 + 8].T)
    assert "model.layers.0.self_attn.qkv_proj.weight" not in smap.adaptive_masks


def test_gpt_neox_per_head_fused_qkv_is_cut_per_head():
    """GPT-NeoX views query_key_value per head as [q_i | k_i | v_i] (stride 3h): the pieces are strided."""
    model, _, _, smap = build("gpt-neox")
    named = dict(model.named_parameters())
    a = "gpt_neox.layers.0.attention"
    W, b = named[f"{a}.query_key_value.weight"], named[f"{a}.query_key_value.bias"]  # (3 · 2 · 8, 16)
    qk, vo = smap.group(f"{a}:qk"), smap.group(f"{a}:vo")
    assert qk.rotary == ("half", 4) and (qk.num_heads, qk.head_dim, qk.n, qk.m) == (2, 8, 17, 17)
    G, H = qk.extract(named)
    Gv, Ho = vo.extract(named)
    for i in range(2):
        assert torch.equal(G[i, :16], W[24 * i:24 * i + 8].T) and torch.equal(G[i, 16], b[24 * i:24 * i + 8])
        assert torch.equal(H[i, :16], W[24 * i + 8:24 * i + 16].T)
        assert torch.equal(Gv[i, :16], W[24 * i + 16:24 * i + 24].T)
    assert f"{a}.query_key_value.weight" not in smap.adaptive_masks  # covered exactly once, all of it
    back = vo.insert(qk.insert(named, (2 * G, H)), (Gv, Ho))
    assert torch.equal(back[f"{a}.query_key_value.weight"][0:8], 2 * W[0:8])
    assert torch.equal(back[f"{a}.query_key_value.weight"][8:24], W[8:24])


def test_rope_qk_under_gl_h_is_not_a_symmetry_but_the_subgroup_is():
    """The subgroup is needed: a GL(h) element on the rotary Q/K pair changes the logits, an element of the
    RoPE subgroup does not."""
    from geosharp_ref.sampling import orbit_element
    model, make_inputs, out, smap = build("llama")
    qk = smap.group("model.layers.0.self_attn:qk")
    gen = torch.Generator().manual_seed(3)
    kw = make_inputs(gen)
    params = _params(model)
    y0 = _run(model, params, kw, out)
    A_gl = orbit_element(qk.num_heads, qk.head_dim, 1.0, gen, DT)
    assert _rel(_run(model, qk.act(params, A_gl), kw, out), y0) > 1e-4
    A_rope = qk.random_element(params, scale=10.0, seed=1)
    assert _rel(_run(model, qk.act(params, A_rope), kw, out), y0) < TOL


def test_rotary_with_qk_norm_is_refused_as_qk_norm():
    """Qwen3 normalises q and k per head (q_norm, k_norm) before RoPE: no subgroup pair, the reason says QK-norm."""
    T = cases.hf_transformers()
    m = T.Qwen3ForCausalLM(T.Qwen3Config(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                                         attn_implementation="eager"))
    smap = symmetry_map(m)
    why = dict(smap.refused)["model.layers.0.self_attn:qk"]
    assert "q_norm" in why and "normalisation" in why
    assert [g.kind for g in smap.groups] == ["vo"]


def test_unknown_rotary_variants_are_refused_with_the_reason():
    from types import SimpleNamespace

    from geosharp_ref.symmetry.attention.rope import rotary_layout
    model, _, _, _ = build("llama")
    attn = model.model.layers[0].self_attn
    cfg = SimpleNamespace(rope_parameters={"rope_type": "mystery"})
    rotary, why = rotary_layout(attn, [cfg], 4)
    assert rotary is None and "mystery" in why
    cfg = SimpleNamespace(rope_parameters={"rope_type": "yarn", "partial_rotary_factor": 0.5})
    rotary, why = rotary_layout(attn, [cfg], 4)  # Llama's apply_rotary_pos_emb rotates the whole head
    assert rotary is None and "partial_rotary_factor" in why
    assert rotary_layout(attn, [SimpleNamespace(rope_parameters={"rope_type": "yarn"})], 4) == (("half", 4), None)

    class RotaryAttention(torch.nn.Module):  # a family whose pairing is not known
        pass
    rotary, why = rotary_layout(RotaryAttention(), [], 4)
    assert rotary is None and "not understood" in why


def test_rope_breaks_gl_h_so_refusal_is_needed():
    """Declaring the RoPE Q/K pair by hand and acting with GL(h) changes Llama's outputs."""
    torch.manual_seed(0)
    m = cases.llama(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                    attention_bias=False).to(DT).eval()
    a = "model.layers.0.self_attn"
    smap = symmetry_map(m, pairs=[PairSpec(G=f"{a}.q_proj.weight", H=f"{a}.k_proj.weight", num_heads=2,
                                           name=f"{a}/declared")])
    assert [g.key for g in smap.groups] == [f"{a}:vo", f"{a}/declared:qk"]
    gen = torch.Generator().manual_seed(0)
    kw = dict(input_ids=cases.ids(gen), use_cache=False)
    params = _params(m)
    As = _random_A(smap, gen, 0.0)
    y0 = _run(m, params, kw, lambda o: o.logits)
    y_qk = _run(m, smap.act(params, {f"{a}/declared:qk": As[f"{a}/declared:qk"]}), kw, lambda o: o.logits)
    y_vo = _run(m, smap.act(params, {f"{a}:vo": As[f"{a}:vo"]}), kw, lambda o: o.logits)
    assert _rel(y_qk, y0) > 1e-4  # GL(h) on a RoPE Q/K pair is NOT a symmetry
    assert _rel(y_vo, y0) < TOL
