"""Whole-model sharpness: the one perturbation space, its factors, the evaluation pipeline and the entry points.

* :mod:`~geosharp_ref.sharpness.space` — :class:`ProductSpace`, the one perturbation space (factors × the
  adaptive rest), its tangent vectors (:class:`Tangent`) and gradients (:class:`Cotangents`)
* :mod:`~geosharp_ref.sharpness.factors` — the factor interface and :class:`Factor`, any generated geometry
  bound to parameter blocks (every hook from the generated kernels), the rank check
* :mod:`~geosharp_ref.sharpness.gl_factor` — :class:`GLPairFactor`, the fast ``gl_inv``/``gl_mix`` factor of
  the attention pairs (buckets, base-point caches, lazy blocks, Gram-carrying vectors)
* :mod:`~geosharp_ref.sharpness.pipeline` — the one evaluation: :class:`EvaluationOptions` (validated once),
  :func:`prepare_inputs`, :func:`build_space`, :func:`evaluation_space` (the two, the preamble of every
  evaluation), :func:`evaluate`
* :mod:`~geosharp_ref.sharpness.result` — :class:`SharpnessResult`, relative sizes, :func:`rho_for_size`
* :mod:`~geosharp_ref.sharpness.measures` — :func:`adaptive_sharpness`, :func:`geodesic_sharpness`,
  :func:`linearised_sharpness`, the named measures
* :mod:`~geosharp_ref.sharpness.hessian` — :class:`QuotientHessian`, the Riemannian Hessian on the horizontal
  space (a Euclidean HVP plus the acceleration term), and :class:`EuclideanHessian`
* :mod:`~geosharp_ref.sharpness.curvature` — its trace (Hutchinson or Hutch++, with a standard error) and top
  eigenvalues (Lanczos), quotient and Euclidean (``curvature.curvature``)
* :mod:`~geosharp_ref.sharpness.exact_geodesic` — the geodesic integrated with RK4 (``geodesic="exact"``)
* :mod:`~geosharp_ref.sharpness.average_case` — :func:`average_case_sharpness`, on the quotient and adaptive

How the model is called (loss, logits, functional parameters) is :mod:`geosharp_ref.forward`.
"""
from ..forward import default_loss, model_loss
from .space import GRADIENTS, Cotangents, ProductSpace, SpaceOptions, Tangent
from .factors import Factor
from .gl_factor import GLPairFactor, gl_pair_factors
from .result import SharpnessResult, relative_perturbation, rho_for_size
from .pipeline import EvaluationOptions, EvaluationSpace, build_space, evaluate, evaluation_space, prepare_inputs
from .measures import (ABLATION_MEASURES, HEADLINE_MEASURES, LINEARISED_MEASURES, MEASURES, Measure,
                       adaptive_sharpness, geodesic_sharpness, get_measure, linearised_sharpness)
from .hessian import EuclideanHessian, QuotientHessian
from .curvature import CurvatureResult, hutchinson_trace, hutchpp_trace, top_eigenvalues
from .average_case import average_case_sharpness

__all__ = ["ProductSpace", "Tangent", "Cotangents", "SpaceOptions", "GRADIENTS", "Factor", "GLPairFactor",
           "gl_pair_factors", "EvaluationOptions", "build_space", "evaluate", "prepare_inputs",
           "evaluation_space", "EvaluationSpace", "SharpnessResult",
           "relative_perturbation", "rho_for_size", "adaptive_sharpness", "geodesic_sharpness",
           "linearised_sharpness", "default_loss", "model_loss", "Measure", "MEASURES", "HEADLINE_MEASURES",
           "ABLATION_MEASURES", "LINEARISED_MEASURES", "get_measure",
           "QuotientHessian", "EuclideanHessian", "CurvatureResult", "hutchinson_trace", "hutchpp_trace",
           "top_eigenvalues", "average_case_sharpness"]
