"""geosharp.derivations — declare a parameter symmetry and a metric, derive the quotient geometry.

SymPy only; never imported by the evaluator at run time. Typical use::

    from derivations import gl_pair, builtin_metric, derive_geometry
    geo = derive_geometry(builtin_metric(gl_pair(), "mix"))
    print(geo.summary())

A subgroup of GL(h) given by its Lie algebra (Q/K under rotary embeddings; the pairing is a parameter)::

    geo = derive_geometry(builtin_metric(rope_pair("half"), "mix"))   # or "interleaved", rotary_dim=…

A user's own metric is any SymPy expression of the blocks and two tangent vectors::

    sym = gl_pair("B", "At", h="r")                 # LoRA: B ∈ R^{n×r}, Aᵀ ∈ R^{m×r}
    (xB, xA), (eB, eA) = sym.tangent("xi"), sym.tangent("eta")
    B, At = sym.blocks
    g = Trace(Inverse(B.T*B)*xB.T*eB) + Trace(B.T*B*xA.T*eA)
    geo = derive_geometry(Metric(sym, g, "lora_hybrid"))
"""
from .errors import (
    DeclarationError,
    DerivationError,
    MetricError,
    NotInvariantError,
    UnsupportedStructureError,
)
from .metric import BUILTIN_METRICS, InvarianceResult, Metric, builtin_metric, check_invariance, check_metric
from .quotient import LinearSolve, QuotientGeometry, derive_geometry
from .symmetry import (
    BUILTIN_SYMMETRIES,
    Symmetry,
    elementwise_rescaling,
    get_symmetry,
    gl_pair,
    positive_scaling,
    rope_pair,
    subgroup_pair,
    translation,
)
from .subgroup import Subalgebra
from .invariant import Ansatz, InvariantFamily, invariant_metrics
from .joint import JointMetric, JointSymmetry, joint_invariant_metrics, lora_attention, norm_qk
from .joint_geometry import JointGeometry, derive_joint_geometry

__all__ = [
    "BUILTIN_METRICS", "BUILTIN_SYMMETRIES", "DeclarationError", "DerivationError", "InvarianceResult",
    "LinearSolve", "Metric", "MetricError", "NotInvariantError", "QuotientGeometry", "Symmetry",
    "UnsupportedStructureError", "builtin_metric", "check_invariance", "check_metric", "derive_geometry",
    "elementwise_rescaling", "get_symmetry", "gl_pair", "positive_scaling", "translation", "rope_pair", "subgroup_pair",
    "Subalgebra", "Ansatz", "InvariantFamily", "invariant_metrics", "JointMetric", "JointSymmetry",
    "joint_invariant_metrics", "lora_attention", "norm_qk", "JointGeometry", "derive_joint_geometry",
]
