"""The case tables: :data:`SYMMETRY_CASES` (detection and outputs along orbits) and :data:`SHARPNESS_CASES`
(a loss on small batches), :func:`make` / :func:`build` and the built cases as the test modules use them."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from geosharp_ref.symmetry import symmetry_map

from .inputs import cat, clip_loss, ids, lm_loss, pixels, text_inputs
from .models import (CLIP_SOUP_SMALL, DT, IR, GQANet, MHAClassifier, MHACross, bert, clip, clip_soup, deit, gpt2,
                     gemma, gpt_neox, gptj, llama, mha_encoder, mistral, phi3, qknorm_net, qwen2, roberta, vit)


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


def _decoder_inputs(gen):
    return dict(input_ids=ids(gen), use_cache=False)


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
    Case("llama", llama, (2, 2), _logits_and_hidden, inputs=_decoder_inputs),
    Case("mistral", mistral, (2, 2), _logits_and_hidden, inputs=_decoder_inputs),
    Case("qwen2", qwen2, (2, 2), _logits_and_hidden, inputs=_decoder_inputs),
    Case("gemma", gemma, (2, 2), _logits_and_hidden, inputs=_decoder_inputs),
    Case("phi3", phi3, (2, 2), _logits_and_hidden, inputs=_decoder_inputs),
    Case("gpt-neox", gpt_neox, (2, 2), _logits_and_hidden, inputs=_decoder_inputs),
    Case("gptj", gptj, (2, 2), _logits_and_hidden, inputs=_decoder_inputs),
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

def _decoder_batch(gen):
    x = ids(gen, 3)
    return dict(input_ids=x, use_cache=False), x[:, 1:]


#: decoder families (RoPE Q/K — rotate_half, partial, interleaved —, GQA, gated MLPs; initializer range
#: :data:`IR`; next-token loss on batches of three): whole-model invariance of geodesic sharpness with
#: ``symmetries="all"``
DECODER_CASES = [
    Case(name, functools.partial(factory, initializer_range=IR), (2, 2), _logits, batch=_decoder_batch,
         loss_fn=lm_loss)
    for name, factory in (("llama", llama), ("mistral", mistral), ("qwen2", qwen2), ("gemma", gemma),
                          ("phi3", phi3), ("gpt-neox", gpt_neox), ("gptj", gptj))
]

CASES = {"symmetry": {c.name: c for c in SYMMETRY_CASES}, "sharpness": {c.name: c for c in SHARPNESS_CASES},
         "decoder": {c.name: c for c in DECODER_CASES}}
DECODER_NAMES = [c.name for c in DECODER_CASES]
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
    """``(model, symmetry map)`` of case ``name`` of ``table`` ("symmetry", "sharpness" or "decoder"), cached: tests
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


def sharpness_case(name, table: str = "sharpness") -> SharpnessModel:
    model, smap = build(table, name)
    case = CASES[table][name]
    return SharpnessModel(model, case.batch, case.loss_fn, case.output, smap)
