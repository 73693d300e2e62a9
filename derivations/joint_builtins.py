"""Built-in jointly invariant metrics (the ones with committed kernel modules, ``codegen/generated/norm_qk_*``).

For the norm weight × Q/K pair (:func:`derivations.joint.norm_qk`: Γ = diag(γ), G, H ∈ R^{d×h}; GL(h) acts by
(G A, H A⁻ᵀ), the diagonal group by (Γ D, D⁻¹ G, D⁻¹ H)) the GL pair's metrics are lifted to the D-invariant blocks
P = Γ G, Q = Γ H (the row-weighted Grams PᵀP = GᵀΓ²G, QᵀQ = HᵀΓ²H transform as GL(h) Grams, and Γ ξ_G is unchanged by
D because diagonal matrices commute), plus the scale-invariant Σ_i ξ_γi η_γi / γ_i² on the norm weight:

* ``inv``: tr((GᵀΓ²G)⁻¹ ξ_Gᵀ Γ² η_G) + tr((HᵀΓ²H)⁻¹ ξ_Hᵀ Γ² η_H) + tr(Γ⁻² ξ_Γ η_Γᵀ)
* ``mix``: tr(HᵀΓ²H ξ_Gᵀ Γ² η_G) + tr(GᵀΓ²G ξ_Hᵀ Γ² η_H) + tr(Γ⁻² ξ_Γ η_Γᵀ)

Both are positive definite where Γ is invertible and G, H have full column rank; their invariance under each part
is proved symbolically by :func:`derivations.joint_geometry.derive_joint_geometry` (which refuses a refuted metric).

The *folded* metrics ``folded_inv`` and ``folded_mix`` (:data:`FOLDED_JOINT_METRICS`, :mod:`derivations.joint_folded`)
are the pullbacks of Σ dγ²/γ² ⊕ g_pair(ΓG, ΓH) by the fold (γ, G, H) ↦ (γ, ΓG, ΓH):

* ``folded_<k>``: tr(Γ⁻² ξ_Γ η_Γ) + g_k|_(ΓG, ΓH)((Γ ξ_G + ξ_Γ G, Γ ξ_H + ξ_Γ H), (Γ η_G + η_Γ G, Γ η_H + η_Γ H))

They differ from the lifts above by the cross terms ξ_Γ G (their operator is not block-diagonal), so
:func:`derivations.joint_geometry.derive_joint_geometry` cannot derive their geodesic; derive them with
:func:`derivations.joint_folded.derive_folded_geometry` (invariance proved for both parts, closed-form projection and
geodesic through the fold). They are not in ``JOINT_BUILTIN_METRICS`` (no committed kernels);
``geosharp derive --spec FILE --metric folded_inv|folded_mix`` derives them through the fold for any norm weight × GL
pair (:func:`codegen.joint.generate_joint_choice`).
"""
from __future__ import annotations

from sympy import Inverse, Trace

from .errors import MetricError
from .joint import JointMetric, norm_qk
from .joint_folded import folded_metric

__all__ = ["JOINT_BUILTIN_METRICS", "FOLDED_JOINT_METRICS", "joint_builtin_metric"]

#: (joint symmetry, metric kind) pairs with a built-in metric
JOINT_BUILTIN_METRICS = (("norm_qk", "inv"), ("norm_qk", "mix"))
#: (joint symmetry, metric kind) pairs of the folded metrics (derivations.joint_folded; geometry through the fold)
FOLDED_JOINT_METRICS = (("norm_qk", "folded_inv"), ("norm_qk", "folded_mix"))


def joint_builtin_metric(joint_name: str, kind: str, d: int = 3) -> JointMetric:
    """The built-in metric ``kind`` of the joint symmetry ``joint_name`` (module docstring); ``d`` is the concrete
    size of the diagonal group's Lie algebra basis (the geometry itself is shape-generic)."""
    if (joint_name, kind) in FOLDED_JOINT_METRICS:
        return folded_metric(kind, d)
    if (joint_name, kind) not in JOINT_BUILTIN_METRICS:
        raise MetricError(f"no built-in metric {kind!r} for joint symmetry {joint_name!r}; built-ins: "
                          + ", ".join(f"{j}/{k}" for j, k in JOINT_BUILTIN_METRICS + FOLDED_JOINT_METRICS))
    j = norm_qk(d)
    G, H, Gam = j.blocks
    (xG, xH, xGam), (eG, eH, eGam) = j.tangent("xi"), j.tangent("eta")
    G2 = Gam * Gam
    scale = Trace(Inverse(Gam) * Inverse(Gam) * xGam * eGam.T)
    if kind == "inv":
        expr = Trace(Inverse(G.T * G2 * G) * xG.T * G2 * eG) + Trace(Inverse(H.T * G2 * H) * xH.T * G2 * eH) + scale
    else:
        expr = Trace(H.T * G2 * H * xG.T * G2 * eG) + Trace(G.T * G2 * G * xH.T * G2 * eH) + scale
    return JointMetric(j, expr, kind)
