"""Tests for geosharp_ref.symmetry_map: GL(h) pairs of real (tiny, float64) transformer models.

The central property: acting with random per-head A = a·Ã (a log-uniform in [1e-2, 1e2], Ã
orthogonal × diag[0.5, 2]) on every detected group leaves the model's outputs unchanged to 1e-8
relative while changing the parameters; this proves the orientation of every G and H.
"""
from __future__ import annotations

import functools
import logging
import math
import warnings

import pytest
import torch
from hypothesis import given, strategies as st
from torch import nn
from torch.func import functional_call

from geosharp_ref.symmetry_map import PairSpec, SymmetryMap, symmetry_map

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)
transformers.logging.set_verbosity_error()

DT = torch.float64
TOL = 1e-8


# ---------------------------------------------------------------------------------------------
# Tiny models: name -> (model, make_inputs(gen) -> kwargs, outputs(out) -> tensor)
# ---------------------------------------------------------------------------------------------

def _ids(gen, lo=3, hi=50, shape=(2, 7)):
    return torch.randint(lo, hi, shape, generator=gen)


def _text_inputs(gen):
    ids = _ids(gen)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0  # some padding
    return dict(input_ids=ids, attention_mask=mask)


def _pixels(gen):
    return dict(pixel_values=torch.randn(2, 3, 8, 8, generator=gen, dtype=DT))


def _cat(*ts):
    return torch.cat([t.reshape(-1) for t in ts])


class _MHACross(nn.Module):
    """Bare nn.MultiheadAttention, sequence-first, kdim/vdim ≠ embed_dim, add_bias_kv."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, kdim=12, vdim=10, add_bias_kv=True, batch_first=False)

    def forward(self, q, k, v):
        return self.attn(q, k, v, need_weights=False)[0]


class _GQAAttention(nn.Module):
    """A user's own grouped-query attention (no RoPE): 4 query heads share 2 K/V heads."""

    def __init__(self, d=16, num_heads=4, num_key_value_heads=2, head_dim=4):
        super().__init__()
        self.num_heads, self.num_key_value_heads, self.head_dim = num_heads, num_key_value_heads, head_dim
        self.q_proj = nn.Linear(d, num_heads * head_dim)
        self.k_proj = nn.Linear(d, num_key_value_heads * head_dim)
        self.v_proj = nn.Linear(d, num_key_value_heads * head_dim)
        self.o_proj = nn.Linear(num_heads * head_dim, d)

    def forward(self, x):
        B, T, _ = x.shape
        r = self.num_heads // self.num_key_value_heads
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2).repeat_interleave(r, dim=1)
        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2).repeat_interleave(r, dim=1)
        p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.head_dim), dim=-1)
        return self.o_proj((p @ v).transpose(1, 2).reshape(B, T, -1))


class _GQANet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, 16)
        self.blocks = nn.ModuleList([_GQAAttention() for _ in range(2)])
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = x + b(torch.tanh(x))
        return self.head(x)


class _QKNormAttention(nn.Module):
    """Fused qkv projection with LayerNorm on q and k per head (QK-norm): Q/K must be refused."""

    def __init__(self, d=16, num_heads=2):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d // num_heads
        self.qkv = nn.Linear(d, 3 * d)
        self.q_norm = nn.LayerNorm(self.head_dim)
        self.k_norm = nn.LayerNorm(self.head_dim)
        self.o_proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = (t.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
                   for t in self.qkv(x).split(d, dim=-1))
        q, k = self.q_norm(q), self.k_norm(k)
        p = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
        return self.o_proj((p @ v).transpose(1, 2).reshape(B, T, d))


@functools.lru_cache(maxsize=None)
def build(name):
    torch.manual_seed(0)
    T = transformers
    eager = dict(attn_implementation="eager")
    small = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    if name == "bert":
        m = T.BertForSequenceClassification(T.BertConfig(vocab_size=50, max_position_embeddings=32,
                                                         num_labels=3, **small, **eager))
        inputs, out = _text_inputs, lambda o: _cat(o.logits, o.hidden_states[-1])
    elif name == "roberta":
        m = T.RobertaForSequenceClassification(T.RobertaConfig(vocab_size=50, max_position_embeddings=40,
                                                               num_labels=3, **small, **eager))
        inputs, out = _text_inputs, lambda o: _cat(o.logits, o.hidden_states[-1])
    elif name == "vit":
        m = T.ViTForImageClassification(T.ViTConfig(image_size=8, patch_size=4, num_labels=3, **small, **eager))
        inputs, out = _pixels, lambda o: _cat(o.logits, o.hidden_states[-1])
    elif name == "deit":
        m = T.DeiTForImageClassificationWithTeacher(
            T.DeiTConfig(image_size=8, patch_size=4, num_labels=3, **small, **eager))
        inputs, out = _pixels, lambda o: _cat(o.logits, o.hidden_states[-1])
    elif name == "clip":
        cfg = T.CLIPConfig(
            text_config=dict(vocab_size=50, max_position_embeddings=16, bos_token_id=0, eos_token_id=2,
                             pad_token_id=1, **small),
            vision_config=dict(image_size=8, patch_size=4, **small), projection_dim=8, **eager)
        m = T.CLIPModel(cfg)

        def inputs(gen):
            return dict(input_ids=_ids(gen), **_pixels(gen))

        out = lambda o: _cat(o.logits_per_image, o.text_model_output.last_hidden_state,  # noqa: E731
                             o.vision_model_output.last_hidden_state)
    elif name in ("gpt2", "gpt2-cross"):
        cross = name == "gpt2-cross"
        m = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                           bos_token_id=0, eos_token_id=0, add_cross_attention=cross,
                                           **eager))

        def inputs(gen):
            kw = dict(input_ids=_ids(gen), use_cache=False)
            if cross:
                kw["encoder_hidden_states"] = torch.randn(2, 5, 16, generator=gen, dtype=DT)
            return kw

        out = lambda o: _cat(o.logits, o.hidden_states[-1])  # noqa: E731
    elif name == "llama":  # RoPE + grouped-query attention (4 query heads, 2 KV heads) + biases
        m = T.LlamaForCausalLM(T.LlamaConfig(
            vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=4, max_position_embeddings=32, attention_bias=True,
            bos_token_id=0, eos_token_id=2, pad_token_id=1, **eager))
        inputs = lambda gen: dict(input_ids=_ids(gen), use_cache=False)  # noqa: E731
        out = lambda o: _cat(o.logits, o.hidden_states[-1])  # noqa: E731
    elif name in ("mha-batch-first", "mha-seq-first"):
        bf = name == "mha-batch-first"
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=bf)
        m = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        inputs = lambda gen: dict(src=torch.randn(2, 7, 16, generator=gen, dtype=DT))  # noqa: E731
        out = lambda o: o  # noqa: E731
    elif name == "mha-cross":
        m = _MHACross()
        inputs = lambda gen: dict(q=torch.randn(5, 2, 16, generator=gen, dtype=DT),  # noqa: E731
                                  k=torch.randn(7, 2, 12, generator=gen, dtype=DT),
                                  v=torch.randn(7, 2, 10, generator=gen, dtype=DT))
        out = lambda o: o  # noqa: E731
    elif name == "gqa-custom":
        m = _GQANet()
        inputs = lambda gen: dict(x=torch.randn(2, 7, 6, generator=gen, dtype=DT))  # noqa: E731
        out = lambda o: o  # noqa: E731
    elif name == "qknorm-custom":
        m = nn.Sequential(nn.Linear(6, 16), _QKNormAttention(), nn.Tanh(), _QKNormAttention())
        inputs = lambda gen: dict(input=torch.randn(2, 7, 6, generator=gen, dtype=DT))  # noqa: E731
        out = lambda o: o  # noqa: E731
    else:
        raise KeyError(name)
    m = m.to(DT).eval()
    # random (non-zero) biases and layer-norm parameters so that bias rows matter
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() <= 1 or p.shape[0] == 1:
                p.normal_(0.0, 0.3).add_(0.5 if p.dim() == 1 else 0.0)
    return m, inputs, out, symmetry_map(m)


ARCHS = ["bert", "roberta", "vit", "deit", "clip", "gpt2", "gpt2-cross", "llama",
         "mha-batch-first", "mha-seq-first", "mha-cross", "gqa-custom", "qknorm-custom"]

EXPECTED = {  # (number of qk groups, number of vo groups)
    "bert": (2, 2), "roberta": (2, 2), "vit": (2, 2), "deit": (2, 2), "clip": (4, 4), "gpt2": (2, 2),
    "gpt2-cross": (4, 4), "llama": (0, 2), "mha-batch-first": (2, 2), "mha-seq-first": (2, 2),
    "mha-cross": (1, 1), "gqa-custom": (2, 2), "qknorm-custom": (0, 2),
}


def _params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _run(model, params, kwargs, out):
    with torch.no_grad():
        o = functional_call(model, params, args=(), kwargs=dict(kwargs, **_hidden_kw(model)))
    return out(o)


def _hidden_kw(model):
    return {"output_hidden_states": True} if isinstance(model, transformers.PreTrainedModel) else {}


def _random_A(smap: SymmetryMap, gen, log10_a):
    """Per group: a·Q·D, Q random orthogonal, D = diag(U[0.5, 2]), a = 10**log10_a (per group a
    jitter of ×10^U[-0.2, 0.2] so groups differ while staying in [1e-2, 1e2] up to the jitter)."""
    As = {}
    for g in smap.groups:
        h = g.head_dim
        Q, R = torch.linalg.qr(torch.randn(g.num_heads, h, h, generator=gen, dtype=DT))
        Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)
        D = torch.rand(g.num_heads, h, generator=gen, dtype=DT) * 1.5 + 0.5
        jitter = float(torch.empty(()).uniform_(-0.2, 0.2, generator=gen))
        a = 10.0 ** max(-2.0, min(2.0, log10_a + jitter))
        As[g.key] = a * Q * D.unsqueeze(-2)
    return As


def _rel(a, b):
    return float((a - b).norm() / b.norm())


# ---------------------------------------------------------------------------------------------
# Detection
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ARCHS)
def test_detected_groups(name):
    model, _, _, smap = build(name)
    kinds = [g.kind for g in smap.groups]
    assert (kinds.count("qk"), kinds.count("vo")) == EXPECTED[name], str(smap)
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


@pytest.mark.parametrize("name", ["bert", "gpt2", "mha-cross", "gqa-custom", "llama"])
def test_gradient_identity(name):
    """Invariance ⇒ Gᵀ ∇_G L = (∇_H L)ᵀ H per head (DESIGN.md), here through extract/insert."""
    model, make_inputs, out, smap = build(name)
    kwargs = make_inputs(torch.Generator().manual_seed(1))
    params = _params(model)
    blocks = {g.key: tuple(t.requires_grad_() for t in g.extract(params)) for g in smap.groups}
    p = params
    for g in smap.groups:
        p = g.insert(p, *blocks[g.key])
    o = functional_call(model, p, args=(), kwargs=dict(kwargs, **_hidden_kw(model)))
    loss = (out(o) ** 2).sum() * 1e-2
    flat = [t for gh in blocks.values() for t in gh]
    grads = torch.autograd.grad(loss, flat)
    for i, g in enumerate(smap.groups):
        G, H = blocks[g.key]
        dG, dH = grads[2 * i], grads[2 * i + 1]
        lhs, rhs = G.mT @ dG, dH.mT @ H
        assert float((lhs - rhs).detach().norm()) <= 1e-9 * float(lhs.detach().norm()) + 1e-12, g.key


# ---------------------------------------------------------------------------------------------
# extract / insert, coverage
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ARCHS)
def test_extract_insert_roundtrip_and_coverage(name):
    model, _, _, smap = build(name)
    params = _params(model)
    p = params
    for g in smap.groups:
        G, H = g.extract(p)
        q = g.insert(p, G, H)
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
        p = g.insert(p, G, H)
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
    p = g.insert(params, 2 * G, 3 * H)
    loss = sum((t ** 2).sum() for t in p.values())
    loss.backward()
    w = "layers.0.self_attn.in_proj_weight"
    grad = params[w].grad
    # rows of V: d/dW (2W)² = 8W; other rows: 2W
    assert torch.allclose(grad[32:], 8 * snapshot[w][32:]) and torch.allclose(grad[:32], 2 * snapshot[w][:32])
    for k in params:
        assert torch.equal(params[k].detach(), snapshot[k])


# ---------------------------------------------------------------------------------------------
# Refusals, grouped-query attention, user pairs, warnings, table
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
    m = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=32, attn_implementation="eager",
        bos_token_id=0, eos_token_id=2, pad_token_id=1)).to(DT).eval()
    a = "model.layers.0.self_attn"
    smap = symmetry_map(m, pairs=[PairSpec(G=f"{a}.q_proj.weight", H=f"{a}.k_proj.weight", num_heads=2,
                                           name=f"{a}/declared")])
    assert [g.key for g in smap.groups] == [f"{a}:vo", f"{a}/declared:qk"]
    gen = torch.Generator().manual_seed(0)
    kw = dict(input_ids=_ids(gen), use_cache=False)
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


class _RawAttention(nn.Module):
    """Attention written with raw parameters of arbitrary names (nothing to auto-detect)."""

    def __init__(self, d=12, heads=3, h=3, dk=10):
        super().__init__()
        self.heads, self.h = heads, h
        self.wa = nn.Parameter(torch.randn(d, heads * h, dtype=DT) * 0.3)        # query, x @ wa
        self.ba = nn.Parameter(torch.randn(heads * h, dtype=DT) * 0.3)
        self.wb = nn.Parameter(torch.randn(heads * h, dk, dtype=DT) * 0.3)       # key, y @ wbᵀ
        self.bb = nn.Parameter(torch.randn(heads * h, dtype=DT) * 0.3)
        self.wc = nn.Parameter(torch.randn(heads * h, dk, dtype=DT) * 0.3)       # value, y @ wcᵀ
        self.wd = nn.Parameter(torch.randn(heads * h, d, dtype=DT) * 0.3)        # output, o @ wd
        self.bd = nn.Parameter(torch.randn(d, dtype=DT) * 0.3)

    def forward(self, x, y):
        B, T, _ = x.shape
        split = lambda t: t.view(B, t.shape[1], self.heads, self.h).transpose(1, 2)  # noqa: E731
        q, k, v = split(x @ self.wa + self.ba), split(y @ self.wb.T + self.bb), split(y @ self.wc.T)
        o = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        return o.transpose(1, 2).reshape(B, T, -1) @ self.wd + self.bd


RAW_PAIRS = [PairSpec(G="wa", H="wb", num_heads=3, g_bias="ba", h_bias="bb", g_layout="in_out", h_layout="out_in"),
             PairSpec(G="wc", H="wd", num_heads=3, g_layout="out_in", h_layout="in_out", kind="vo")]


def test_no_attention_warns():
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.warns(UserWarning, match="adaptive"):
        smap = symmetry_map(mlp)
    assert smap.groups == [] and smap.adaptive == [k for k, _ in mlp.named_parameters()]
    with pytest.warns(UserWarning, match="no GL"):
        symmetry_map(_RawAttention())


@given(seed=st.integers(0, 2**31 - 1), log10_a=st.floats(-2.0, 2.0))
def test_hand_declared_pairs_invariance(seed, log10_a):
    torch.manual_seed(0)
    m = _RawAttention()
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
    m = _RawAttention()
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
