"""Parameter symmetries of real models: one :class:`Binding` interface, one module per family, one :class:`Quotient`.

* :mod:`~geosharp_ref.symmetry.binding` — :class:`Binding` (the protocol every symmetry implements: blocks,
  action, geometry, exactness), :func:`~geosharp_ref.symmetry.binding.claim` (a parameter belongs to one symmetry)
* :mod:`~geosharp_ref.symmetry.check` — :func:`check_binding`, :func:`check_symmetry` (the action must leave
  the output unchanged: float64, scales 10⁻² and 10², tolerance 1e-10)
* :mod:`~geosharp_ref.symmetry.attention` — :class:`PairGroup`, :class:`PairSpec`, :class:`SymmetryMap`,
  :func:`symmetry_map` (attention GL(h) pairs found in a model, LoRA-adapted projections included),
  :class:`NoAttentionPairsWarning`
* :mod:`~geosharp_ref.symmetry.units` — ReLU units (:class:`ReLUUnitsBinding`, MLP detection)
* :mod:`~geosharp_ref.symmetry.gated` — gated-MLP units (SwiGLU, GeGLU, fused ``gate_up_proj``:
  :class:`GatedUnitsBinding`, :func:`gated_mlp_candidates`)
* :mod:`~geosharp_ref.symmetry.heads` — classifier-head softmax translation (:class:`HeadTranslationBinding`)
* :mod:`~geosharp_ref.symmetry.adapters` — LoRA adapters (:class:`LoRABinding`, :func:`lora_bindings`)
* :mod:`~geosharp_ref.symmetry.norms` — norm scaling where exact (:class:`NormScalingBinding`,
  :func:`norm_scaling_bindings`)
* :mod:`~geosharp_ref.symmetry.declared` — bindings a user declares for a generated geometry (parameter-name
  patterns, transposes, bias rows, head slicing): :func:`declared_bindings`
* :mod:`~geosharp_ref.symmetry.quotient` — :class:`Quotient` (which symmetries apply, one parameter one
  symmetry, what yielded and what was refused), :func:`find_symmetries` (the built-in search as a
  :class:`SymmetryReport`)
"""
from .adapters import LoRABinding, lora_bindings
from .attention import NoAttentionPairsWarning, PairGroup, PairSpec, SymmetryMap, symmetry_map
from .binding import Binding
from .check import check_binding, check_symmetry
from .declared import DeclaredBinding, check_declarations, declared_bindings
from .heads import HeadTranslationBinding
from .norm_weights import NormWeightsBinding, fold_binding
from .norms import NormScalingBinding, norm_scaling_bindings
from .quotient import Quotient, SymmetryReport, find_symmetries
from .gated import GatedUnitsBinding, gated_mlp_candidates
from .units import ReLUUnitsBinding

__all__ = ["PairGroup", "PairSpec", "SymmetryMap", "symmetry_map", "HeadTranslationBinding", "ReLUUnitsBinding",
           "GatedUnitsBinding", "gated_mlp_candidates",
           "LoRABinding", "NormScalingBinding", "NormWeightsBinding", "fold_binding", "lora_bindings", "norm_scaling_bindings", "check_binding",
           "DeclaredBinding", "check_declarations", "declared_bindings", "SymmetryReport", "find_symmetries",
           "check_symmetry", "Binding", "Quotient", "NoAttentionPairsWarning"]
