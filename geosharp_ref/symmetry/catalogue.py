"""Every built-in symmetry that applies to a model: found, checked, bound or refused — and why.

:func:`find_symmetries` looks for

* the attention GL(h) pairs (:func:`~geosharp_ref.symmetry.detect.symmetry_map`; with LoRA-adapted
  projections the adapter's rows belong to the pair);
* the softmax translation of the classification head (:class:`~.bindings.HeadTranslationBinding`): the last
  ``nn.Linear`` whose width is the number of logits;
* the ReLU units of every MLP whose activation is ReLU (:class:`~.bindings.ReLUUnitsBinding`): Hugging Face
  ``intermediate.dense → act → output.dense``, OPT-style ``fc1 → act → fc2``, ``nn.TransformerEncoderLayer``'s
  ``linear1 → activation → linear2``, and ``nn.Sequential`` runs ``Linear → activation → Linear``;
* the GL(r) of every LoRA adapter (:func:`~.bindings.lora_bindings`) whose parameters no attention pair holds;
* the positive scaling of the weights that feed a normalisation (:func:`~.bindings.norm_scaling_bindings`),
  only where it is exact.

Each candidate binding is accepted only after :func:`~.bindings.check_binding` measured, on a float64 copy
and the given batch, that random group elements at scales 10⁻² and 10² leave the model's log-probabilities
unchanged (relative 1e-10) — the symmetries of a model trained with cross-entropy. A candidate that changes
them is refused with the measured change.

``geodesic_sharpness(model, batches, rho, symmetries="all")`` quotients everything this finds;
``geosharp symmetries MODEL_DIR`` prints the report.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from .bindings import (HeadTranslationBinding, ReLUUnitsBinding, check_binding, lora_bindings,
                       norm_scaling_bindings)
from .detect import symmetry_map

__all__ = ["SymmetryReport", "find_symmetries", "check_symmetry", "log_probabilities", "CHECK_SCALES", "CHECK_TOL"]

#: the scales a of the group elements a·Ã every binding is checked with
CHECK_SCALES = (1e-2, 1e2)
#: the largest relative change of the log-probabilities an accepted binding may cause (float64)
CHECK_TOL = 1e-10


def log_probabilities(out):
    """What the checks compare: log softmax of a model output's logits (``.logits``, the first element of a
    tuple, or the output), or a backbone's ``last_hidden_state`` as it is."""
    if getattr(out, "logits", None) is None and hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    logits = out.logits if hasattr(out, "logits") else out[0] if isinstance(out, (tuple, list)) else out
    return torch.log_softmax(logits, dim=-1)


@dataclass
class SymmetryReport:
    """What :func:`find_symmetries` found: ``smap`` (the attention pairs), ``bindings`` (the further
    symmetries accepted), and ``entries``: one ``(key, kind, status, detail)`` per candidate, status
    ``"bound"`` or ``"refused"``."""

    smap: object
    bindings: list = field(default_factory=list)
    entries: list = field(default_factory=list)

    @property
    def refused(self) -> list:
        return [(k, d) for k, _, s, d in self.entries if s == "refused"]

    def __str__(self) -> str:
        heads = sum(g.num_heads for g in self.smap.groups)
        lines = [f"attention GL(h): {len(self.smap.groups)} pairs ({heads} heads) bound, "
                 f"{len(self.smap.refused)} refused"]
        for kind in dict.fromkeys(k for _, k, _, _ in self.entries):
            rows = [e for e in self.entries if e[1] == kind]
            bound = sum(1 for e in rows if e[2] == "bound")
            lines.append(f"{kind}: {bound} bound, {len(rows) - bound} refused")
            for key, _, status, detail in rows:
                lines.append(f"  {status:7s} {key}: {detail}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return dict(bindings=[b.key for b in self.bindings],
                    entries=[dict(key=k, kind=t, status=s, detail=d) for k, t, s, d in self.entries])


def _linear(m) -> bool:
    return type(m) is nn.Linear


def _is_relu(act) -> bool:
    """Positively homogeneous, σ(a z) = a σ(z) for a > 0: ReLU and leaky ReLU."""
    if isinstance(act, (nn.ReLU, nn.LeakyReLU)):
        return True
    return getattr(act, "__name__", None) in ("relu", "leaky_relu")  # torch.nn.functional.relu, torch.relu


def _mlp_candidates(model):
    """``(path, in_linear, out_linear, activation)`` for every recognised MLP."""
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


def _head_candidate(model, batch):
    """The last plain ``nn.Linear`` whose output width is the number of logits, or None."""
    with torch.no_grad():
        inputs = batch[0]
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    if getattr(out, "logits", None) is None and hasattr(out, "last_hidden_state"):
        return None, 0  # a backbone: no logits, no head
    width = log_probabilities(out).shape[-1]
    last = None
    for name, m in model.named_modules():
        if _linear(m) and m.out_features == width:
            last = (name, m)
    return last, width


def check_symmetry(model, binding, batch, seed: int = 0, params64=None) -> float:
    """:func:`~.bindings.check_binding` of ``binding`` on ``batch`` with its own random elements at
    :data:`CHECK_SCALES` (``binding.random_element``), on the log-probabilities; returns the largest relative
    change, ValueError (with it) above :data:`CHECK_TOL`."""
    if params64 is None:
        params64 = {n: p.detach().to(torch.float64) for n, p in model.named_parameters()}
    elements = [binding.random_element(params64, scale=a, seed=seed + i) for i, a in enumerate(CHECK_SCALES)]
    worst = check_binding(model, binding, batch, log_probabilities, elements, tol=CHECK_TOL)
    if hasattr(binding, "checked"):
        binding.checked = True
    return worst


def find_symmetries(model, batch, *, metric: str = "mix", seed: int = 0, smap=None) -> SymmetryReport:
    """Find, check and bind every built-in symmetry of ``model`` (see the module doc) on ``batch``
    (``(inputs, targets)``; the inputs are what the checks run). ``metric`` (``inv``/``mix``) is the quotient
    metric of the GL(1)/GL(r) bindings (ReLU units, LoRA); ``smap``: the attention pairs to give precedence
    (default: :func:`~.detect.symmetry_map` of the model). Returns a :class:`SymmetryReport`."""
    if smap is None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="symmetry_map: no GL")
            smap = symmetry_map(model)
    params64 = {n: p.detach().to(torch.float64) for n, p in model.named_parameters()}
    taken = {n: g.key for g in smap.groups for n in g.param_names}
    report = SymmetryReport(smap)

    def consider(binding, kind, worst=None):
        """Bind ``binding`` unless a parameter is taken or its check fails (``worst``: already measured)."""
        clash = sorted({taken[n] for n in binding.param_names if n in taken})
        if clash:
            report.entries.append((binding.key, kind, "refused", f"its parameters belong to {', '.join(clash)} "
                                                                  f"(a parameter belongs to one symmetry)"))
            return
        try:
            if worst is None:
                worst = check_symmetry(model, binding, batch, seed, params64)
        except ValueError as exc:
            report.entries.append((binding.key, kind, "refused", str(exc)))
            return
        report.entries.append((binding.key, kind, "bound", f"{binding.kernels} on {len(binding.param_names)} "
                                                           f"parameters; output change {worst:.1e}"))
        report.bindings.append(binding)
        for n in binding.param_names:
            taken[n] = binding.key

    for b in lora_bindings(model, kernels=f"gl_{metric}"):
        consider(b, "LoRA GL(r)")
    mlps = _mlp_candidates(model)
    if not mlps:
        report.entries.append(("MLP", "ReLU units", "refused", "no MLP of a recognised layout (intermediate.dense → "
                                                               "output.dense, fc1 → fc2, linear1 → linear2, "
                                                               "Sequential Linear → act → Linear)"))
    for path, n1, l1, n2, l2, act in mlps:
        key = f"{n1}.weight:relu-units"
        if not (_linear(l1) and _linear(l2)):
            report.entries.append((key, "ReLU units", "refused", "the MLP's layers are not plain nn.Linear (an "
                                                                 "adapter wraps them?)"))
        elif not _is_relu(act):
            what = type(act).__name__ if isinstance(act, nn.Module) else getattr(act, "__name__", act)
            report.entries.append((key, "ReLU units", "refused", f"activation {what} is not ReLU (not positively "
                                                                 f"homogeneous): no unit-scaling symmetry"))
        else:
            consider(ReLUUnitsBinding(f"{n1}.weight", f"{n2}.weight", f"{n1}.bias" if l1.bias is not None else None,
                                      metric=metric), "ReLU units")
    head, width = _head_candidate(model, batch)
    if head is None:
        report.entries.append(("classifier head", "softmax translation", "refused",
                               f"no nn.Linear with {width} outputs (the number of logits)" if width else
                               "the model returns hidden states, no logits (a backbone without a head)"))
    elif width < 2:
        report.entries.append((f"{head[0]}.weight:translation", "softmax translation", "refused",
                               "one logit: no softmax over classes"))
    elif f"{head[0]}.weight" not in params64:
        report.entries.append((f"{head[0]}.weight:translation", "softmax translation", "refused",
                               "its weight is tied to another parameter (the input embeddings)"))
    else:
        name = head[0]
        consider(HeadTranslationBinding(f"{name}.weight", f"{name}.bias" if head[1].bias is not None else None),
                 "softmax translation")
    scaling, refused = norm_scaling_bindings(model, batch, log_probabilities, tol=CHECK_TOL, elements=CHECK_SCALES)
    for b in scaling:  # measured by norm_scaling_bindings at CHECK_SCALES already (and eps = 0 required)
        consider(b, "norm scaling", worst=b.measured_change)
    for key, why in refused:
        report.entries.append((key, "norm scaling", "refused", why))
    return report
