"""Bindings: which parameters of a model form the blocks of a declared symmetry's geometry.

A binding has ``key``, ``param_names``, ``extract(params) -> blocks`` (tensors with the group batch on the
leading dimensions, in the kernel module's ``BLOCKS`` order and shapes), ``insert(params, blocks) -> params``
(a new dict; only the bound parts change) and ``act(params, element) -> params`` (the symmetry's action on
the model, used by :func:`check_binding`).

* :class:`~geosharp_ref.sharpness.factors.PairBinding` — a GL(h) attention pair group (G, H per head).
* :class:`HeadTranslationBinding` — softmax translation of a classifier head: adding one vector v to every
  row of the output weight W (C × d) and one constant to every bias entry leaves the class probabilities
  unchanged, because every logit moves by the same vᵀx + c. Per input coordinate j (and the bias), the
  column w_j = W[:, j] ∈ R^C is one block of the ``translation`` kernel (w ↦ w + a·1), batched over the
  d + 1 columns.
* :class:`ReLUUnitsBinding` — the positive rescaling of the hidden units of a ReLU MLP: unit j's incoming
  row [W₁[j, :], b₁[j]] times a_j > 0 and its outgoing column W₂[:, j] divided by a_j leave the output
  unchanged (ReLU(a z) = a ReLU(z) for a > 0; a GELU or tanh MLP has no such symmetry). Per unit this is a
  GL(1) pair, G_j = [W₁[j, :], b₁[j]]ᵀ ∈ R^{(d+1)×1}, H_j = W₂[:, j] ∈ R^{d_out×1}, so the built-in
  ``gl_inv`` / ``gl_mix`` kernels with h = 1, batched over the units, are its quotient geometry (the
  positive scalars are the identity component of GL(1)).
* :class:`LoRABinding` — a LoRA adapter ΔW = s·B A (peft's ``lora_B`` (d_out × r) and ``lora_A`` (r × d_in),
  scaling s) depends on (B, A) only through B A, so (B R, R⁻¹ A), R ∈ GL(r), leaves the model unchanged:
  a GL(r) pair G = B, H = Aᵀ, with ``gl_inv`` / ``gl_mix`` or any metric declared for ``gl_pair`` in a spec
  file (``examples/lora_spec.py``). :func:`lora_bindings` finds every adapter of a peft model.
"""
from __future__ import annotations

import copy
from typing import Optional

import torch
from torch.func import functional_call

__all__ = ["HeadTranslationBinding", "ReLUUnitsBinding", "LoRABinding", "lora_bindings", "check_binding"]


class HeadTranslationBinding:
    """Softmax translation of a classifier head ``weight`` (C, d) [+ ``bias`` (C,)] (see the module doc)."""

    kernels = "translation"

    def __init__(self, weight: str, bias: Optional[str] = None):
        self.weight, self.bias = weight, bias
        self.key = f"{weight}:translation"
        self.param_names = (weight,) + ((bias,) if bias else ())

    def extract(self, params) -> tuple:
        cols = params[self.weight].mT  # (d, C): one column of W per input coordinate
        if self.bias is not None:
            cols = torch.cat([cols, params[self.bias][None, :]])
        return (cols[..., None],)  # (d [+1], C, 1)

    def insert(self, params, blocks) -> dict:
        (w,) = blocks
        w = w[..., 0]
        out = dict(params)
        d = params[self.weight].shape[1]
        out[self.weight] = w[:d].mT
        if self.bias is not None:
            out[self.bias] = w[d]
        return out

    def act(self, params, a) -> dict:
        """ψ(a, θ): column j of the head gains a_j · 1 (a of shape (d [+1],))."""
        (w,) = self.extract(params)
        return self.insert(params, (w + a[:, None, None],))


def check_binding(model, binding, batch, output, elements, tol: float = 1e-10) -> float:
    """Act on a float64 copy of the model with each group element and measure the largest relative change
    of ``output(model output)``; a binding that changes it by more than ``tol`` is refused (ValueError with
    the measured change). Returns the largest change."""
    m = copy.deepcopy(model).to(torch.float64).eval()
    params = {n: p.detach() for n, p in m.named_parameters()}
    inputs = batch[0]

    def run(p):
        with torch.no_grad():
            return output(functional_call(m, p, args=(), kwargs=inputs) if isinstance(inputs, dict)
                          else functional_call(m, p, args=(inputs,)))

    base = run(params)
    worst = 0.0
    for a in elements:
        moved = run(binding.act(params, a))
        worst = max(worst, float((moved - base).abs().max() / base.abs().max().clamp_min(1e-300)))
    if not worst <= tol:
        raise ValueError(f"binding {binding.key} is not a symmetry of this model: acting on it changed the "
                         f"output by {worst:.3g} (relative, float64; tolerance {tol:g})")
    return worst


class ReLUUnitsBinding:
    """The hidden units of ``in_weight`` (U, d) [+ ``in_bias`` (U,)] → ReLU → ``out_weight`` (d_out, U) as U
    GL(1) pairs (see the module doc); ``kernels`` is ``gl_inv`` or ``gl_mix``."""

    def __init__(self, in_weight: str, out_weight: str, in_bias: Optional[str] = None, metric: str = "mix"):
        self.in_weight, self.out_weight, self.in_bias = in_weight, out_weight, in_bias
        self.kernels = f"gl_{metric}"
        self.key = f"{in_weight}:relu-units"
        self.param_names = (in_weight,) + ((in_bias,) if in_bias else ()) + (out_weight,)

    def extract(self, params) -> tuple:
        rows = params[self.in_weight]
        if self.in_bias is not None:
            rows = torch.cat([rows, params[self.in_bias][:, None]], dim=1)
        return rows[..., None], params[self.out_weight].mT[..., None]  # (U, d [+1], 1), (U, d_out, 1)

    def insert(self, params, blocks) -> dict:
        G, H = (b[..., 0] for b in blocks)
        out = dict(params)
        d = params[self.in_weight].shape[1]
        out[self.in_weight] = G[:, :d]
        if self.in_bias is not None:
            out[self.in_bias] = G[:, d]
        out[self.out_weight] = H.mT
        return out

    def act(self, params, a) -> dict:
        """Unit j scaled by a_j > 0: incoming row times a_j, outgoing column divided by a_j."""
        G, H = self.extract(params)
        return self.insert(params, (G * a[:, None, None], H / a[:, None, None]))


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
