"""Model builders of the test suite: Hugging Face factories, the model-soups CLIP, ``nn.MultiheadAttention``
models, attention written by hand, an MLP and diagonal linear networks (see :mod:`tests.cases`).

Every factory returns a fresh model per call (float32, random init from torch's global RNG, train mode as
constructed); keyword arguments of the Hugging Face factories override the config.
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

import torch
from torch import nn

from geosharp_ref.io.clip_soups import load_clip_soup, save_clip_soup_like
from geosharp_ref.testing.models import with_lora

#: the repository root
ROOT = Path(__file__).resolve().parents[2]
DT = torch.float64
#: initializer range of the sharpness cases (and the saved models of the command-line tests): large
#: weights, so that attention is far from uniform and the Q/K pairs matter
IR = 0.5
#: two layers of two heads of width 16 (head dimension 8)
SMALL = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
#: the model-soups CLIP classifier of the loader tests (width 64, 2 layers, 2 heads, 32 px, 10 classes)
CLIP_SOUP_SMALL = dict(width=64, layers=2, heads=2, patch=8, resolution=32, embed_dim=16, classes=10)


def hf_transformers():
    """transformers, with its logging at ERROR."""
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _config(initializer_range=None, attn_implementation="eager", **kw):
    """Config keyword arguments: ``initializer_range`` / ``attn_implementation`` only where given."""
    if initializer_range is not None:
        kw["initializer_range"] = initializer_range
    if attn_implementation is not None:
        kw["attn_implementation"] = attn_implementation
    return kw


# ---------------------------------------------------------------------------------------------
# Hugging Face factories
# ---------------------------------------------------------------------------------------------

def bert(initializer_range=None, attn_implementation="eager", **overrides):
    """BertForSequenceClassification: vocabulary 50, 3 labels, :data:`SMALL`."""
    T = hf_transformers()
    kw = dict(vocab_size=50, max_position_embeddings=32, num_labels=3, **SMALL)
    kw.update(overrides)
    return T.BertForSequenceClassification(T.BertConfig(**_config(initializer_range, attn_implementation, **kw)))


#: ``model`` with a peft LoRA adapter on ``targets`` whose lora_B matters (the public test helper; peft must be
#: installed: tests ``pytest.importorskip("peft")`` first)
lora = with_lora


def bert_classifier(seed=0):
    """A wider BERT classifier (MNLI-like: 3 labels; width 32, 4 heads, vocabulary 60), eager, eval mode:
    what the Hugging Face loader and import tests save in both weight formats."""
    torch.manual_seed(seed)
    return bert(vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=64).eval()


def roberta(initializer_range=None, attn_implementation="eager", **overrides):
    T = hf_transformers()
    kw = dict(vocab_size=50, max_position_embeddings=40, num_labels=3, **SMALL)
    kw.update(overrides)
    return T.RobertaForSequenceClassification(T.RobertaConfig(**_config(initializer_range, attn_implementation,
                                                                        **kw)))


def vit(initializer_range=None, attn_implementation="eager", **overrides):
    """ViTForImageClassification: 8×8 images, patches of 4, 3 labels, :data:`SMALL`."""
    T = hf_transformers()
    kw = dict(image_size=8, patch_size=4, num_labels=3, **SMALL)
    kw.update(overrides)
    return T.ViTForImageClassification(T.ViTConfig(**_config(initializer_range, attn_implementation, **kw)))


def deit(initializer_range=None, attn_implementation="eager", **overrides):
    T = hf_transformers()
    kw = dict(image_size=8, patch_size=4, num_labels=3, **SMALL)
    kw.update(overrides)
    return T.DeiTForImageClassificationWithTeacher(T.DeiTConfig(**_config(initializer_range, attn_implementation,
                                                                          **kw)))


def clip(initializer_range=None, attn_implementation="eager"):
    """Hugging Face CLIPModel: text (vocabulary 50, EOS id 2) and vision (8×8, patches of 4) towers of
    :data:`SMALL`, projection 8."""
    T = hf_transformers()
    sub = _config(initializer_range, None, **SMALL)
    cfg = T.CLIPConfig(
        text_config=dict(vocab_size=50, max_position_embeddings=16, bos_token_id=0, eos_token_id=2,
                         pad_token_id=1, **sub),
        vision_config=dict(image_size=8, patch_size=4, **sub), projection_dim=8,
        **_config(None, attn_implementation))
    return T.CLIPModel(cfg)


def gpt2(initializer_range=None, attn_implementation="eager", **overrides):
    """GPT2LMHeadModel: vocabulary 50, 16 positions, width 16, 2 layers, 2 heads."""
    T = hf_transformers()
    kw = dict(vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    kw.update(overrides)
    return T.GPT2LMHeadModel(T.GPT2Config(**_config(initializer_range, attn_implementation, **kw)))


def llama(initializer_range=None, attn_implementation="eager", **overrides):
    """LlamaForCausalLM: RoPE + grouped-query attention (4 query heads, 2 KV heads) + biases, SwiGLU MLP."""
    T = hf_transformers()
    kw = dict(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=4, max_position_embeddings=32, attention_bias=True,
              bos_token_id=0, eos_token_id=2, pad_token_id=1)
    kw.update(overrides)
    return T.LlamaForCausalLM(T.LlamaConfig(**_config(initializer_range, attn_implementation, **kw)))


#: the shape every tiny decoder of the case table shares: 4 query heads over 2 KV heads of dimension 4
_DECODER = dict(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=32, bos_token_id=0, eos_token_id=2, pad_token_id=1)


def _decoder(model_cls, config_cls, initializer_range, attn_implementation, overrides, **extra):
    T = hf_transformers()
    kw = dict(_DECODER, **extra)
    kw.update(overrides)
    return getattr(T, model_cls)(getattr(T, config_cls)(**_config(initializer_range, attn_implementation, **kw)))


def mistral(initializer_range=None, attn_implementation="eager", **overrides):
    """MistralForCausalLM: RoPE (rotate_half), GQA, SwiGLU, no biases."""
    return _decoder("MistralForCausalLM", "MistralConfig", initializer_range, attn_implementation, overrides,
                    head_dim=4, sliding_window=None)


def qwen2(initializer_range=None, attn_implementation="eager", **overrides):
    """Qwen2ForCausalLM: RoPE (rotate_half), GQA, q/k/v biases (o without), SwiGLU."""
    return _decoder("Qwen2ForCausalLM", "Qwen2Config", initializer_range, attn_implementation, overrides)


def gemma(initializer_range=None, attn_implementation="eager", **overrides):
    """GemmaForCausalLM: RoPE (rotate_half), GQA, GeGLU (gelu_pytorch_tanh), RMSNorm with 1 + w, scaled embeddings."""
    return _decoder("GemmaForCausalLM", "GemmaConfig", initializer_range, attn_implementation, overrides, head_dim=4)


def phi3(initializer_range=None, attn_implementation="eager", **overrides):
    """Phi3ForCausalLM: fused qkv_proj, fused gate_up_proj (SwiGLU), partial rotary (factor 0.5: 2 of 4 head
    coordinates rotated, rotate_half over them), GQA."""
    overrides.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.5})
    return _decoder("Phi3ForCausalLM", "Phi3Config", initializer_range, attn_implementation, overrides)


def gpt_neox(initializer_range=None, attn_implementation="eager", **overrides):
    """GPTNeoXForCausalLM (Pythia): per-head interleaved fused query_key_value ([q_i | k_i | v_i], biases),
    partial rotary (rotary_pct 0.5: 4 of 8 head coordinates, rotate_half over them), GELU MLP."""
    T = hf_transformers()
    kw = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
              rotary_pct=0.5, max_position_embeddings=32, attention_bias=True, bos_token_id=0, eos_token_id=2)
    kw.update(overrides)
    return T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**_config(initializer_range, attn_implementation, **kw)))


def gptj(initializer_range=None, attn_implementation="eager", **overrides):
    """GPTJForCausalLM: interleaved RoPE (rotate_every_two) on the first 4 of 8 head coordinates (rotary_dim=4),
    scores computed in float32 by transformers (kept float64 by geosharp_ref.precision), GELU MLP (fc_in/fc_out)."""
    T = hf_transformers()
    kw = dict(vocab_size=50, n_positions=32, n_embd=16, n_layer=2, n_head=2, rotary_dim=4, n_inner=32,
              bos_token_id=0, eos_token_id=2)
    kw.update(overrides)
    return T.GPTJForCausalLM(T.GPTJConfig(**_config(initializer_range, attn_implementation, **kw)))


# ---------------------------------------------------------------------------------------------
# model-soups CLIP (geosharp_ref.io.clip_soups)
# ---------------------------------------------------------------------------------------------

def save_clip_soup(path, seed=1, **dims):
    """Write a random model-soups checkpoint of :data:`CLIP_SOUP_SMALL` (``dims`` override); its state dict."""
    return save_clip_soup_like(path, seed=seed, **{**CLIP_SOUP_SMALL, **dims})


def clip_soup(seed=1, heads=None, **dims):
    """The model-soups CLIP classifier of :func:`save_clip_soup`, loaded as from disk (float32, eval)."""
    dims = {**CLIP_SOUP_SMALL, **dims}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model_0.pt"
        save_clip_soup_like(path, seed=seed, **dims)
        return load_clip_soup(path, heads=dims["heads"] if heads is None else heads)


# ---------------------------------------------------------------------------------------------
# nn.MultiheadAttention models
# ---------------------------------------------------------------------------------------------

def mha_encoder(batch_first=True):
    """nn.TransformerEncoder of two layers (width 16, 2 heads) without a head."""
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=batch_first)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


class MHAClassifier(nn.Module):
    """nn.TransformerEncoder (nn.MultiheadAttention inside) + mean pooling + linear head."""

    def __init__(self, d=16, nhead=2, classes=3):
        super().__init__()
        self.embed = nn.Linear(6, d)
        layer = nn.TransformerEncoderLayer(d, nhead, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x)).mean(1))


class MHACross(nn.Module):
    """Bare nn.MultiheadAttention, sequence-first, kdim/vdim ≠ embed_dim, add_bias_kv."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, kdim=12, vdim=10, add_bias_kv=True, batch_first=False)

    def forward(self, q, k, v):
        return self.attn(q, k, v, need_weights=False)[0]


class TinyAttention(nn.Module):
    """One nn.MultiheadAttention (batch first) + mean pooling + linear head: (B, T, d) → (B, classes)."""

    def __init__(self, d=8, heads=2, classes=3):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        return self.head(self.attn(x, x, x, need_weights=False)[0].mean(1))


class TwoLayers(nn.Module):
    """Two attention layers of equal shapes (one bucket when the space stacks groups) + a head."""

    def __init__(self, d=8, heads=2):
        super().__init__()
        self.a1 = nn.MultiheadAttention(d, heads, batch_first=True)
        self.a2 = nn.MultiheadAttention(d, heads, batch_first=True)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        x = self.a1(x, x, x, need_weights=False)[0]
        return self.head(self.a2(x, x, x, need_weights=False)[0].mean(1))


# ---------------------------------------------------------------------------------------------
# Attention written by hand, and no attention at all
# ---------------------------------------------------------------------------------------------

class GQAAttention(nn.Module):
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


class GQANet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, 16)
        self.blocks = nn.ModuleList([GQAAttention() for _ in range(2)])
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = x + b(torch.tanh(x))
        return self.head(x)


class QKNormAttention(nn.Module):
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


def qknorm_net():
    return nn.Sequential(nn.Linear(6, 16), QKNormAttention(), nn.Tanh(), QKNormAttention())


class RawAttention(nn.Module):
    """Attention written with raw parameters of arbitrary names (nothing to auto-detect), float64."""

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


def mlp(activation=nn.Tanh, d_in=4, hidden=8, d_out=3):
    """A two-layer perceptron: no attention, so no GL(h) pair."""
    return nn.Sequential(nn.Linear(d_in, hidden), activation(), nn.Linear(hidden, d_out))


# ---------------------------------------------------------------------------------------------
# Diagonal linear networks (geosharp_ref.studies.diagnet): f(x) = ⟨u ⊙ v, x⟩
# ---------------------------------------------------------------------------------------------


def mlp64(activation, seed=0):
    """:func:`mlp` 5 → 6 → 3 with ``activation``, seeded, float64, eval mode."""
    torch.manual_seed(seed)
    return mlp(activation=activation, d_in=5, hidden=6, d_out=3).to(torch.float64).eval()

def diagonal_net(d, seed, lo=0.7, hi=1.4):
    """u, v (float64) with random signs and magnitudes in [lo, hi]: every |βᵢ| ≥ lo²."""
    g = torch.Generator().manual_seed(seed)
    mag = lambda: lo + (hi - lo) * torch.rand(d, generator=g, dtype=DT)  # noqa: E731
    sign = lambda: torch.where(torch.rand(d, generator=g) < 0.5, -1.0, 1.0).to(DT)  # noqa: E731
    return mag() * sign(), mag() * sign()


def diagonal_regression(d=12, n=8, seed=0, target_scale=0.3):
    """Regression data (X, y) whose labels are *not* fitted by :func:`diagonal_net` (non-zero residual)."""
    g = torch.Generator().manual_seed(seed + 100)
    X = torch.randn(n, d, generator=g, dtype=DT)
    y = X @ (target_scale * torch.randn(d, generator=g, dtype=DT))
    return X, y
