"""Detection of GL(h) pairs (geosharp_ref.symmetry.detect) in real (tiny, float64) transformer models.

Which groups are found in which architecture, their orientation (G, H written out by hand for BERT and
GPT-2), what is refused and why (RoPE, QK-norm), grouped-query attention per KV head, and pairs declared
by hand. The models are the symmetry cases of tests/cases.py.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, strategies as st
from torch.func import functional_call

from geosharp_ref.symmetry import PairSpec, symmetry_map
from tests import cases
from tests.cases import rel_error as _rel
from tests.cases import (RawAttention, forward as _run, params_of as _params, random_gl as _random_A,
                         symmetry_case as build)

transformers = cases.quiet_transformers()

DT = torch.float64
TOL = 1e-8
ARCHS = cases.SYMMETRY_NAMES


# ---------------------------------------------------------------------------------------------
# Detection
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ARCHS)
def test_detected_groups(name):
    model, _, _, smap = build(name)
    kinds = [g.kind for g in smap.groups]
    assert (kinds.count("qk"), kinds.count("vo")) == cases.CASES["symmetry"][name].groups, str(smap)
    assert len({g.key for g in smap.groups}) == len(smap.groups)
    named = dict(model.named_parameters())
    for g in smap.groups:
        G, H = g.extract(named)
        assert G.shape == (g.num_heads, g.n, g.head_dim) and H.shape == (g.num_heads, g.m, g.head_dim)
        assert set(g.param_names) <= set(named)
    # every output-projection bias stays adaptive, never in a pair
    for g in smap.groups:
        if g.kind == "vo":
            o_weight = g._h.pieces[0].name
            bias = o_weight.rsplit(".", 1)[0] + ".bias"
            if bias in named:
                assert bias in smap.adaptive and bias not in g.param_names


def test_orientation_bert_by_hand():
    """G, H match the formulas of the module docstring (nn.Linear, bias row last)."""
    model, _, _, smap = build("bert")
    named = dict(model.named_parameters())
    p = "bert.encoder.layer.0.attention"
    qk, vo = smap.group(f"{p}.self:qk"), smap.group(f"{p}.self:vo")
    G, H = qk.extract(named)
    Wq, bq = named[f"{p}.self.query.weight"], named[f"{p}.self.query.bias"]
    Wk, bk = named[f"{p}.self.key.weight"], named[f"{p}.self.key.bias"]
    h = 8
    for i in range(2):
        assert torch.equal(G[i], torch.cat([Wq[i * h:(i + 1) * h].T, bq[None, i * h:(i + 1) * h]]))
        assert torch.equal(H[i], torch.cat([Wk[i * h:(i + 1) * h].T, bk[None, i * h:(i + 1) * h]]))
    G, H = vo.extract(named)
    Wv, bv, Wo = named[f"{p}.self.value.weight"], named[f"{p}.self.value.bias"], named[f"{p}.output.dense.weight"]
    for i in range(2):
        assert torch.equal(G[i], torch.cat([Wv[i * h:(i + 1) * h].T, bv[None, i * h:(i + 1) * h]]))
        assert torch.equal(H[i], Wo[:, i * h:(i + 1) * h])
    assert vo.n == 17 and vo.m == 16 and qk.n == qk.m == 17


def test_orientation_gpt2_conv1d_by_hand():
    model, _, _, smap = build("gpt2")
    named = dict(model.named_parameters())
    W, b, Wo = (named[f"transformer.h.1.attn.{n}"] for n in ("c_attn.weight", "c_attn.bias", "c_proj.weight"))
    E, h = 16, 8
    G, H = smap.group("transformer.h.1.attn:qk").extract(named)
    Gv, Ho = smap.group("transformer.h.1.attn:vo").extract(named)
    for i in range(2):
        s = slice(i * h, (i + 1) * h)
        assert torch.equal(G[i], torch.cat([W[:, s], b[None, s]]))
        sk = slice(E + i * h, E + (i + 1) * h)
        assert torch.equal(H[i], torch.cat([W[:, sk], b[None, sk]]))
        sv = slice(2 * E + i * h, 2 * E + (i + 1) * h)
        assert torch.equal(Gv[i], torch.cat([W[:, sv], b[None, sv]]))
        assert torch.equal(Ho[i], Wo[s, :].T)


# ---------------------------------------------------------------------------------------------
# Refusals, grouped-query attention, user pairs, warnings
# ---------------------------------------------------------------------------------------------

def test_rope_qk_refused_vo_kept():
    model, _, _, smap = build("llama")
    refused = dict(smap.refused)
    for i in range(2):
        path = f"model.layers.{i}.self_attn"
        assert "rotary" in refused[f"{path}:qk"] and "GL(h)" in refused[f"{path}:qk"]
        assert f"{path}.q_proj.weight" in smap.adaptive and f"{path}.k_proj.weight" in smap.adaptive
        assert f"{path}.q_proj.bias" in smap.adaptive and f"{path}.k_proj.bias" in smap.adaptive
        vo = smap.group(f"{path}:vo")
        assert vo.kind == "vo"


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


def test_gqa_vo_per_kv_head():
    """Llama GQA: 4 query heads, 2 KV heads → V/O groups have 2 heads and H stacks the W_O column
    blocks of the 2 query heads that read each KV head (m = 2 · d_out)."""
    model, _, _, smap = build("llama")
    named = dict(model.named_parameters())
    vo = smap.group("model.layers.0.self_attn:vo")
    assert (vo.num_heads, vo.head_dim, vo.n, vo.m) == (2, 4, 17, 32)
    G, H = vo.extract(named)
    Wo = named["model.layers.0.self_attn.o_proj.weight"]
    for j in range(2):
        assert torch.equal(H[j], torch.cat([Wo[:, (2 * j + t) * 4:(2 * j + t + 1) * 4] for t in range(2)]))
    # custom GQA without RoPE: Q/K also mapped, G stacks the query heads of each KV head
    _, _, _, smap2 = build("gqa-custom")
    qk = smap2.group("blocks.0:qk")
    assert (qk.num_heads, qk.head_dim, qk.n, qk.m) == (2, 4, 2 * 17, 17)


def test_gqa_per_query_head_action_is_not_a_symmetry():
    """Why GQA groups are per KV head: giving the two query heads sharing a V head different A
    (i.e. acting per query head) changes the output."""
    model, make_inputs, out, smap = build("gqa-custom")
    kw = make_inputs(torch.Generator().manual_seed(0))
    params = _params(model)
    vo = smap.group("blocks.0:vo")
    G, H = vo.extract(params)
    A = torch.eye(4, dtype=DT) * 2.0
    Hq = H.reshape(2, 2, 16, 4).clone()
    Hq[:, 0] = Hq[:, 0] @ torch.linalg.inv(A).T  # only the first query head of each pair
    bad = vo.insert(params, G @ A, Hq.reshape(2, 32, 4))
    assert _rel(_run(model, bad, kw, out), _run(model, params, kw, out)) > 1e-3


def test_qk_norm_refused_and_partial_adaptive():
    _, _, _, smap = build("qknorm-custom")
    refused = dict(smap.refused)
    assert "q_norm" in refused["1:qk"] and "normalisation" in refused["1:qk"]
    assert "1.qkv.weight[0:32, :]" in smap.adaptive and "1.qkv.bias[0:32]" in smap.adaptive
    assert smap.adaptive_masks["1.qkv.weight"][:32].all() and not smap.adaptive_masks["1.qkv.weight"][32:].any()


RAW_PAIRS = [PairSpec(G="wa", H="wb", num_heads=3, g_bias="ba", h_bias="bb", g_layout="in_out", h_layout="out_in"),
             PairSpec(G="wc", H="wd", num_heads=3, g_layout="out_in", h_layout="in_out", kind="vo")]


def test_no_attention_warns():
    mlp = cases.mlp(torch.nn.ReLU, d_out=2)
    with pytest.warns(UserWarning, match="adaptive"):
        smap = symmetry_map(mlp)
    assert smap.groups == [] and smap.adaptive == [k for k, _ in mlp.named_parameters()]
    with pytest.warns(UserWarning, match="no GL"):
        symmetry_map(RawAttention())


@given(seed=st.integers(0, 2**31 - 1), log10_a=st.floats(-2.0, 2.0))
def test_hand_declared_pairs_invariance(seed, log10_a):
    torch.manual_seed(0)
    m = RawAttention()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        smap = symmetry_map(m, pairs=RAW_PAIRS)
    assert [(g.kind, g.num_heads, g.head_dim, g.n, g.m) for g in smap.groups] == \
        [("qk", 3, 3, 13, 11), ("vo", 3, 3, 10, 12)]
    assert smap.adaptive == ["bd"]
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(2, 5, 12, generator=gen, dtype=DT), torch.randn(2, 6, 10, generator=gen, dtype=DT)
    params = _params(m)
    moved = smap.act(params, _random_A(smap, gen, log10_a))
    y0 = functional_call(m, params, (x, y))
    y1 = functional_call(m, moved, (x, y))
    assert _rel(y1, y0) <= TOL
    assert _rel(moved["wa"], params["wa"]) > 1e-3


def test_hand_declared_pairs_validation():
    m = RawAttention()
    with pytest.raises(ValueError) as e:  # wb read with the wrong layout: 10 vs 9 head channels
        symmetry_map(m, pairs=[PairSpec(G="wa", H="wb", num_heads=3, g_layout="in_out", h_layout="in_out")],
                     detect=False)
    msg = str(e.value)
    assert "'wa'" in msg and "(12, 9)" in msg and "'wb'" in msg and "(9, 10)" in msg
    with pytest.raises(ValueError) as e:
        symmetry_map(m, pairs=[PairSpec(G="wa", H="wb", num_heads=3, g_layout="in_out", g_bias="bd")],
                     detect=False)
    assert "'bd'" in str(e.value) and "(12,)" in str(e.value) and "(9,)" in str(e.value)
    with pytest.raises(ValueError, match="no parameter 'nope'"):
        symmetry_map(m, pairs=[PairSpec(G="nope", H="wb", num_heads=3)], detect=False)
    with pytest.raises(ValueError, match="not divisible"):
        symmetry_map(m, pairs=[PairSpec(G="wa", H="wb", num_heads=5, g_layout="in_out")], detect=False)


def test_user_pair_supersedes_detected():
    model = build("mha-cross")[0]
    a = "attn"
    smap = symmetry_map(model, pairs=[PairSpec(G=f"{a}.v_proj_weight", H=f"{a}.out_proj.weight",
                                               num_heads=2, kind="vo", name="mine")])
    assert "attn:vo" in dict(smap.refused) and [g.key for g in smap.groups] == ["attn:qk", "mine:vo"]
    assert "attn.bias_v" in smap.adaptive  # no longer covered by the detected V/O group
    counts = smap.coverage_counts()
    assert all(bool((c == 1).all()) for c in counts.values())
