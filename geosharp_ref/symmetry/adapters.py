r"""The GL(r) of a LoRA adapter: the binding and its detection.

A LoRA adapter ΔW = s·B A (peft's ``lora_B`` (d_out × r) and ``lora_A`` (r × d_in), scaling s) depends on
(B, A) only through B A, so (B R, R⁻¹ A), R ∈ GL(r), leaves the model unchanged: a GL(r) pair G = B,
H = Aᵀ, with ``gl_inv`` / ``gl_mix`` or any metric declared for ``gl_pair`` in a spec file
(``examples/lora_spec.py``). An adapter on an attention projection belongs to that projection's GL(h) pair
(:mod:`geosharp_ref.symmetry.attention`) unless it is given explicitly (the pair then yields,
:class:`~geosharp_ref.symmetry.quotient.Quotient`); the built-in search (``symmetries="all"``) quotients the
adapter's GL(r) and the pairs' GL(h) jointly (:func:`joint_with_pairs`; the geometry:
:mod:`geosharp_ref.sharpness.joint_lora`).

* :class:`LoRABinding` — the binding (a :class:`~geosharp_ref.symmetry.binding.Binding`);
* :func:`lora_bindings` — every adapter of a peft model;
* :func:`joint_with_pairs` — an adapter quotiented jointly with the attention pairs holding its rows.
"""
from __future__ import annotations

import copy

import torch

from ..sampling import well_conditioned

__all__ = ["LoRABinding", "lora_bindings", "joint_with_pairs", "KIND"]

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
    model's parameters (peft's LoRA layers), in parameter order; each with its peft ``scaling`` s
    (``LoraLayer.scaling[adapter]``; None where the module has none)."""
    names = [n for n, _ in model.named_parameters()]
    found = []
    for n in names:
        if ".lora_A." in n and n.endswith(".weight"):
            b = n.replace(".lora_A.", ".lora_B.")
            if b in names:
                found.append(LoRABinding(n, b, kernels))
                path, adapter = n.rsplit(".lora_A.", 1)
                scaling = getattr(model.get_submodule(path), "scaling", None)
                found[-1].scaling = (float(scaling[adapter[:-len(".weight")]]) if isinstance(scaling, dict)
                                     and adapter[:-len(".weight")] in scaling else None)
    return found


def joint_with_pairs(binding: LoRABinding, pairs) -> LoRABinding:
    """``binding`` quotiented jointly with the attention ``pairs`` that hold one of its factors (lora_B's rows
    into a head, lora_A's columns out of one): LoRA GL(r) × the pairs' GL(h) as one group
    (:class:`~geosharp_ref.sharpness.joint_lora.JointLoRAFactor` builds its geometry with those pairs). The
    returned binding binds only the factor no pair holds (``param_names``), so the pairs stay bound; its action
    is the adapter's whole GL(r); ``joint_pairs`` names the pairs."""
    held = {n for p in pairs for n in p.param_names}
    out = copy.copy(binding)
    out.param_names = tuple(n for n in binding.param_names if n not in held)
    out.joint_pairs = tuple(p.key for p in pairs)
    out.summary = (f"GL(r) jointly with {', '.join(out.joint_pairs)} (the adapter's {'lora_A' if binding.b_weight in held else 'lora_B'} "
                   f"bound here, its other factor in the pairs)")
    return out
