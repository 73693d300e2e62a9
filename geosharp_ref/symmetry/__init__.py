"""Parameter symmetries of real models: which parameters form which blocks of which geometry, and what is refused.

* :mod:`~geosharp_ref.symmetry.groups` — :class:`PairGroup`, :class:`PairSpec`, :class:`SymmetryMap`
* :mod:`~geosharp_ref.symmetry.detect` — :func:`symmetry_map` (attention pairs found in a model, LoRA-adapted
  projections included)
* :mod:`~geosharp_ref.symmetry.bindings` — bindings of further built-in symmetries (classifier-head softmax
  translation, ReLU units, LoRA adapters, norm scaling where exact) and :func:`check_binding` (the action must
  leave the output unchanged)
* :mod:`~geosharp_ref.symmetry.declared` — bindings a user declares for a generated geometry (parameter-name
  patterns, transposes, bias rows, head slicing): :func:`declared_bindings`
* :mod:`~geosharp_ref.symmetry.catalogue` — :func:`find_symmetries`: every built-in symmetry of a model, checked,
  bound or refused and why
"""
from .bindings import (HeadTranslationBinding, LoRABinding, NormScalingBinding, ReLUUnitsBinding, check_binding,
                       lora_bindings, norm_scaling_bindings)
from .catalogue import SymmetryReport, check_symmetry, find_symmetries
from .declared import DeclaredBinding, check_declarations, declared_bindings
from .detect import symmetry_map
from .groups import PairGroup, PairSpec, SymmetryMap

__all__ = ["PairGroup", "PairSpec", "SymmetryMap", "symmetry_map", "HeadTranslationBinding", "ReLUUnitsBinding",
           "LoRABinding", "NormScalingBinding", "lora_bindings", "norm_scaling_bindings", "check_binding",
           "DeclaredBinding", "check_declarations", "declared_bindings", "SymmetryReport", "find_symmetries",
           "check_symmetry"]
