"""A symmetry declared with no metric: geosharp finds its invariant metrics.

LoRA's GL(r) (ΔW = B A, (B, A) ↦ (B M, M⁻¹ A); with At = Aᵀ the GL pair (B M, At M⁻ᵀ)). List the
invariant, symmetric, bilinear metrics of the ansatz family (each with its invariance proof and definiteness):

    geosharp derive --spec examples/symmetry_only_spec.py

and derive the geometry and kernels of one of them (a basis element, a sum, or a built-in name in the family):

    geosharp derive --spec examples/symmetry_only_spec.py --metric m1+m3 --out generated_kernels

See docs/guides/invariant-metrics.md for the ansatz and the method.
"""
from derivations import gl_pair
from derivations.invariant import Ansatz

SYMMETRY = {"lora": gl_pair("B", "At", n="d_out", m="d_in", h="r")}
ANSATZ = Ansatz(degree=1)
