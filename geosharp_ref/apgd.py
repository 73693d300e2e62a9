"""Auto-PGD (Croce & Hein 2020) over a tangent space with a Riemannian norm ball.

Maximises f(ξ) over {ξ horizontal, ‖ξ‖_g ≤ ρ}. The space object supplies the geometry:

* ``space.zeros()`` / ``space.random(rho, generator)`` — starting points (lists of tensors);
* ``space.inner(xi, eta)`` — the metric g (a scalar);
* ``space.ascent_direction(egrad)`` — horizontal Riemannian gradient 𝔾⁻¹∇f projected horizontally;
* ``space.project(xi, rho)`` — onto the horizontal space, then radially into the g-ball (exact,
  because the horizontal projection is g-orthogonal and the ball is a g-ball);
* optionally ``space.clip(xi, rho)`` — the radial step alone, for vectors that are horizontal
  already. The iterates below are linear combinations of horizontal vectors (the start point and
  the ascent directions are projected), so the two per-iteration projections reduce to ``clip``
  (the horizontal projection is idempotent: skipping it changes nothing but round-off); spaces
  without ``clip`` get ``project``;
* optionally ``space.gradient_pairing`` — a function ``(ξ, ∇) ↦ ⟨ξ, ∇⟩_F`` (or None) that equals
  g(ξ, d) for every horizontal ξ, d = ``ascent_direction(∇)``. It holds when d = P 𝔾⁻¹∇ with P the
  g-orthogonal projection: g(ξ, P𝔾⁻¹∇) = g(ξ, 𝔾⁻¹∇) = ⟨ξ, ∇⟩_F. Then ‖d‖² = ⟨d, ∇⟩_F and
  ‖x + s d‖² = ‖x‖² + 2s⟨x, ∇⟩_F + s²‖d‖² cost one element-wise pass each instead of a metric
  norm (for GL(h) pairs 2 n·h² products per pair); only the new iterate's norm is a metric norm;
* optionally ``space.ascent_step(xi, egrad) -> (d, ‖d‖², ⟨ξ, ∇⟩_F)`` — the three in one call, for
  spaces whose gradient is not ∂f/∂ξ itself (:class:`geosharp_ref.sharpness.CotangentGradient`:
  the cotangent at the perturbed weights, mapped to d without forming ∂f/∂ξ);
* optionally ``space.lincomb([(c₁, ξ₁), …])`` — Σ cᵢ ξᵢ (default :func:`lincomb`: one pass per term),
  e.g. to carry per-vector data such as Gram products (:class:`geosharp_ref.sharpness.Iterate`).

The iteration (L2 version, step normalised in the metric):

    z = P(x_k + η d_k / ‖d_k‖_g)
    x_{k+1} = P(x_k + α (z − x_k) + (1 − α)(x_k − x_{k−1})),   α = 0.75 (α = 1 on the first step)

(with the pairing, z = s (x_k + t d_k) for the radial factor s, so x_{k+1} before its clip is the single
combination (2 − 2α + α s) x_k + α s t d_k − (1 − α) x_{k−1}; z itself is never formed)

with initial η = 2ρ. At checkpoints w_j = ⌈p_j N⌉, p₀ = 0, p₁ = 0.22,
p_{j+1} = p_j + max(p_j − p_{j−1} − 0.03, 0.06), the step is halved and the iterate restarts from
the best point when (1) fewer than 75 % of the steps since the last checkpoint increased f, or
(2) the step was not halved at the last checkpoint and the best value has not improved since.
The best iterate is kept; ``n_iter`` gradient evaluations follow the one at the start.

Host synchronisation: the step normalisation stays on the device; the only value read back per
iteration is f (returned as a float by ``f_and_grad``), which the best-iterate and step-size
bookkeeping needs anyway.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

__all__ = ["apgd_checkpoints", "apgd", "APGDResult", "value_and_grad", "radial_clip", "apgd_step", "lincomb",
           "combine"]


def value_and_grad(objective):
    """Wrap ``objective(xi) -> scalar tensor`` (xi a list of tensors) as the ``f_and_grad`` that
    :func:`apgd` expects: ``xi -> (float value, list of gradients)``; unused inputs get zero gradients."""
    def f_and_grad(xi):
        xi = [x.detach().requires_grad_(True) for x in xi]
        value = objective(xi)
        grads = torch.autograd.grad(value, xi, allow_unused=True)
        return float(value.detach()), [torch.zeros_like(x) if g is None else g for x, g in zip(xi, grads)]
    return f_and_grad


def apgd_checkpoints(n_iter: int) -> list[int]:
    """Iterations ⌈p_j N⌉ (j ≥ 1) at which step-size halving is decided."""
    p = [0.0, 0.22]
    while p[-1] < 1:
        p.append(p[-1] + max(p[-1] - p[-2] - 0.03, 0.06))
    ws = sorted({math.ceil(pj * n_iter - 1e-9) for pj in p[1:] if pj <= 1 + 1e-12})
    return [w for w in ws if 0 < w <= n_iter]


@dataclass
class APGDResult:
    best_value: float
    start_value: float
    best_xi: list
    values: list = field(default_factory=list)  # f at every evaluated iterate
    step_sizes: list = field(default_factory=list)


def combine(terms):
    """Σᵢ cᵢ vᵢ for one tensor per term, ``terms`` = [(cᵢ, vᵢ)], cᵢ a number or a 0-d tensor (kept on
    the device: no synchronisation): one new tensor, the other terms accumulated into it in place."""
    (c0, v0), *rest = terms
    out = v0 * c0
    for c, v in rest:
        if torch.is_tensor(c):
            out.addcmul_(v, c)
        else:
            out.add_(v, alpha=c)
    return out


def lincomb(terms):
    """Σᵢ cᵢ ξᵢ for tangent vectors (lists of tensors), ``terms`` = [(cᵢ, ξᵢ)]: one pass per term and
    one new tensor per entry (spaces may supply their own ``lincomb``, e.g. to carry Gram products)."""
    return [combine([(c, v[j]) for c, v in terms]) for j in range(len(terms[0][1]))]


def _clip_factor(sq_norm, rho, on_device):
    """(s, s²‖ξ‖²) with s = min(1, ρ/‖ξ‖); s is None for ξ inside the ball on the CPU path."""
    sq = torch.as_tensor(sq_norm).clamp_min(0)
    if on_device is None:
        on_device = sq.device.type != "cpu"
    if not on_device:
        n = float(sq) ** 0.5
        return (None, sq) if n <= rho else (rho / n, torch.full_like(sq, rho * rho))
    s = (rho / sq.sqrt()).clamp(max=1.0)
    return s, sq * s * s


def radial_clip(xi, sq_norm, rho, on_device: bool | None = None):
    """(ξ · min(1, ρ/‖ξ‖), its squared norm) given ‖ξ‖² as a tensor.

    On accelerators (``on_device`` None: the norm's device is not the CPU) the factor stays on the
    device (no host synchronisation; ρ/0 = inf clamps to 1) and every ξ is rescaled; on the CPU,
    where reading the norm costs nothing, ξ inside the ball is returned as is (saves a pass over all
    parameters). ``on_device=True`` forces the synchronisation-free path (tests run it on the CPU).
    A vector with a ``scaled(s)`` method (:class:`geosharp_ref.sharpness.Iterate`) is rescaled by it."""
    if not xi:
        return xi, torch.as_tensor(sq_norm).clamp_min(0)
    s, sq = _clip_factor(sq_norm, rho, on_device)
    if s is None:
        return xi, sq
    if hasattr(xi, "scaled"):
        return xi.scaled(s), sq
    return [x * (s.to(x.dtype) if torch.is_tensor(s) else s) for x in xi], sq


def apgd_step(space, x, x_prev, g, xx, eta, rho, a):
    """One Auto-PGD update without the gradient evaluation:

        d = ascent_direction(g),  z = P(x + η d/‖d‖),  x_new = P(x + a(z − x) + (1 − a)(x − x_prev))

    with P the radial step into the ball (the iterates stay horizontal, see the module doc).
    ``xx`` is ‖x‖² when the space has a ``gradient_pairing`` (then ‖d‖ and ‖x + s d‖ come from
    element-wise pairings, and only ‖x_new‖ is a metric norm), else ignored.
    Returns (x_new, ‖x_new‖² or None)."""
    pairing = getattr(space, "gradient_pairing", None)
    if pairing is None:
        d = space.ascent_direction(x, g)
        dd = torch.as_tensor(space.inner(d, d))
    elif hasattr(space, "ascent_step"):  # d, ‖d‖² and ⟨x, ∇⟩_F in one pass (e.g. from cotangents)
        d, dd, xg = space.ascent_step(x, g)
    else:
        d = space.ascent_direction(x, g)
        dd, xg = torch.as_tensor(pairing(d, g)), pairing(x, g)
    # normalised step η d/‖d‖ (0 when d = 0), kept on the device: no host synchronisation here
    dd = dd.clamp_min(0)
    dn = dd.sqrt()
    step = torch.where(dn > 0, eta / dn, torch.zeros_like(dn))
    if pairing is None:
        clip = getattr(space, "clip", space.project)
        z = clip(lincomb([(1.0, x), (step, d)]), rho)
        # x + a(z − x) + (1 − a)(x − x_prev) = a z + (2 − 2a) x − (1 − a) x_prev
        terms = [(a, z)] + ([(2 - 2 * a, x), (a - 1, x_prev)] if a != 1 else [])
        return clip(getattr(space, "lincomb", lincomb)(terms), rho), None
    zz = xx + 2 * step * xg + step * step * dd  # ‖x + step·d‖²
    s, _ = _clip_factor(zz, rho, None)  # z = s (x + step·d)
    s = 1.0 if s is None else s
    # x_new = x + a(z − x) + (1 − a)(x − x_prev) = (2 − 2a + a s) x + a s step d − (1 − a) x_prev,
    # formed in one combination (z is never built)
    terms = [(2 - 2 * a + a * s, x), (a * s * step, d)] + ([(a - 1, x_prev)] if a != 1 else [])
    x_new = getattr(space, "lincomb", lincomb)(terms)
    return radial_clip(x_new, space.inner(x_new, x_new), rho)


def apgd(f_and_grad, space, rho: float, n_iter: int = 20, random_start: bool = False,
         generator: torch.Generator | None = None, momentum: float = 0.75,
         rho_osc: float = 0.75) -> APGDResult:
    """Maximise f over the horizontal g-ball of radius ``rho``; ``f_and_grad(xi) -> (float, egrad)``."""
    x = space.random(rho, generator) if random_start else space.zeros()
    x = space.project(x, rho)
    xx = space.inner(x, x) if getattr(space, "gradient_pairing", None) is not None else None  # ‖x‖²
    f, g = f_and_grad(x)
    f0 = f
    values, steps = [f], []
    x_best, f_best, g_best, xx_best = x, f, g, xx
    x_prev = x
    eta = 2.0 * rho
    checkpoints = set(apgd_checkpoints(n_iter))
    last_check = 0
    halved_at_last_check = False
    f_best_at_last_check = f_best
    increases = 0
    for k in range(n_iter):
        x_new, xx_new = apgd_step(space, x, x_prev, g, xx, eta, rho, 1.0 if k == 0 else momentum)
        f_new, g_new = f_and_grad(x_new)
        values.append(f_new)
        steps.append(eta)
        if f_new > f:
            increases += 1
        x_prev, x, f, g, xx = x, x_new, f_new, g_new, xx_new
        if f_new > f_best:
            x_best, f_best, g_best, xx_best = x_new, f_new, g_new, xx_new
        it = k + 1
        if it in checkpoints and it < n_iter:
            oscillating = increases < rho_osc * (it - last_check)
            stalled = (not halved_at_last_check) and f_best <= f_best_at_last_check
            halved_at_last_check = oscillating or stalled
            if halved_at_last_check:
                eta /= 2.0
                x, f, g, xx = x_best, f_best, g_best, xx_best
            f_best_at_last_check = f_best
            last_check = it
            increases = 0
    return APGDResult(best_value=f_best, start_value=f0, best_xi=x_best, values=values, step_sizes=steps)
