"""The binding case table: one entry per kind of binding the toolkit has (a symmetry bound to parameters).

Each :class:`BindingCase` gives a float64 model (eval mode, seeded), a batch ``(inputs, targets)``, the
binding(s) found or built on that model through the public API of :mod:`geosharp_ref.symmetry`, the model
output the symmetry leaves unchanged, and a change of the bound parameters that is *not* a symmetry.
:func:`build_binding_case` builds a case once (cached: tests must not modify what it returns).

Every binding handed out implements :class:`geosharp_ref.symmetry.Binding` (``key``, ``param_names``,
``kernels``, ``extract``, ``insert``, ``act``, ``random_element``); attention pairs are the
:class:`~geosharp_ref.symmetry.PairGroup` objects of :func:`~geosharp_ref.symmetry.symmetry_map` themselves.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.func import functional_call

from geosharp_ref.kernels import load_kernels
from geosharp_ref.symmetry import (HeadTranslationBinding, ReLUUnitsBinding, declared_bindings, gated_mlp_candidates,
                                   lora_bindings, norm_scaling_bindings, symmetry_map)

from .models import DT, IR, GQANet, bert, gemma, gpt_neox, gptj, llama, lora, mlp, phi3, qwen2, vit
from .tables import randomize_vectors

__all__ = ["BindingCase", "BuiltBindingCase", "BINDING_CASES", "BINDING_NAMES", "BINDING_KINDS", "build_binding_case",
           "output_at", "scale_first_block", "scale_first_parameter", "DECLARED_LORA", "DECLARED_QK"]


def _pairs(kinds):
    def bindings(model, batch):
        return [g for g in symmetry_map(model).groups if g.kind in kinds]
    return bindings


# ---------------------------------------------------------------------------------------------------------
# Outputs, and changes that are not symmetries
# ---------------------------------------------------------------------------------------------------------

def _identity(o):
    return o


def _logits(o):
    return o.logits


def _log_probabilities(o):
    return torch.log_softmax(o.logits, dim=-1)


def output_at(model, params, batch, output) -> torch.Tensor:
    """``output`` of the model at ``params`` on ``batch[0]`` (a dict of keyword inputs, or one tensor)."""
    inputs = batch[0]
    with torch.no_grad():
        o = (functional_call(model, params, args=(), kwargs=inputs) if isinstance(inputs, dict)
             else functional_call(model, params, args=(inputs,)))
    return output(o)


def scale_first_block(binding, params, factor: float = 2.0) -> dict:
    """The first block (G of a pair, the whole block of a one-block binding) times ``factor``, the others kept:
    no group element does this for a pair (G A, H A⁻ᵀ) or a translation."""
    blocks = list(binding.extract(params))
    blocks[0] = factor * blocks[0]
    return binding.insert(params, tuple(blocks))


def scale_first_parameter(binding, params, factor: float = 2.0) -> dict:
    """Only the first bound parameter times ``factor`` (a scaling binding's symmetry scales all of them)."""
    name = binding.param_names[0]
    return dict(params, **{name: factor * params[name]})


# ---------------------------------------------------------------------------------------------------------
# Models and batches
# ---------------------------------------------------------------------------------------------------------

def _float64(factory):
    @functools.wraps(factory)
    def build():
        torch.manual_seed(0)
        return factory().to(DT).eval()
    return build


def _bert():
    return bert(initializer_range=IR)


def _bert_eps0():
    return bert(initializer_range=IR, layer_norm_eps=0.0)


def _vit_eps0():
    return vit(initializer_range=IR, layer_norm_eps=0.0)


def _lora_bert():
    return lora(bert(initializer_range=IR))


def _relu_mlp():
    return mlp(activation=nn.ReLU, d_in=5, hidden=6, d_out=3)


def _ids_batch():
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(3, 50, (4, 7), generator=g)}, torch.tensor([0, 1, 2, 1])


def _pixels_batch():
    g = torch.Generator().manual_seed(2)
    return {"pixel_values": torch.randn(4, 3, 8, 8, generator=g, dtype=DT)}, torch.tensor([0, 1, 2, 1])


def _gqa_batch():
    g = torch.Generator().manual_seed(3)
    return {"x": torch.randn(3, 7, 6, generator=g, dtype=DT)}, None


def _mlp_batch():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 5, generator=g, dtype=DT), torch.randint(3, (8,), generator=g)


# ---------------------------------------------------------------------------------------------------------
# Bindings from the model (public API of geosharp_ref.symmetry)
# ---------------------------------------------------------------------------------------------------------

#: the Q/K pairs of the tiny BERT declared by hand (2 heads of 8: hidden 16), for the built-in gl_mix kernels
DECLARED_QK = {"G": {"param": "bert.encoder.layer.{i}.attention.self.query.weight", "transpose": True,
                     "bias": "bert.encoder.layer.{i}.attention.self.query.bias", "heads": 2},
               "H": {"param": "bert.encoder.layer.{i}.attention.self.key.weight", "transpose": True,
                     "bias": "bert.encoder.layer.{i}.attention.self.key.bias", "heads": 2}}
#: every peft LoRA adapter as a GL(r) pair, as examples/lora_spec.py declares it (B = lora_B, At = lora_Aᵀ),
#: with the block names G, H of the built-in gl_mix kernels
DECLARED_LORA = {"G": "{adapter}.lora_B.default.weight",
                 "H": {"param": "{adapter}.lora_A.default.weight", "transpose": True}}


def _head_translation(model, batch):
    return [HeadTranslationBinding("classifier.weight", "classifier.bias")]


def _relu_units(model, batch):
    return [ReLUUnitsBinding("0.weight", "2.weight", in_bias="0.bias")]


def _lora(model, batch):
    return lora_bindings(model)


def _norm_scaling(model, batch):
    found, _ = norm_scaling_bindings(model, batch, _logits)
    return found


def _rope_qk(model, batch):
    return [g for g in symmetry_map(model).groups if g.kind == "qk" and g.rotary is not None]


def _gated_units(model, batch):
    return [c.binding for c in gated_mlp_candidates(model)]


def _decoder(factory):
    def build():
        return randomize_vectors(factory(initializer_range=IR))
    build.__name__ = factory.__name__
    return build


def _decoder_batch():
    g = torch.Generator().manual_seed(4)
    x = torch.randint(3, 50, (3, 7), generator=g)
    return {"input_ids": x, "use_cache": False}, x[:, 1:]


def _declared(declaration):
    def bindings(model, batch):
        return declared_bindings(model, load_kernels("gl_mix"), [declaration])
    return bindings


# ---------------------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BindingCase:
    """One kind of binding on a tiny model.

    ``model()``: a fresh float64 model in eval mode (seed 0); ``batch()``: ``(inputs, targets)`` (inputs a
    dict of keyword arguments or one tensor); ``bindings(model, batch)``: the binding(s) of this kind, from the
    public API; ``output(o)``: the model output the symmetry leaves unchanged; ``breaks(binding, params)``:
    parameters moved by a change that is no symmetry; ``requires``: optional packages the case needs."""

    name: str
    kind: str
    model: Callable[[], nn.Module]
    batch: Callable[[], tuple]
    bindings: Callable[[nn.Module, tuple], list]
    output: Callable[[Any], torch.Tensor] = _logits
    breaks: Callable[[Any, dict], dict] = scale_first_block
    requires: tuple = ()


BINDING_CASES = [
    BindingCase("bert-qk", "attention-qk", _float64(_bert), _ids_batch, _pairs(("qk",))),
    BindingCase("bert-vo", "attention-vo", _float64(_bert), _ids_batch, _pairs(("vo",))),
    BindingCase("gqa-custom", "gqa", _float64(GQANet), _gqa_batch, _pairs(("qk", "vo")), output=_identity),
    BindingCase("bert-head-translation", "head-translation", _float64(_bert), _ids_batch, _head_translation,
                output=_log_probabilities),
    BindingCase("mlp-relu-units", "relu-units", _float64(_relu_mlp), _mlp_batch, _relu_units, output=_identity),
    BindingCase("bert-lora", "lora", _float64(_lora_bert), _ids_batch, _lora, requires=("peft",)),
    BindingCase("bert-eps0-embeddings", "norm-scaling", _float64(_bert_eps0), _ids_batch, _norm_scaling,
                breaks=scale_first_parameter),
    BindingCase("vit-eps0-pre-ln", "norm-scaling", _float64(_vit_eps0), _pixels_batch, _norm_scaling,
                breaks=scale_first_parameter),
    BindingCase("llama-rope-qk", "rope-qk", _float64(_decoder(llama)), _decoder_batch, _rope_qk),
    BindingCase("qwen2-rope-qk-biases", "rope-qk", _float64(_decoder(qwen2)), _decoder_batch, _rope_qk),
    BindingCase("phi3-rope-qk-partial-fused", "rope-qk", _float64(_decoder(phi3)), _decoder_batch, _rope_qk),
    BindingCase("gpt-neox-rope-qk-per-head-fused", "rope-qk", _float64(_decoder(gpt_neox)), _decoder_batch, _rope_qk),
    BindingCase("gptj-rope-qk-interleaved", "rope-qk", _float64(_decoder(gptj)), _decoder_batch, _rope_qk),
    BindingCase("llama-gated-units", "gated-units", _float64(_decoder(llama)), _decoder_batch, _gated_units),
    BindingCase("gemma-geglu-units", "gated-units", _float64(_decoder(gemma)), _decoder_batch, _gated_units),
    BindingCase("phi3-fused-gated-units", "gated-units", _float64(_decoder(phi3)), _decoder_batch, _gated_units),
    BindingCase("bert-declared-qk", "declared", _float64(_bert), _ids_batch, _declared(DECLARED_QK)),
    BindingCase("bert-declared-lora", "declared", _float64(_lora_bert), _ids_batch, _declared(DECLARED_LORA),
                requires=("peft",)),
]
BINDING_NAMES = [c.name for c in BINDING_CASES]
#: every kind of binding the toolkit has
BINDING_KINDS = ("attention-qk", "attention-vo", "gqa", "head-translation", "relu-units", "lora", "norm-scaling",
                 "declared", "rope-qk", "gated-units")


@dataclass(frozen=True)
class BuiltBindingCase:
    """A built binding case: ``model`` (float64, eval; cached, do not modify), ``batch``, ``params`` (detached,
    by name), ``bindings``, and the case itself."""

    case: BindingCase
    model: nn.Module
    batch: tuple
    params: dict
    bindings: list


@functools.lru_cache(maxsize=None)
def build_binding_case(name: str) -> BuiltBindingCase:
    case = next(c for c in BINDING_CASES if c.name == name)
    model, batch = case.model(), case.batch()
    params = {n: p.detach() for n, p in model.named_parameters()}
    return BuiltBindingCase(case, model, batch, params, list(case.bindings(model, batch)))
