"""Detection of GL(h) pairs (geosharp_ref.symmetry.attention.detect) in real (tiny, float64) transformer models.

Which groups are found in which architecture, their orientation (G, H written out by hand for BERT and
GPT-2), what is refused and why (QK-norm; rotary Q/K pairs are in test_attention_rope.py), grouped-query attention per KV head, and pairs declared
by hand, and peft LoRA-adapted projections (adapter factors in the pairs, invariance of the logits and of
geodesic sharpness, DoRA refused). The models are the symmetry cases of tests/cases/tables.py
(SYMMETRY_CASES).
"""
from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, strategies as st
from torch.func import functional_call

from geosharp_ref.symmetry import PairSpec, symmetry_map
from geosharp_ref.sampling import draw_orbit_elements
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
# Grouped-query attention, refusals, user pairs, warnings
# ---------------------------------------------------------------------------------------------

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
    bad = vo.insert(params, (G @ A, Hq.reshape(2, 32, 4)))
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


# ---------------------------------------------------------------------------------------------
# peft LoRA-adapted projections: the pair acts on W0's head rows and lora_B's head rows (Q, K, V), or
# on W0's and lora_A's head columns (O); DoRA and peft's wrapped nn.MultiheadAttention are refused
# ---------------------------------------------------------------------------------------------

LORA_TARGETS = {"qv": ["query", "value"], "qkvo": ["query", "key", "value", "dense"]}
LORA_TOL = 1e-10
_PFX = "base_model.model."


def _lora_batch():
    return ({"input_ids": torch.randint(3, 50, (4, 7), generator=torch.Generator().manual_seed(1))},
            torch.tensor([0, 1, 2, 1]))


def _with_lora(model, adapters=(("default", dict(r=2, lora_alpha=4)),), targets=("query", "value")):
    """``model`` with peft LoRA adapters (the first one as ``get_peft_model``, the others added and all
    set active), lora_B made non-zero (N(0, 0.5), as after training) and every bias N(0, 0.1) (so that
    the bias rows matter), float64, eval."""
    peft = pytest.importorskip("peft")
    (name, cfg), *more = adapters
    m = peft.get_peft_model(model, peft.LoraConfig(target_modules=list(targets), **cfg), adapter_name=name)
    for n2, cfg2 in more:
        m.add_adapter(n2, peft.LoraConfig(target_modules=list(cfg2.pop("targets", targets)), **cfg2))
    if more:
        m.base_model.set_adapter([name] + [n2 for n2, _ in more])
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.5)
            elif n.endswith("bias"):
                p.normal_(0.0, 0.1)
    return m.to(DT).eval()


def _lora_bert(targets, **cfg):
    torch.manual_seed(0)
    return _with_lora(cases.bert(initializer_range=cases.IR),
                      (("default", dict(r=2, lora_alpha=4, **cfg)),), LORA_TARGETS[targets])


def _logits(model, params, batch):
    with torch.no_grad():
        return functional_call(model, params, args=(), kwargs=batch[0]).logits


def _attention_adapters(model):
    """(projection path, role, lora_A weight, lora_B weight) of every adapted attention projection."""
    out = []
    for n, _ in model.named_parameters():
        if ".attention." in n and n.endswith(".lora_A.default.weight"):
            path = n[:-len(".lora_A.default.weight")]
            role = "o" if path.endswith("attention.output.dense") else path.rsplit(".", 1)[1]
            out.append((path, role, n, f"{path}.lora_B.default.weight"))
    return out


@pytest.mark.parametrize("targets", sorted(LORA_TARGETS))
def test_lora_groups_cover_the_adapters(targets):
    """As many groups as without adapters; each adapted Q/K/V holds its lora_B (head rows) and the adapted
    O its lora_A (head columns) in exactly one group, the other factor (and the MLP adapters) adaptive."""
    model = _lora_bert(targets)
    smap = symmetry_map(model)
    plain = build("bert")[3]
    assert sorted(g.key[len(_PFX):] for g in smap.groups) == sorted(g.key for g in plain.groups), str(smap)
    assert not smap.refused
    owners = {}
    for g in smap.groups:
        for n in g.param_names:
            owners.setdefault(n, []).append(g.key)
    found = _attention_adapters(model)
    assert {r for _, r, _, _ in found} == ({"query", "value"} if targets == "qv" else {"query", "key", "value", "o"})
    for path, role, a, b in found:
        held, free = (a, b) if role == "o" else (b, a)
        kind = "qk" if role in ("query", "key") else "vo"
        assert owners.get(held) == [f"{path.split('.attention.')[0]}.attention.self:{kind}"], (held, owners.get(held))
        assert free not in owners and free in smap.adaptive
    other = [n for n, _ in model.named_parameters() if "lora_" in n and ".attention." not in n]  # MLP, pooler
    assert len(other) == (0 if targets == "qv" else 2 * 2 * 2 + 2) and not set(other) & set(owners)
    counts = smap.coverage_counts()
    assert all(bool((c == 1).all()) for c in counts.values())
    # (d + 1 + r) rows of G into every adapted head, (d_out + r) rows of H out of an adapted O
    qk, vo = smap.group(f"{_PFX}bert.encoder.layer.0.attention.self:qk"), \
        smap.group(f"{_PFX}bert.encoder.layer.0.attention.self:vo")
    assert (qk.n, qk.m, vo.n, vo.m) == ((19, 17, 19, 16) if targets == "qv" else (19, 19, 19, 18))


@pytest.mark.parametrize("targets", sorted(LORA_TARGETS))
@pytest.mark.parametrize("scale", [1e-2, 1e2])
def test_lora_action_leaves_logits_and_moves_the_effective_weights(targets, scale):
    model = _lora_bert(targets)
    smap = symmetry_map(model)
    batch = _lora_batch()
    params = _params(model)
    As = draw_orbit_elements(smap, scale, torch.Generator().manual_seed(7))
    moved = smap.act(params, As)
    y0 = _logits(model, params, batch)
    assert _rel(_logits(model, moved, batch), y0) <= LORA_TOL
    covered = {n for g in smap.groups for n in g.param_names}
    for n, p in params.items():
        if n in covered:
            assert _rel(moved[n], p) > 1e-3, n
        else:
            assert torch.equal(moved[n], p), n  # the un-acted adapter factors, MLP adapters, the rest
    # independent check on the effective weights W = W0 + s B A (modules' own scaling s)
    A = dict(zip((g.key for g in smap.groups), As))
    layer = f"{_PFX}bert.encoder.layer.1.attention"
    sub = dict(model.named_modules())
    h = 8

    def effective(p, path):
        s = sub[path].scaling["default"]
        return p[f"{path}.base_layer.weight"] + s * p[f"{path}.lora_B.default.weight"] @ p[f"{path}.lora_A.default.weight"]

    q = f"{layer}.self.query"
    assert sub[q].scaling["default"] == 2.0
    W0, W1 = effective(params, q), effective(moved, q)
    for i in range(2):
        M = A[f"{layer}.self:qk"][i]
        rows = slice(i * h, (i + 1) * h)
        assert _rel(W1[rows], M.T @ W0[rows]) <= LORA_TOL
        assert _rel(moved[f"{q}.base_layer.bias"][rows], M.T @ params[f"{q}.base_layer.bias"][rows]) <= LORA_TOL
    if targets == "qkvo":
        o = f"{layer}.output.dense"
        W0, W1 = effective(params, o), effective(moved, o)
        for i in range(2):
            cols = slice(i * h, (i + 1) * h)
            Minv = torch.linalg.inv(A[f"{layer}.self:vo"][i])
            assert _rel(W1[:, cols], W0[:, cols] @ Minv.T) <= LORA_TOL


def _gpt2_lora():
    torch.manual_seed(0)
    return _with_lora(cases.gpt2(initializer_range=cases.IR), (("default", dict(r=2, lora_alpha=4, fan_in_fan_out=True)),),
                      ("c_attn", "c_proj"))


def _bert_lora_two_adapters():
    torch.manual_seed(0)
    return _with_lora(cases.bert(initializer_range=cases.IR),
                      (("default", dict(r=2, lora_alpha=4)),
                       ("other", dict(r=3, lora_alpha=3, targets=("query", "key", "dense")))),
                      ("query", "value", "dense"))


LORA_LAYOUTS = {
    "bert-lora-bias": lambda: _lora_bert("qkvo", lora_bias=True),
    "bert-two-adapters": _bert_lora_two_adapters,
    "gpt2-conv1d-fused": _gpt2_lora,
}


@pytest.mark.parametrize("name", sorted(LORA_LAYOUTS))
def test_lora_layouts_are_a_symmetry(name):
    """lora_B's bias (one more row of G), several active adapters of different ranks (all covered), and
    GPT-2's fused Conv1D c_attn / c_proj (adapters in (out, in) layout on a (in, out) base weight)."""
    model = LORA_LAYOUTS[name]()
    smap = symmetry_map(model)
    assert len(smap.groups) == 4 and not smap.refused, str(smap)
    lora = [n for n, _ in model.named_parameters() if "lora_" in n]
    covered = {n for g in smap.groups for n in g.param_names}
    expect = {"bert-lora-bias": 2 * (4 + 3), "bert-two-adapters": 12, "gpt2-conv1d-fused": 4}[name]
    assert len(covered & set(lora)) == expect, sorted(covered & set(lora))
    assert all(bool((c == 1).all()) for c in smap.coverage_counts().values())
    batch = _lora_batch()
    params = _params(model)
    y0 = _logits(model, params, batch)
    for scale in (1e-2, 1e2):
        moved = smap.act(params, draw_orbit_elements(smap, scale, torch.Generator().manual_seed(3)))
        assert _rel(_logits(model, moved, batch), y0) <= LORA_TOL


def test_geodesic_sharpness_of_a_lora_model_is_invariant():
    from geosharp_ref.sharpness.measures import adaptive_sharpness, geodesic_sharpness
    from geosharp_ref.verification.orbits import model_with_params

    model = _lora_bert("qkvo")
    batch = _lora_batch()
    smap = symmetry_map(model)
    moved = model_with_params(model, smap.act(_params(model), draw_orbit_elements(
        smap, 1e2, torch.Generator().manual_seed(5))))
    g0 = geodesic_sharpness(model, [batch], 0.05, metric="mix", n_iter=4).mean
    g1 = geodesic_sharpness(moved, [batch], 0.05, metric="mix", n_iter=4).mean
    assert g0 > 0 and abs(g1 - g0) <= 1e-8 * abs(g0), (g0, g1)
    a0 = adaptive_sharpness(model, [batch], 0.05, n_iter=4).mean
    a1 = adaptive_sharpness(moved, [batch], 0.05, n_iter=4).mean
    assert abs(a1 - a0) > 1e-3 * abs(a0), (a0, a1)


def test_dora_is_refused_and_breaks_the_action():
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    try:
        model = _with_lora(cases.bert(initializer_range=cases.IR),
                           (("default", dict(r=2, lora_alpha=4, use_dora=True)),), ("query", "value"))
    except (ValueError, TypeError) as e:  # pragma: no cover - depends on the peft version
        pytest.skip(f"peft {peft.__version__} has no DoRA on nn.Linear: {e}")
    with pytest.warns(UserWarning, match="no GL"):
        smap = symmetry_map(model)
    refused = dict(smap.refused)
    for i in range(2):
        for kind in ("qk", "vo"):
            why = refused[f"{_PFX}bert.encoder.layer.{i}.attention.self:{kind}"]
            assert "DoRA" in why and "lora_magnitude_vector" in why and "adaptive" in why
    assert all(n in smap.adaptive for n, _ in model.named_parameters())
    # why: the LoRA pairs (same parameter names) acting on the DoRA model change its logits
    torch.manual_seed(0)
    pairs = symmetry_map(_with_lora(cases.bert(initializer_range=cases.IR), (("default", dict(r=2, lora_alpha=4)),),
                                    ("query", "value")))
    params, batch = _params(model), _lora_batch()
    moved = pairs.act(params, draw_orbit_elements(pairs, 1.0, torch.Generator().manual_seed(0)))
    assert _rel(_logits(model, moved, batch), _logits(model, params, batch)) > 1e-4


def test_peft_wrapped_multihead_attention_is_refused():
    """peft's LoRA for nn.MultiheadAttention merges adapters into the fused in_proj / out_proj weights at
    forward time: not a layout mapped here, so both pairs are refused (detection used to crash on it)."""
    torch.manual_seed(0)
    model = _with_lora(cases.TinyAttention(), targets=("attn",))
    with pytest.warns(UserWarning, match="no GL"):
        smap = symmetry_map(model)
    refused = dict(smap.refused)
    for kind in ("qk", "vo"):
        assert "adapter layer" in refused[f"{_PFX}attn.base_layer:{kind}"]
    assert all(n in smap.adaptive for n, _ in model.named_parameters())


def test_no_attention_warning_is_a_named_class_with_the_old_message():
    """The filters elsewhere match the message ("symmetry_map: no GL"); the class is what new code filters on."""
    from geosharp_ref.symmetry import NoAttentionPairsWarning
    assert issubclass(NoAttentionPairsWarning, UserWarning)
    with pytest.warns(NoAttentionPairsWarning, match=r"symmetry_map: no GL\(h\) attention pair recognised") as record:
        symmetry_map(cases.mlp(torch.nn.ReLU, d_out=2))
    assert str(record[0].message).startswith("symmetry_map: no GL(h) attention pair recognised in Sequential")
