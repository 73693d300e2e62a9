"""LoRA's GL(r) symmetry with a metric geosharp has no built-in for.

A LoRA update ΔW = B A (B ∈ R^{d_out×r}, A ∈ R^{r×d_in}) is unchanged by (B, A) ↦ (B M, M⁻¹ A),
M ∈ GL(r): with G = B and H = Aᵀ this is the GL pair (G M, H M⁻ᵀ). The metric below weights B's
tangent like ``inv`` and Aᵀ's like ``mix`` (a "hybrid" metric). Derive and generate its kernels with

    geosharp derive --spec examples/lora_spec.py --out generated_kernels
"""
from sympy import Inverse, Trace

from derivations import Metric, gl_pair

lora = gl_pair("B", "At", n="d_out", m="d_in", h="r")
B, At = lora.blocks
(xi_B, xi_At), (eta_B, eta_At) = lora.tangent("xi"), lora.tangent("eta")

hybrid = Trace(Inverse(B.T * B) * xi_B.T * eta_B) + Trace(B.T * B * xi_At.T * eta_At)

SPEC = {"lora_hybrid": Metric(lora, hybrid, "hybrid")}

# Which parameters of a model form the blocks B and At: every peft LoRA adapter ("default") of the model.
# `{adapter}` matches the module path in front; lora_A (r × d_in) is transposed to At (d_in × r). Used by
#     geosharp evaluate MODEL_DIR --spec examples/lora_spec.py --metric lora_hybrid ...
#     geosharp verify   MODEL_DIR --spec examples/lora_spec.py --metric lora_hybrid
BINDINGS = {
    "lora_hybrid": [{
        "B": "{adapter}.lora_B.default.weight",
        "At": {"param": "{adapter}.lora_A.default.weight", "transpose": True},
    }],
}
