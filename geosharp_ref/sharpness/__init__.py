"""Whole-model sharpness: the perturbation space, its loss plumbing and the entry points.

* :mod:`~geosharp_ref.sharpness.loss` — how the loss of functional parameters is computed
* :mod:`~geosharp_ref.sharpness.space` — :class:`PerturbationSpace` (metric, projection, gradient,
  second-order geodesic; the GL-pair fast paths)
* :mod:`~geosharp_ref.sharpness.factors` — :class:`ProductSpace`, the generic path: any generated geometries
  (:class:`Factor`) bound to parameter blocks, the adaptive rest
* :mod:`~geosharp_ref.sharpness.measures` — :func:`adaptive_sharpness`, :func:`geodesic_sharpness`,
  :class:`SharpnessResult`, the named measures
"""
from .loss import default_loss, model_loss
from .measures import (ABLATION_MEASURES, HEADLINE_MEASURES, LINEARISED_MEASURES, MEASURES, Measure, SharpnessResult,
                       adaptive_sharpness, geodesic_sharpness, get_measure, linearised_sharpness)
from .factors import Factor, PairBinding, ProductSpace, gl_pair_factors
from .space import GRADIENTS, CotangentGradient, Iterate, PerturbationSpace

__all__ = ["ProductSpace", "Factor", "PairBinding", "gl_pair_factors", "PerturbationSpace", "CotangentGradient", "Iterate", "GRADIENTS", "SharpnessResult",
           "adaptive_sharpness", "geodesic_sharpness", "default_loss", "model_loss", "Measure", "MEASURES",
           "HEADLINE_MEASURES", "ABLATION_MEASURES", "LINEARISED_MEASURES", "get_measure", "linearised_sharpness"]
