r"""Positive rescaling of the hidden units of a ReLU MLP: the binding and its detection.

Unit j's incoming row [W₁[j, :], b₁[j]] times a_j > 0 and its outgoing column W₂[:, j] divided by a_j leave
the output unchanged (ReLU(a z) = a ReLU(z) for a > 0; a GELU or tanh MLP has no such symmetry). Per unit
this is a GL(1) pair, G_j = [W₁[j, :], b₁[j]]ᵀ ∈ R^{(d+1)×1}, H_j = W₂[:, j] ∈ R^{d_out×1}, so the built-in
``gl_inv`` / ``gl_mix`` kernels with h = 1, batched over the units, are its quotient geometry (the positive
scalars are the identity component of GL(1)).

* :class:`ReLUUnitsBinding` — the binding (a :class:`~geosharp_ref.symmetry.binding.Binding`);
* :func:`mlp_candidates` — every recognised MLP: Hugging Face ``intermediate.dense → act → output.dense``,
  OPT-style ``fc1 → act → fc2``, ``nn.TransformerEncoderLayer``'s ``linear1 → activation → linear2``, and
  ``nn.Sequential`` runs ``Linear → activation → Linear``;
* :func:`relu_units_candidates` — one :class:`~geosharp_ref.symmetry.binding.Candidate` per MLP (a binding
  where the activation is ReLU and the layers plain ``nn.Linear``, else the refusal).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..kernels import gl_kernels
from .binding import Candidate

__all__ = ["ReLUUnitsBinding", "mlp_candidates", "relu_units_candidates", "is_relu", "KIND"]

#: the family's name in reports
KIND = "ReLU units"


class ReLUUnitsBinding:
    """The hidden units of ``in_weight`` (U, d) [+ ``in_bias`` (U,)] → ReLU → ``out_weight`` (d_out, U) as U
    GL(1) pairs (see the module doc); ``kernels`` is ``gl_inv`` or ``gl_mix``."""

    def __init__(self, in_weight: str, out_weight: str, in_bias: Optional[str] = None, metric: str = "mix"):
        self.in_weight, self.out_weight, self.in_bias = in_weight, out_weight, in_bias
        self.kernels = gl_kernels(metric)
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

    def random_element(self, params, scale: float = 1.0, seed: int = 0):
        """a ∈ R^U_{>0}: scale · exp(N(0, 1)) per unit (the positive scalars, not all of GL(1))."""
        G, _ = self.extract(params)
        return scale * torch.exp(torch.randn(G.shape[0], generator=torch.Generator().manual_seed(seed),
                                             dtype=G.dtype)).to(G.device)

    def act(self, params, a) -> dict:
        """Unit j scaled by a_j > 0: incoming row times a_j, outgoing column divided by a_j."""
        G, H = self.extract(params)
        return self.insert(params, (G * a[:, None, None], H / a[:, None, None]))


def _linear(m) -> bool:
    return type(m) is nn.Linear


def is_relu(act) -> bool:
    """Positively homogeneous, σ(a z) = a σ(z) for a > 0: ReLU and leaky ReLU."""
    if isinstance(act, (nn.ReLU, nn.LeakyReLU)):
        return True
    return getattr(act, "__name__", None) in ("relu", "leaky_relu")  # torch.nn.functional.relu, torch.relu


def mlp_candidates(model) -> list:
    """``(path, in_name, in_linear, out_name, out_linear, activation)`` for every recognised MLP."""
    found = []
    for path, m in model.named_modules():
        inter, out = getattr(m, "intermediate", None), getattr(m, "output", None)
        if inter is not None and hasattr(inter, "intermediate_act_fn") and hasattr(out, "dense"):
            found.append((path, f"{path}.intermediate.dense", inter.dense, f"{path}.output.dense", out.dense,
                          inter.intermediate_act_fn))
        elif hasattr(m, "fc1") and hasattr(m, "fc2") and hasattr(m, "activation_fn"):
            found.append((path, f"{path}.fc1", m.fc1, f"{path}.fc2", m.fc2, m.activation_fn))
        elif isinstance(m, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
            found.append((path, f"{path}.linear1", m.linear1, f"{path}.linear2", m.linear2, m.activation))
        elif isinstance(m, nn.Sequential):  # consecutive Linear → activation → Linear children
            kids = list(m.named_children())
            for (na, a), (_, act), (nb, b) in zip(kids, kids[1:], kids[2:]):
                if _linear(a) and _linear(b) and not _linear(act):
                    found.append((path, f"{path}.{na}", a, f"{path}.{nb}", b, act))
    return [(p, n1.lstrip("."), l1, n2.lstrip("."), l2, act) for p, n1, l1, n2, l2, act in found]


def relu_units_candidates(model, metric: str = "mix") -> list:
    """One :class:`~geosharp_ref.symmetry.binding.Candidate` per recognised MLP (a :class:`ReLUUnitsBinding`
    with ``gl_<metric>``, or the refusal: layers not plain ``nn.Linear``, activation not ReLU), or one
    refusal ``("MLP", …)`` when the model has no MLP of a recognised layout. Not yet checked."""
    mlps = mlp_candidates(model)
    if not mlps:
        return [Candidate("MLP", None, "no MLP of a recognised layout (intermediate.dense → output.dense, fc1 → "
                                       "fc2, linear1 → linear2, Sequential Linear → act → Linear)")]
    out = []
    for _, n1, l1, n2, l2, act in mlps:
        key = f"{n1}.weight:relu-units"
        if not (_linear(l1) and _linear(l2)):
            out.append(Candidate(key, None, "the MLP's layers are not plain nn.Linear (an adapter wraps them?)"))
        elif not is_relu(act):
            what = type(act).__name__ if isinstance(act, nn.Module) else getattr(act, "__name__", act)
            out.append(Candidate(key, None, f"activation {what} is not ReLU (not positively homogeneous): no "
                                            f"unit-scaling symmetry"))
        else:
            out.append(Candidate(key, ReLUUnitsBinding(f"{n1}.weight", f"{n2}.weight",
                                                       f"{n1}.bias" if l1.bias is not None else None,
                                                       metric=metric), ""))
    return out
