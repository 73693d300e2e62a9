r"""Softmax translation of a classifier head: the binding and its detection.

Adding one vector v to every row of the output weight W (C × d) and one constant to every bias entry leaves
the class probabilities unchanged, because every logit moves by the same vᵀx + c. Per input coordinate j
(and the bias), the column w_j = W[:, j] ∈ R^C is one block of the ``translation`` kernel (w ↦ w + a·1),
batched over the d + 1 columns.

* :class:`HeadTranslationBinding` — the binding (a :class:`~geosharp_ref.symmetry.binding.Binding`);
* :func:`head_candidate` — the last plain ``nn.Linear`` whose output width is the number of logits;
* :func:`head_translation_candidates` — the one :class:`~geosharp_ref.symmetry.binding.Candidate` of a model.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .binding import Candidate
from .check import log_probabilities

__all__ = ["HeadTranslationBinding", "head_candidate", "head_translation_candidates", "KIND"]

#: the family's name in reports
KIND = "softmax translation"


class HeadTranslationBinding:
    """Softmax translation of a classifier head ``weight`` (C, d) [+ ``bias`` (C,)] (see the module doc)."""

    kernels = "translation"

    def __init__(self, weight: str, bias: Optional[str] = None):
        self.weight, self.bias = weight, bias
        self.key = f"{weight}:translation"
        self.param_names = (weight,) + ((bias,) if bias else ())

    def extract(self, params) -> tuple:
        cols = params[self.weight].mT  # (d, C): one column of W per input coordinate
        if self.bias is not None:
            cols = torch.cat([cols, params[self.bias][None, :]])
        return (cols[..., None],)  # (d [+1], C, 1)

    def insert(self, params, blocks) -> dict:
        (w,) = blocks
        w = w[..., 0]
        out = dict(params)
        d = params[self.weight].shape[1]
        out[self.weight] = w[:d].mT
        if self.bias is not None:
            out[self.bias] = w[d]
        return out

    def random_element(self, params, scale: float = 1.0, seed: int = 0):
        """a ∈ R^{d [+1]}: scale · N(0, 1) per column."""
        (w,) = self.extract(params)
        return scale * torch.randn(w.shape[0], generator=torch.Generator().manual_seed(seed), dtype=w.dtype).to(w.device)

    def act(self, params, a) -> dict:
        """ψ(a, θ): column j of the head gains a_j · 1 (a of shape (d [+1],))."""
        (w,) = self.extract(params)
        return self.insert(params, (w + a[:, None, None],))


def head_candidate(model, batch):
    """``((name, module) or None, width)``: the last plain ``nn.Linear`` whose output width is the number of
    logits (``width``) of the model on ``batch``; width 0 for a backbone (no logits)."""
    with torch.no_grad():
        inputs = batch[0]
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    if getattr(out, "logits", None) is None and hasattr(out, "last_hidden_state"):
        return None, 0  # a backbone: no logits, no head
    width = log_probabilities(out).shape[-1]
    last = None
    for name, m in model.named_modules():
        if type(m) is nn.Linear and m.out_features == width:
            last = (name, m)
    return last, width


def head_translation_candidates(model, batch) -> list:
    """The classifier head's :class:`~geosharp_ref.symmetry.binding.Candidate`: a
    :class:`HeadTranslationBinding`, or the refusal (no head, one logit, a weight tied to the embeddings)."""
    head, width = head_candidate(model, batch)
    if head is None:
        return [Candidate("classifier head", None, f"no nn.Linear with {width} outputs (the number of logits)"
                          if width else "the model returns hidden states, no logits (a backbone without a head)")]
    key = f"{head[0]}.weight:translation"
    if width < 2:
        return [Candidate(key, None, "one logit: no softmax over classes")]
    if f"{head[0]}.weight" not in dict(model.named_parameters()):
        return [Candidate(key, None, "its weight is tied to another parameter (the input embeddings)")]
    name = head[0]
    return [Candidate(key, HeadTranslationBinding(f"{name}.weight", f"{name}.bias" if head[1].bias is not None
                                                  else None), "")]
