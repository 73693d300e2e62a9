"""The tiny models of the test suite, in one place (in the style of curvlinops' ``test/cases.py``).

Every test that needs a small model builds it here, and what several test modules share lives here or in
a conftest.py fixture: no test module imports another one.

* **factories** — a fresh model per call (float32, random init from torch's global RNG, train mode as
  constructed): :func:`bert`, :func:`roberta`, :func:`vit`, :func:`deit`, :func:`clip` (Hugging Face
  ``CLIPModel``), :func:`gpt2`, :func:`llama`; the model-soups CLIP re-implementation of
  :mod:`geosharp_ref.io.clip_soups` (:func:`clip_soup`, :func:`save_clip_soup`); ``nn.MultiheadAttention``
  models (:func:`mha_encoder`, :class:`MHAClassifier`, :class:`MHACross`, :class:`TinyAttention`,
  :class:`TwoLayers`); attention written by hand (:class:`GQANet`, :func:`qknorm_net`,
  :class:`RawAttention`); :func:`mlp` (no attention); diagonal linear networks (:func:`diagonal_net`,
  :func:`diagonal_regression`). Keyword arguments of the Hugging Face factories override the config.
* **case tables** — :data:`SYMMETRY_CASES` (detection and outputs along orbits: keyword inputs of two
  examples, outputs with the last hidden state) and :data:`SHARPNESS_CASES` (a loss: batches of three
  examples with targets, initializer range 0.5 so attention is far from uniform). :func:`build` turns a
  case into ``(float64 model, its symmetry map)``, cached per case; :func:`symmetry_case` and
  :func:`sharpness_case` hand it out as the test modules use it.
* **shared helpers** — inputs (:func:`text_inputs`, :func:`pixels`, :func:`clip_images`,
  :func:`bert_inputs`), orbit elements (:func:`random_gl`), a legacy-format saved directory
  (:func:`save_bin`), the settings and file helpers of a tiny vision population (``POPULATION_*``,
  :func:`copy_population`, :func:`jsonl`, :func:`subprocess_env`), and an exact trust-region solver
  (:func:`trust_region_max`) used as an independent reference.
"""
from __future__ import annotations

import functools
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import brentq
from torch import nn
from torch.func import functional_call

from geosharp_ref.io.clip_soups import load_clip_soup, save_clip_soup_like
from geosharp_ref.symmetry import symmetry_map

#: the repository root
ROOT = Path(__file__).resolve().parents[1]
DT = torch.float64
#: initializer range of the sharpness cases (and the saved models of the command-line tests): large
#: weights, so that attention is far from uniform and the Q/K pairs matter
IR = 0.5
#: two layers of two heads of width 16 (head dimension 8)
SMALL = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
#: the model-soups CLIP classifier of the loader tests (width 64, 2 layers, 2 heads, 32 px, 10 classes)
CLIP_SOUP_SMALL = dict(width=64, layers=2, heads=2, patch=8, resolution=32, embed_dim=16, classes=10)


def _transformers():
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
    T = _transformers()
    kw = dict(vocab_size=50, max_position_embeddings=32, num_labels=3, **SMALL)
    kw.update(overrides)
    return T.BertForSequenceClassification(T.BertConfig(**_config(initializer_range, attn_implementation, **kw)))


def lora(model, targets=("query", "value"), r=2, seed=0):
    """``model`` with a peft LoRA adapter (rank r, alpha 2r) on the modules named ``targets``, lora_B drawn
    N(0, 0.5) (peft starts it at 0; after training it is not) under ``seed``. Returns the PeftModel
    (float32, eval); peft must be installed (tests ``pytest.importorskip("peft")`` first)."""
    import peft

    m = peft.get_peft_model(model, peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(targets)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return m.eval()


def bert_classifier(seed=0):
    """A wider BERT classifier (MNLI-like: 3 labels; width 32, 4 heads, vocabulary 60), eager, eval mode:
    what the Hugging Face loader and import tests save in both weight formats."""
    torch.manual_seed(seed)
    return bert(vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=64).eval()


def roberta(initializer_range=None, attn_implementation="eager", **overrides):
    T = _transformers()
    kw = dict(vocab_size=50, max_position_embeddings=40, num_labels=3, **SMALL)
    kw.update(overrides)
    return T.RobertaForSequenceClassification(T.RobertaConfig(**_config(initializer_range, attn_implementation,
                                                                        **kw)))


def vit(initializer_range=None, attn_implementation="eager", **overrides):
    """ViTForImageClassification: 8×8 images, patches of 4, 3 labels, :data:`SMALL`."""
    T = _transformers()
    kw = dict(image_size=8, patch_size=4, num_labels=3, **SMALL)
    kw.update(overrides)
    return T.ViTForImageClassification(T.ViTConfig(**_config(initializer_range, attn_implementation, **kw)))


def deit(initializer_range=None, attn_implementation="eager", **overrides):
    T = _transformers()
    kw = dict(image_size=8, patch_size=4, num_labels=3, **SMALL)
    kw.update(overrides)
    return T.DeiTForImageClassificationWithTeacher(T.DeiTConfig(**_config(initializer_range, attn_implementation,
                                                                          **kw)))


def clip(initializer_range=None, attn_implementation="eager"):
    """Hugging Face CLIPModel: text (vocabulary 50, EOS id 2) and vision (8×8, patches of 4) towers of
    :data:`SMALL`, projection 8."""
    T = _transformers()
    sub = _config(initializer_range, None, **SMALL)
    cfg = T.CLIPConfig(
        text_config=dict(vocab_size=50, max_position_embeddings=16, bos_token_id=0, eos_token_id=2,
                         pad_token_id=1, **sub),
        vision_config=dict(image_size=8, patch_size=4, **sub), projection_dim=8,
        **_config(None, attn_implementation))
    return T.CLIPModel(cfg)


def gpt2(initializer_range=None, attn_implementation="eager", **overrides):
    """GPT2LMHeadModel: vocabulary 50, 16 positions, width 16, 2 layers, 2 heads."""
    T = _transformers()
    kw = dict(vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    kw.update(overrides)
    return T.GPT2LMHeadModel(T.GPT2Config(**_config(initializer_range, attn_implementation, **kw)))


def llama(attn_implementation="eager", **overrides):
    """LlamaForCausalLM: RoPE + grouped-query attention (4 query heads, 2 KV heads) + biases."""
    T = _transformers()
    kw = dict(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=4, max_position_embeddings=32, attention_bias=True,
              bos_token_id=0, eos_token_id=2, pad_token_id=1)
    kw.update(overrides)
    return T.LlamaForCausalLM(T.LlamaConfig(**_config(None, attn_implementation, **kw)))


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


def clip_images(n=4, res=32, seed=0):
    """Preprocessed images for :func:`clip_soup` (``pixel_values``)."""
    return torch.randn(n, 3, res, res, generator=torch.Generator().manual_seed(seed))


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


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

def ids(gen, b=2, t=7, lo=3, hi=50):
    return torch.randint(lo, hi, (b, t), generator=gen)


def text_inputs(gen, b=2, t=7):
    """``input_ids`` and an attention mask with the last two positions of example 1 padded."""
    x = ids(gen, b, t)
    mask = torch.ones_like(x)
    mask[1, -2:] = 0
    return dict(input_ids=x, attention_mask=mask)


def pixels(gen, b=2, size=8):
    return dict(pixel_values=torch.randn(b, 3, size, size, generator=gen, dtype=DT))


def bert_inputs(seed=0):
    """Inputs for :func:`bert_classifier` (three examples of 9 tokens, example 1 padded)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(3, 60, (3, 9), generator=gen)
    mask = torch.ones_like(x)
    mask[1, -3:] = 0
    return dict(input_ids=x, attention_mask=mask)


def cat(*ts):
    return torch.cat([t.reshape(-1) for t in ts])


def lm_loss(logits, targets):
    """Next-token cross-entropy: logits (B, T, V) for inputs ids, targets = ids[:, 1:]."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1))


def clip_loss(out, targets):
    """Cross-entropy on CLIPModel's image→text logits (the loss receives the CLIPOutput itself)."""
    return F.cross_entropy(out.logits_per_image, targets)


# ---------------------------------------------------------------------------------------------
# Case tables
# ---------------------------------------------------------------------------------------------

def _identity(o):
    return o


def _logits(o):
    return o.logits


def _logits_and_hidden(o):
    return cat(o.logits, o.hidden_states[-1])


@dataclass(frozen=True)
class Case:
    """A tiny model with its data.

    ``model()`` builds it (float32, from torch's global RNG); ``groups`` is the expected number of
    (Q/K, V/O) GL(h) groups; ``output`` maps the model's output to the tensor compared along orbits.
    Symmetry cases give ``inputs(gen)`` (keyword arguments of one forward); sharpness cases give
    ``batch(gen)`` ((inputs, targets) for ``loss_fn``)."""

    name: str
    model: Callable[[], nn.Module]
    groups: tuple
    output: Callable[[Any], torch.Tensor] = _identity
    inputs: Optional[Callable[[torch.Generator], dict]] = None
    batch: Optional[Callable[[torch.Generator], tuple]] = None
    loss_fn: Callable = F.cross_entropy
    init_weights: Optional[float] = None  # std of a fresh normal init of every matrix (models without a config)


def _gpt2_inputs(cross):
    def inputs(gen):
        kw = dict(input_ids=ids(gen), use_cache=False)
        if cross:
            kw["encoder_hidden_states"] = torch.randn(2, 5, 16, generator=gen, dtype=DT)
        return kw
    return inputs


def _clip_inputs(gen):
    return dict(input_ids=ids(gen), **pixels(gen))


def _clip_outputs(o):
    return cat(o.logits_per_image, o.text_model_output.last_hidden_state, o.vision_model_output.last_hidden_state)


def _soup_inputs(gen):
    return dict(pixel_values=torch.randn(2, 3, 32, 32, generator=gen, dtype=DT))


#: symmetry detection and the action on outputs (default initializer range; outputs with hidden states)
SYMMETRY_CASES = [
    Case("bert", bert, (2, 2), _logits_and_hidden, inputs=text_inputs),
    Case("roberta", roberta, (2, 2), _logits_and_hidden, inputs=text_inputs),
    Case("vit", vit, (2, 2), _logits_and_hidden, inputs=pixels),
    Case("deit", deit, (2, 2), _logits_and_hidden, inputs=pixels),
    Case("clip", clip, (4, 4), _clip_outputs, inputs=_clip_inputs),
    Case("gpt2", gpt2, (2, 2), _logits_and_hidden, inputs=_gpt2_inputs(False)),
    Case("gpt2-cross", functools.partial(gpt2, add_cross_attention=True), (4, 4), _logits_and_hidden,
         inputs=_gpt2_inputs(True)),
    Case("llama", llama, (0, 2), _logits_and_hidden,
         inputs=lambda gen: dict(input_ids=ids(gen), use_cache=False)),
    Case("mha-batch-first", functools.partial(mha_encoder, batch_first=True), (2, 2),
         inputs=lambda gen: dict(src=torch.randn(2, 7, 16, generator=gen, dtype=DT))),
    Case("mha-seq-first", functools.partial(mha_encoder, batch_first=False), (2, 2),
         inputs=lambda gen: dict(src=torch.randn(2, 7, 16, generator=gen, dtype=DT))),
    Case("mha-cross", MHACross, (1, 1),
         inputs=lambda gen: dict(q=torch.randn(5, 2, 16, generator=gen, dtype=DT),
                                 k=torch.randn(7, 2, 12, generator=gen, dtype=DT),
                                 v=torch.randn(7, 2, 10, generator=gen, dtype=DT))),
    Case("gqa-custom", GQANet, (2, 2), inputs=lambda gen: dict(x=torch.randn(2, 7, 6, generator=gen, dtype=DT))),
    Case("qknorm-custom", qknorm_net, (0, 2),
         inputs=lambda gen: dict(input=torch.randn(2, 7, 6, generator=gen, dtype=DT))),
    Case("clip-soup", clip_soup, (2, 2), inputs=_soup_inputs),
]


def _text_batch(gen):
    x = ids(gen, 3)
    mask = torch.ones_like(x)
    mask[1, -2:] = 0  # padding
    return dict(input_ids=x, attention_mask=mask), torch.randint(0, 3, (3,), generator=gen)


def _vit_batch(gen):
    return (dict(pixel_values=torch.randn(3, 3, 8, 8, generator=gen, dtype=DT)),
            torch.randint(0, 3, (3,), generator=gen))


def _clip_batch(gen):
    x = ids(gen, 3)
    x[:, -1] = 2  # EOS: pooled text position
    return dict(input_ids=x, pixel_values=torch.randn(3, 3, 8, 8, generator=gen, dtype=DT)), torch.arange(3)


def _gpt2_batch(gen):
    x = ids(gen, 3)
    return dict(input_ids=x, use_cache=False), x[:, 1:]


def _mha_batch(gen):
    return torch.randn(3, 5, 6, generator=gen, dtype=DT), torch.randint(0, 3, (3,), generator=gen)


def _soup_batch(gen):
    return (dict(pixel_values=torch.randn(3, 3, 32, 32, generator=gen, dtype=DT)),
            torch.randint(0, CLIP_SOUP_SMALL["classes"], (3,), generator=gen))


#: whole-model sharpness (initializer range :data:`IR`; a loss on batches of three)
SHARPNESS_CASES = [
    Case("bert", functools.partial(bert, initializer_range=IR), (2, 2), _logits, batch=_text_batch),
    Case("vit", functools.partial(vit, initializer_range=IR), (2, 2), _logits, batch=_vit_batch),
    Case("clip", functools.partial(clip, initializer_range=IR), (4, 4), lambda o: o.logits_per_image,
         batch=_clip_batch, loss_fn=clip_loss),
    Case("gpt2", functools.partial(gpt2, initializer_range=IR), (2, 2), _logits, batch=_gpt2_batch, loss_fn=lm_loss),
    Case("mha", MHAClassifier, (2, 2), batch=_mha_batch, init_weights=IR),
    Case("clip-soup", clip_soup, (2, 2), batch=_soup_batch),
]

CASES = {"symmetry": {c.name: c for c in SYMMETRY_CASES}, "sharpness": {c.name: c for c in SHARPNESS_CASES}}
SYMMETRY_NAMES = [c.name for c in SYMMETRY_CASES]
SHARPNESS_NAMES = [c.name for c in SHARPNESS_CASES]


def randomize_vectors(model):
    """Random non-zero biases and norm parameters (every 1-D parameter, and (1, d) ones), so that the
    bias rows of G, H and the adaptive parts matter."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() <= 1 or p.shape[0] == 1:
                p.normal_(0.0, 0.3).add_(0.5 if p.dim() == 1 else 0.0)
    return model


def make(case: Case) -> nn.Module:
    """A fresh float64 model of the case in eval mode (seed 0, random vectors)."""
    torch.manual_seed(0)
    m = case.model()
    if case.init_weights is not None:
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, case.init_weights)
    return randomize_vectors(m.to(DT).eval())


@functools.lru_cache(maxsize=None)
def build(table: str, name: str):
    """``(model, symmetry map)`` of case ``name`` of ``table`` ("symmetry" or "sharpness"), cached: tests
    must not modify the model (deep-copy it first)."""
    m = make(CASES[table][name])
    return m, symmetry_map(m)


# ---------------------------------------------------------------------------------------------
# Built cases as the test modules use them
# ---------------------------------------------------------------------------------------------

def symmetry_case(name):
    """``(model, inputs(gen) -> kwargs, output(o) -> tensor, symmetry map)`` of a symmetry case (cached model)."""
    model, smap = build("symmetry", name)
    case = CASES["symmetry"][name]
    return model, case.inputs, case.output, smap


@dataclass(frozen=True)
class SharpnessModel:
    """A built sharpness case: ``model`` (float64, eval; cached, do not modify), ``make_batch(gen)`` →
    (inputs, targets), ``loss_fn``, ``output(o)`` → tensor, ``smap``."""

    model: nn.Module
    make_batch: Callable
    loss_fn: Callable
    output: Callable
    smap: Any


def sharpness_case(name) -> SharpnessModel:
    model, smap = build("sharpness", name)
    case = CASES["sharpness"][name]
    return SharpnessModel(model, case.batch, case.loss_fn, case.output, smap)


def params_of(model):
    """A detached copy of the model's parameters, by name."""
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def hidden_kw(model):
    """``output_hidden_states=True`` for Hugging Face models (their outputs then carry hidden states)."""
    T = _transformers()
    return {"output_hidden_states": True} if isinstance(model, T.PreTrainedModel) else {}


def forward(model, params, kwargs, out):
    """``out`` of the model's output at ``params`` (functional call, no gradient)."""
    with torch.no_grad():
        o = functional_call(model, params, args=(), kwargs=dict(kwargs, **hidden_kw(model)))
    return out(o)


def random_gl(smap, gen, log10_a):
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


# ---------------------------------------------------------------------------------------------
# Saved directories
# ---------------------------------------------------------------------------------------------

def save_bin(model, d: Path, state=None):
    """A Hugging Face directory with a legacy ``pytorch_model.bin`` (``state`` replaces the weights)."""
    d.mkdir(parents=True)
    model.config.save_pretrained(d)
    torch.save(model.state_dict() if state is None else state, d / "pytorch_model.bin")


# ---------------------------------------------------------------------------------------------
# A tiny vision population (geosharp_ref.studies.population: tiny ViTs on sklearn digits)
# ---------------------------------------------------------------------------------------------

POPULATION_MODELS = 4
#: training settings small enough for CI
POPULATION_TRAIN = dict(n_models=POPULATION_MODELS, epochs_max=2, train_size_max=160, workers=1, progress=False)
#: evaluation settings small enough for CI; a ρ sweep of two values
POPULATION_EVAL = dict(rhos=(0.01, 0.05), n_batches=2, batch_size=16, n_iter=3, progress=False)
#: the same evaluation settings as command-line arguments
POPULATION_EVAL_ARGS = ["--rho", "0.01", "0.05", "--batches", "2", "--batch-size", "16", "--iters", "3",
                        "--no-progress"]


def copy_population(src, parent, results=False):
    """A copy of the population directory ``src`` as ``parent/vit`` (without its evaluation results unless
    ``results``)."""
    dst = Path(parent) / "vit"
    shutil.copytree(src, dst, ignore=None if results else shutil.ignore_patterns("results*", "evaluation.json",
                                                                                  "correlation*"))
    return dst


def jsonl(path):
    """The records of a JSON-lines file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def subprocess_env(**extra):
    """The environment of a child ``python -m geosharp_ref.cli ...``: this checkout first on the path, one
    thread, no progress bars, no inherited torchrun rank."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TQDM_DISABLE="1", **extra)
    env.pop("WORLD_SIZE", None)
    return env


# ---------------------------------------------------------------------------------------------
# An independent reference: the exact trust-region maximum of a quadratic
# ---------------------------------------------------------------------------------------------

def trust_region_max(M, g, rho):
    """max_{‖δ‖ ≤ ρ} ½ δᵀMδ + gᵀδ for symmetric M (secular equation; generic g)."""
    w, V = np.linalg.eigh(M)
    c = V.T @ g
    if w[-1] <= 0 and np.linalg.norm(np.linalg.lstsq(-M, g, rcond=None)[0]) <= rho and np.all(w < 0):
        d = np.linalg.solve(-M, g)
        return 0.5 * d @ M @ d + g @ d
    lo = max(w[-1], 0.0) + 1e-14
    phi = lambda lam: np.linalg.norm(c / (lam - w)) - rho  # noqa: E731
    hi = lo + 1.0
    while phi(hi) > 0:
        hi *= 2
    lam = brentq(phi, lo + 1e-15 if phi(lo + 1e-15) > 0 else lo, hi, xtol=1e-15)
    d = V @ (c / (lam - w))
    return 0.5 * d @ M @ d + g @ d


def rel_error(a, b) -> float:
    """‖a − b‖ / ‖b‖ for tensors."""
    return float((a - b).norm() / b.norm())


def save_bert_backbone(path, vocab_size=50, max_position_embeddings=32, tokenizer_from=None, seed=0):
    """A tiny 2-layer ``BertModel`` (no task head, ``architectures: ["BertModel"]``) saved to ``path``, with
    the tokenizer of ``tokenizer_from`` saved beside it when given (a checkpoint in the format of the
    packaged all-MiniLM-L6-v2)."""
    tf = _transformers()
    torch.manual_seed(seed)
    cfg = tf.BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=max_position_embeddings,
                        architectures=["BertModel"])
    tf.BertModel(cfg).save_pretrained(path)
    if tokenizer_from is not None:
        tf.AutoTokenizer.from_pretrained(str(tokenizer_from), local_files_only=True).save_pretrained(path)
    return Path(path)


def quiet_transformers():
    """transformers with its logging at ERROR (no load reports in test output); skips without it."""
    import logging

    import pytest

    tf = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    tf.logging.set_verbosity_error()
    return tf
