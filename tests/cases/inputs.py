"""Inputs, batches, losses and the functional forward of the test suite's models (see :mod:`tests.cases`),
and orbit elements of a symmetry map (:func:`random_gl`, drawn with :mod:`geosharp_ref.sampling`)."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from geosharp_ref.precision import keep_float64
import torch.nn.functional as F
from torch.func import functional_call

from geosharp_ref.sampling import draw_orbit_elements

from .models import DT, hf_transformers


def clip_images(n=4, res=32, seed=0):
    """Preprocessed images for :func:`clip_soup` (``pixel_values``)."""
    return torch.randn(n, 3, res, res, generator=torch.Generator().manual_seed(seed))


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


def padded_text(gen, n, length, lo=1, vocab=50):
    """``n`` right-padded rows of random real lengths in [lo, length] (ids 3…vocab-1, [PAD] 0), with the attention
    mask and zero token types (BERT's inputs)."""
    lens = torch.randint(lo, length + 1, (n,), generator=gen)
    mask = (torch.arange(length) < lens[:, None]).long()
    ids = torch.randint(3, vocab, (n, length), generator=gen) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def bert_inputs(seed=0):
    """Inputs for :func:`bert_classifier` (three examples of 9 tokens, example 1 padded)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(3, 60, (3, 9), generator=gen)
    mask = torch.ones_like(x)
    mask[1, -3:] = 0
    return dict(input_ids=x, attention_mask=mask)


def text_batch64(seed=1):
    """A classifier batch for the tiny BERT: 4 sequences of 7 token ids in [3, 50) and labels [0, 1, 2, 1]."""
    return ({"input_ids": torch.randint(3, 50, (4, 7), generator=torch.Generator().manual_seed(seed))},
            torch.tensor([0, 1, 2, 1]))


def mlp_batch64(seed=0):
    """A float64 batch for :func:`~tests.cases.models.mlp64`: 8 inputs of width 5, labels in [0, 3)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 5, generator=g, dtype=torch.float64), torch.randint(3, (8,), generator=g)


def pixels_batch64(seed=2):
    """A float64 batch of 4 images 3×8×8 for the tiny ViT, labels [0, 1, 2, 1]."""
    g = torch.Generator().manual_seed(seed)
    return {"pixel_values": torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64)}, torch.tensor([0, 1, 2, 1])


def cat(*ts):
    return torch.cat([t.reshape(-1) for t in ts])


def lm_loss(logits, targets):
    """Next-token cross-entropy: logits (B, T, V) for inputs ids, targets = ids[:, 1:]."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1))


def clip_loss(out, targets):
    """Cross-entropy on CLIPModel's image→text logits (the loss receives the CLIPOutput itself)."""
    return F.cross_entropy(out.logits_per_image, targets)


def params_of(model):
    """A detached copy of the model's parameters, by name."""
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def hidden_kw(model):
    """``output_hidden_states=True`` for Hugging Face models (their outputs then carry hidden states)."""
    T = hf_transformers()
    return {"output_hidden_states": True} if isinstance(model, T.PreTrainedModel) else {}


def forward(model, params, kwargs, out):
    """``out`` of the model's output at ``params`` (functional call, no gradient; float64 kept float64 inside the
    forward: :func:`geosharp_ref.precision.keep_float64`)."""
    with torch.no_grad(), keep_float64():
        o = functional_call(model, params, args=(), kwargs=dict(kwargs, **hidden_kw(model)))
    return out(o)


def random_gl(smap, gen, log10_a):
    """Per group: a·Q·D, Q random orthogonal, D = diag(U[0.5, 2]) (:func:`geosharp_ref.sampling.draw_orbit_elements`
    of that group), a = 10**log10_a with a per-group jitter of ×10^U[-0.2, 0.2] so groups differ while staying in
    [1e-2, 1e2] up to the jitter. A mapping group key → A (num_heads, h, h)."""
    As = {}
    for g in smap.groups:
        (A,) = draw_orbit_elements(SimpleNamespace(groups=[g]), 1.0, gen, dtype=DT)
        jitter = float(torch.empty(()).uniform_(-0.2, 0.2, generator=gen))
        As[g.key] = 10.0 ** max(-2.0, min(2.0, log10_a + jitter)) * A
    return As
