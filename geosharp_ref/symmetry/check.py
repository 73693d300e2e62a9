"""The exactness check every binding passes before it is used: acting on the model must not change it.

* :func:`check_binding` — act on a float64 copy of the model with given group elements and measure the
  largest relative change of ``output(model output)``; refused (ValueError with the change) above ``tol``;
* :func:`check_symmetry` — the standard check: the binding's own random elements at :data:`CHECK_SCALES`
  (10⁻² and 10²), on the log-probabilities (:func:`log_probabilities`), tolerance :data:`CHECK_TOL` (1e-10).
"""
from __future__ import annotations

import copy

import torch

from ..forward import call_model, float64_inputs

__all__ = ["check_binding", "check_symmetry", "log_probabilities", "CHECK_SCALES", "CHECK_TOL"]

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


def check_binding(model, binding, batch, output, elements, tol: float = 1e-10) -> float:
    """Act on a float64 copy of the model with each group element and measure the largest relative change
    of ``output(model output)``; a binding that changes it by more than ``tol`` is refused (ValueError with
    the measured change). Returns the largest change."""
    m = copy.deepcopy(model).to(torch.float64).eval()
    params = {n: p.detach() for n, p in m.named_parameters()}
    inputs = float64_inputs(batch[0])

    def run(p):
        with torch.no_grad():
            return output(call_model(m, p, inputs))

    base = run(params)
    worst = 0.0
    for a in elements:
        moved = run(binding.act(params, a))
        worst = max(worst, float((moved - base).abs().max() / base.abs().max().clamp_min(1e-300)))
    if not worst <= tol:
        raise ValueError(f"binding {binding.key} is not a symmetry of this model: acting on it changed the "
                         f"output by {worst:.3g} (relative, float64; tolerance {tol:g})")
    return worst


def check_symmetry(model, binding, batch, seed: int = 0, params64=None) -> float:
    """:func:`check_binding` of ``binding`` on ``batch`` with its own random elements at :data:`CHECK_SCALES`
    (``binding.random_element``), on the log-probabilities; returns the largest relative change, ValueError
    (with it) above :data:`CHECK_TOL`. A binding with a ``checked`` flag (a declared binding) is marked checked."""
    if params64 is None:
        params64 = {n: p.detach().to(torch.float64) for n, p in model.named_parameters()}
    elements = [binding.random_element(params64, scale=a, seed=seed + i) for i, a in enumerate(CHECK_SCALES)]
    worst = check_binding(model, binding, batch, log_probabilities, elements, tol=CHECK_TOL)
    if hasattr(binding, "checked"):
        binding.checked = True
    return worst
