"""Parameter symmetries of real models: which parameters form which GL(h) pair blocks, and what is refused.

* :mod:`~geosharp_ref.symmetry.groups` — :class:`PairGroup`, :class:`PairSpec`, :class:`SymmetryMap`
* :mod:`~geosharp_ref.symmetry.detect` — :func:`symmetry_map` (attention pairs found in a model)
* :mod:`~geosharp_ref.symmetry.bindings` — bindings of further symmetries (classifier-head softmax
  translation, ReLU units, LoRA adapters) and :func:`check_binding` (the action must leave the output unchanged)
"""
from .bindings import HeadTranslationBinding, LoRABinding, ReLUUnitsBinding, check_binding, lora_bindings
from .detect import symmetry_map
from .groups import PairGroup, PairSpec, SymmetryMap

__all__ = ["PairGroup", "PairSpec", "SymmetryMap", "symmetry_map", "HeadTranslationBinding", "ReLUUnitsBinding",
           "LoRABinding", "lora_bindings", "check_binding"]
