"""The GL(h) symmetries of attention: pair groups and their detection.

* :mod:`~.groups` — :class:`Piece`, :class:`Side`, :class:`PairGroup` (a
  :class:`~geosharp_ref.symmetry.binding.Binding`), :class:`PairSpec`, :class:`SymmetryMap`
* :mod:`~.layouts` — projection layouts (``nn.Linear``, ``Conv1D``, LoRA-wrapped) and Q/K refusal evidence
* :mod:`~.detect` — :func:`symmetry_map` (the pairs found in a model, the refusals) and
  :class:`NoAttentionPairsWarning`
"""
from .detect import NoAttentionPairsWarning, symmetry_map
from .groups import PairGroup, PairSpec, Piece, Side, SymmetryMap, coverage_counts_from_pieces

__all__ = ["PairGroup", "PairSpec", "Piece", "Side", "SymmetryMap", "coverage_counts_from_pieces", "symmetry_map",
           "NoAttentionPairsWarning"]
