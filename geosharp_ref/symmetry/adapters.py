r"""The GL(r) of a LoRA adapter: the binding and its detection.

A LoRA adapter ΔW = s·B A (peft's ``lora_B`` (d_out × r) and ``lora_A`` (r × d_in), scaling s) depends on
(B, A) only through B A, so (B R, R⁻¹ A), R ∈ GL(r), leaves the model unchanged: a GL(r) pair G = B,
H = Aᵀ, with ``gl_inv`` / ``gl_mix`` or any metric declared for ``gl_pair`` in a spec file
(``examples/lora_spec.py``). An adapter on an attention projection belongs to that projection's GL(h) pair
(:mod:`geosharp_ref.symmetry.attention`) unless it is given explicitly (the pair then yields,
:class:`~geosharp_ref.symmetry.quotient.Quotient`).

* :class:`LoRABinding` — the binding (a :class:`~geosharp_ref.symmetry.binding.Binding`);
* :func:`lora_bindings` — every adapter of a peft model.
"""
from __future__ import annotations

import torch

from ..sampling import well_conditioned

__all__ = ["LoRABinding", "lora_bindings", "KIND"]

#: the family's name in reports
KIND = "LoRA GL(r)"


class LoRABinding:
    """One LoRA adapter as a GL(r) pair: G = ``lora_B`` (d_out, r), H = ``lora_A``ᵀ (d_in, r), batch of one."""

    def __init__(self, a_weight: str, b_weight: str, kernels="gl_mix"):
        self.a_weight, self.b_weight, self.kernels = a_weight, b_weight, kernels
        self.key = f"{b_weight.rsplit('.lora_B', 1)[0]}:lora"
        self.param_names = (b_weight, a_weight)

    def extract(self, params) -> tuple:
        return params[self.b_weight][None], params[self.a_weight].mT[None]  # (1, d_out, r), (1, d_in, r)

    def insert(self, params, blocks) -> dict:
        G, H = blocks
        out = dict(params)
        out[self.b_weight], out[self.a_weight] = G[0], H[0].mT
        return out

    def random_element(self, params, scale: float = 1.0, seed: int = 0):
        """R = scale · (an r × r matrix with singular values in [1, 4])."""
        G, _ = self.extract(params)
        r = G.shape[-1]
        return scale * well_conditioned((r, r), torch.Generator().manual_seed(seed), G.dtype).to(G.device)

    def act(self, params, R) -> dict:
        """(B R, R⁻¹ A) for R (r, r) invertible."""
        G, H = self.extract(params)
        return self.insert(params, (G @ R, H @ torch.linalg.inv(R).mT))


def lora_bindings(model, kernels="gl_mix") -> list:
    """A :class:`LoRABinding` for every ``lora_A.<adapter>.weight`` / ``lora_B.<adapter>.weight`` pair of the
    model's parameters (peft's LoRA layers), in parameter order."""
    names = [n for n, _ in model.named_parameters()]
    found = []
    for n in names:
        if ".lora_A." in n and n.endswith(".weight"):
            b = n.replace(".lora_A.", ".lora_B.")
            if b in names:
                found.append(LoRABinding(n, b, kernels))
    return found
