r"""Rescaling of the units of a gated MLP (SwiGLU, GeGLU): the binding and its detection.

A gated MLP computes y = W_down (σ(W_gate x + b_gate) ⊙ (W_up x + b_up)) + b_down, with U hidden units. The
output is *linear* in the up projection u = W_up x + b_up, unit by unit, whatever the activation σ: scaling
unit j's up row [W_up[j, :], b_up[j]] by a_j ≠ 0 and its down column W_down[:, j] by 1/a_j leaves y unchanged
(σ(g_j) · a_j u_j · W_down[:, j] / a_j). Per unit this is a GL(1) pair (negative a_j included, unlike ReLU
units, where only a_j > 0 commutes with the activation),

    G_j = [W_up[j, :], b_up[j]]ᵀ ∈ R^{(d+1)×1},   H_j = W_down[:, j] ∈ R^{d_out×1},   (G_j, H_j) ↦ (a_j G_j, H_j / a_j),

so the built-in ``gl_inv`` / ``gl_mix`` kernels with h = 1, batched over the units, are its quotient geometry.
The gate projection is not part of it (its parameters stay adaptive); nor is b_down (outside every unit).

* :class:`GatedUnitsBinding` — the binding (a :class:`~geosharp_ref.symmetry.binding.Binding`), for a separate
  ``up_proj`` or the up half of a fused ``gate_up_proj`` (rows ``offset … offset + U − 1``; it then binds that
  parameter *partly*: :attr:`GatedUnitsBinding.coverage` marks the bound rows, the gate half stays adaptive);
* :func:`gated_mlp_candidates` — every recognised gated MLP: ``gate_proj`` / ``up_proj`` / ``down_proj`` with an
  activation (Llama, Mistral, Qwen2, Gemma, …) and a fused ``gate_up_proj`` / ``down_proj`` split by
  ``chunk(2, dim=-1)`` into (gate, up) (Phi-3); one :class:`~geosharp_ref.symmetry.binding.Candidate` each (a
  binding, or the refusal: layers not plain ``nn.Linear``, shapes that do not match, a fused split not
  understood). Every binding is checked exact on the model before use
  (:class:`~geosharp_ref.symmetry.quotient.Quotient`).
"""
from __future__ import annotations

import inspect
import re
from typing import Optional

import torch
from torch import nn

from ..kernels import gl_kernels
from .binding import Candidate

__all__ = ["GatedUnitsBinding", "gated_mlp_candidates", "KIND"]

#: the family's name in reports
KIND = "gated-MLP units"


class GatedUnitsBinding:
    """The U hidden units of a gated MLP as U GL(1) pairs (module doc): ``up_weight`` rows ``offset …
    offset + U − 1`` [+ ``up_bias``] (G) and ``down_weight`` (d_out, U) columns (H); ``kernels`` ``gl_<metric>``."""

    def __init__(self, up_weight: str, down_weight: str, units: int, up_bias: Optional[str] = None,
                 offset: int = 0, metric: str = "mix"):
        self.up_weight, self.down_weight, self.up_bias = up_weight, down_weight, up_bias
        self.units, self.offset = int(units), int(offset)
        self.kernels = gl_kernels(metric)
        self.key = f"{up_weight}" + (f"[{offset}:{offset + units}]" if offset else "") + ":gated-units"
        self.param_names = (up_weight,) + ((up_bias,) if up_bias else ()) + (down_weight,)

    def coverage(self, shapes) -> dict:
        """name → bool mask of the elements this binding binds, for the parameters it binds partly (the up
        half of a fused ``gate_up_proj``); parameters absent are bound whole."""
        out = {}
        for name in (self.up_weight,) + ((self.up_bias,) if self.up_bias else ()):
            shape = tuple(shapes[name])
            if shape[0] != self.units:
                mask = torch.zeros(shape, dtype=torch.bool)
                mask[self.offset:self.offset + self.units] = True
                out[name] = mask
        return out

    def _rows(self, t):
        return t[self.offset:self.offset + self.units]

    def extract(self, params) -> tuple:
        rows = self._rows(params[self.up_weight])
        if self.up_bias is not None:
            rows = torch.cat([rows, self._rows(params[self.up_bias])[:, None]], dim=1)
        return rows[..., None], params[self.down_weight].mT[..., None]  # (U, d [+1], 1), (U, d_out, 1)

    def _write(self, full, rows):
        if full.shape[0] == self.units:
            return rows
        return torch.cat([full[:self.offset], rows.to(full.dtype), full[self.offset + self.units:]], dim=0)

    def insert(self, params, blocks) -> dict:
        G, H = (b[..., 0] for b in blocks)
        out = dict(params)
        d = params[self.up_weight].shape[1]
        out[self.up_weight] = self._write(params[self.up_weight], G[:, :d])
        if self.up_bias is not None:
            out[self.up_bias] = self._write(params[self.up_bias], G[:, d])
        out[self.down_weight] = H.mT
        return out

    def random_element(self, params, scale: float = 1.0, seed: int = 0):
        """a ∈ (R*)^U: scale · exp(N(0, 1)) · (random sign) per unit (all of GL(1), signs included)."""
        G, _ = self.extract(params)
        g = torch.Generator().manual_seed(seed)
        mag = torch.exp(torch.randn(G.shape[0], generator=g, dtype=G.dtype))
        sign = torch.randint(0, 2, (G.shape[0],), generator=g).to(G.dtype) * 2 - 1
        return (scale * mag * sign).to(G.device)

    def act(self, params, a) -> dict:
        """Unit j scaled by a_j ≠ 0: up row times a_j, down column divided by a_j."""
        G, H = self.extract(params)
        a = torch.as_tensor(a, dtype=G.dtype, device=G.device)
        return self.insert(params, (G * a[:, None, None], H / a[:, None, None]))


_SEPARATE = ("gate_proj", "up_proj", "down_proj")
_FUSED = ("gate_up_proj", "down_proj")
_ACTS = ("act_fn", "activation_fn", "act")
_CHUNK = re.compile(r"(\w+)\s*,\s*(\w+)\s*=\s*[\w.]+\.chunk\(\s*2\s*,\s*dim\s*=\s*-1\s*\)")


def _linear(m) -> bool:
    return type(m) is nn.Linear


def _forward_source(m) -> str:
    try:
        return inspect.getsource(type(m).forward)
    except (OSError, TypeError):
        return ""


def gated_mlp_candidates(model, metric: str = "mix") -> list:
    """One :class:`~geosharp_ref.symmetry.binding.Candidate` per gated MLP of ``model`` (module doc); empty
    when it has none. Not yet checked."""
    out = []
    for path, m in model.named_modules():
        if not any(hasattr(m, a) for a in _ACTS):
            continue
        pre = f"{path}." if path else ""
        if all(isinstance(getattr(m, n, None), nn.Module) for n in _SEPARATE):
            gate, up, down = (getattr(m, n) for n in _SEPARATE)
            key = f"{pre}up_proj.weight:gated-units"
            if not (_linear(gate) and _linear(up) and _linear(down)):
                out.append(Candidate(key, None, "the gated MLP's layers are not plain nn.Linear (an adapter wraps "
                                                "them?): unit rescaling not bound"))
            elif up.out_features != down.in_features or gate.out_features != up.out_features:
                out.append(Candidate(key, None, f"gate/up widths {gate.out_features}/{up.out_features} and down "
                                                f"input {down.in_features} differ: no unit pairing"))
            else:
                out.append(Candidate(key, GatedUnitsBinding(
                    f"{pre}up_proj.weight", f"{pre}down_proj.weight", up.out_features,
                    f"{pre}up_proj.bias" if up.bias is not None else None, metric=metric), ""))
        elif all(isinstance(getattr(m, n, None), nn.Module) for n in _FUSED):
            fused, down = m.gate_up_proj, m.down_proj
            key = f"{pre}gate_up_proj.weight:gated-units"
            split = _CHUNK.search(_forward_source(m))
            if not (_linear(fused) and _linear(down)):
                out.append(Candidate(key, None, "the gated MLP's layers are not plain nn.Linear (an adapter wraps "
                                                "them?): unit rescaling not bound"))
            elif fused.out_features != 2 * down.in_features:
                out.append(Candidate(key, None, f"gate_up_proj width {fused.out_features} is not twice the down "
                                                f"input {down.in_features}"))
            elif split is None or "gate" not in split.group(1) or "up" not in split.group(2):
                out.append(Candidate(key, None, "the fused gate_up_proj is not split as `gate, up = "
                                                "….chunk(2, dim=-1)` in its forward: which half is `up` is unknown"))
            else:
                U = down.in_features
                out.append(Candidate(f"{pre}gate_up_proj.weight[{U}:{2 * U}]:gated-units", GatedUnitsBinding(
                    f"{pre}gate_up_proj.weight", f"{pre}down_proj.weight", U,
                    f"{pre}gate_up_proj.bias" if fused.bias is not None else None, offset=U, metric=metric), ""))
    return out
