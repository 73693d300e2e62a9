"""Orbit invariance of a whole model: move it along its symmetry orbits and measure what changes.

For each scale a, every GL(h) group of the model's symmetry map gets A = a·Q·diag(u) per head
(:func:`~geosharp_ref.sampling.draw_orbit_elements`); the moved model ψ(A, θ) must give the
same logits, the same geodesic sharpness (inv, mix) and the same norm of the horizontal Riemannian
gradient, to round-off (float64). Adaptive sharpness is not invariant and is expected to change.
The relative change of a quantity is |f(ψ(A, θ)) − f(θ)| / |f(θ)| (max-abs over the logits).

With ``symmetries`` (bindings, e.g. declared in a spec file or found by ``find_symmetries``) the sharpness
and gradient norms are those of the generic space that quotients them too, and every binding moves along
its own orbit as well (``binding.random_element`` at the same scale a, acted with ``binding.act``); attention
pairs that yield to a binding (a shared parameter) are not moved, and the output compared is the
log-probabilities (the head's softmax translation moves the logits by a constant per example).
"""
from __future__ import annotations

import contextlib
import copy
import math
import warnings

import torch

from ..forward import call_model, model_logits
from ..parking import park
from ..sharpness import adaptive_sharpness, build_space, geodesic_sharpness
from ..sharpness.pipeline import gradient_dual_norm
from ..symmetry import NoAttentionPairsWarning, Quotient, SymmetryMap
from ..sampling import draw_orbit_elements

__all__ = ["riemannian_gradient_norm", "model_with_params", "parameters_set_to", "parameters_moved_to",
           "orbit_quantities", "relative_change", "orbit_invariance", "INVARIANCE_TOL", "QUANTITIES",
           "INVARIANT_QUANTITIES"]

#: the largest relative change along an orbit that counts as invariant
INVARIANCE_TOL = 1e-6
#: what is measured at every point of the orbit, and which of it must not change
QUANTITIES = ("output", "geodesic-inv", "geodesic-mix", "grad-inv", "grad-mix", "adaptive")
INVARIANT_QUANTITIES = ("output", "geodesic-inv", "geodesic-mix", "grad-inv", "grad-mix")


def model_with_params(model, params):
    """A deep copy of ``model`` (eval mode) with its parameters replaced by ``params``."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(params[n])
    return m.eval()


@contextlib.contextmanager
def parameters_set_to(model, params):
    """Within the block, ``model``'s parameters hold the tensors ``params`` (name → tensor of the same shape,
    dtype and device; swapped in by reference, no copy); the original tensors are restored on exit."""
    named = dict(model.named_parameters())
    missing = sorted(set(named) - set(params))
    if missing:
        raise ValueError(f"parameters_set_to: no tensor for {missing[:3]}")
    saved = {n: p.data for n, p in named.items()}
    try:
        with torch.no_grad():
            for n, p in named.items():
                p.data = params[n]
        yield model
    finally:
        with torch.no_grad():
            for n, p in named.items():
                p.data = saved[n]


@contextlib.contextmanager
def parameters_moved_to(model, theta, moved):
    """Within the block ``model``'s parameters hold ``moved`` (name → tensor, as :func:`parameters_set_to`);
    ``theta`` (name → tensor, the model's own parameters, a dict the block updates in place) gives up every
    parameter that ``moved`` replaces (``moved[n] is not theta[n]``): its values wait in an anonymous temporary
    file (:func:`geosharp_ref.parking.park`: no name to leave behind, also when the process dies) and ``theta[n]``
    is a storage-less ``meta`` tensor of its shape and dtype meanwhile, so only the moved values are in memory
    while the moved point is measured. On exit ``theta`` and the model hold the same tensor objects as before
    with θ's values again, bit for bit."""
    named = dict(model.named_parameters())
    missing = sorted(set(named) - set(moved))
    if missing:
        raise ValueError(f"parameters_moved_to: no tensor for {missing[:3]}")
    changed = {n: theta[n] for n in named if moved[n] is not theta[n]}
    parked = None
    try:
        with torch.no_grad():
            for n, p in named.items():
                p.data = moved[n]
        for n, t in changed.items():  # the placeholders first: parking empties the tensors
            theta[n] = torch.empty(t.shape, dtype=t.dtype, device="meta")
        parked = park(changed.values())
        yield model
    finally:
        if parked is not None:
            parked.restore()
        theta.update(changed)
        with torch.no_grad():
            for n, p in named.items():
                p.data = theta[n]


def riemannian_gradient_norm(model, smap, batch, metric, symmetries=None):
    """‖grad L‖_g at θ: the horizontal Riemannian gradient of the loss in the quotient geometry
    (GL(h) pairs, ``metric``; and ``symmetries`` on the generic path) plus the adaptive geometry elsewhere
    (as the sharpness ascent uses)."""
    params = {n: p.detach() for n, p in model.named_parameters()}
    space = build_space(params, smap, metric, symmetries)
    return gradient_dual_norm(model, space, batch)


def orbit_quantities(model, smap, batch, rho, iters, seed, symmetries=None):
    """``{quantity: value}`` for :data:`QUANTITIES` at the model's weights (float64 sharpness)."""
    inputs, _ = batch
    with torch.no_grad():
        out = model_logits(call_model(model, {n: p.detach() for n, p in model.named_parameters()}, inputs))
    if symmetries:  # the head's softmax translation moves the logits, not the probabilities
        out = torch.log_softmax(out, dim=-1)
    kw = dict(n_iter=iters, seed=seed, dtype=torch.float64)
    vals = {"output": out}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=NoAttentionPairsWarning)
        for metric in ("inv", "mix"):
            vals[f"geodesic-{metric}"] = geodesic_sharpness(model, [batch], rho, metric=metric, symmetry_map=smap,
                                                            symmetries=symmetries, **kw).mean
            vals[f"grad-{metric}"] = riemannian_gradient_norm(model, smap, batch, metric, symmetries)
    vals["adaptive"] = adaptive_sharpness(model, [batch], rho, **kw).mean
    return vals


def relative_change(a, b) -> float:
    """|b − a| / |a| (max-abs for tensors); 0 when equal, inf when only a is 0."""
    if torch.is_tensor(a):
        den = float(a.abs().max())
        num = float((b - a).abs().max())
    else:
        den, num = abs(a), abs(b - a)
    if num == 0:
        return 0.0
    return num / den if den > 0 else math.inf


def orbit_invariance(model64, smap, batch, rho, scales, iters=5, seed=0, symmetries=None) -> dict:
    """Move a float64 model along its orbits (one draw per scale) and measure relative changes. The moved
    point's parameters are swapped into ``model64`` (:func:`parameters_moved_to`: no copy of the model, and θ's
    tensors of the moved parameters wait in a temporary file while it is measured); the model holds θ again after.

    Returns ``{"base": quantities at θ, "rows": [(a, {quantity: relative change})], "worst": {quantity:
    max change}, "failed": invariant quantities that changed by more than INVARIANCE_TOL}``."""
    params = {n: p.detach() for n, p in model64.named_parameters()}
    base = orbit_quantities(model64, smap, batch, rho, iters, seed, symmetries)
    moving = smap
    if symmetries:
        moving = SymmetryMap(Quotient.assemble(params, smap, "mix", symmetries).pairs, smap.param_shapes, smap.refused)
    gen = torch.Generator().manual_seed(seed)
    rows, worst = [], {c: 0.0 for c in QUANTITIES}
    for k, a in enumerate(scales):
        moved = moving.act(params, draw_orbit_elements(moving, a, gen))
        for j, b in enumerate(symmetries or ()):
            moved = b.act(moved, b.random_element(moved, scale=a, seed=seed + 1000 * k + j))
        with parameters_moved_to(model64, params, moved):  # no copy of the model per scale
            vals = orbit_quantities(model64, smap, batch, rho, iters, seed, symmetries)
        del moved
        rel = {c: relative_change(base[c], vals[c]) for c in QUANTITIES}
        for c in QUANTITIES:
            worst[c] = max(worst[c], rel[c])
        rows.append((a, rel))
    failed = [c for c in INVARIANT_QUANTITIES if not worst[c] <= INVARIANCE_TOL]
    return dict(base=base, rows=rows, worst=worst, failed=failed)
