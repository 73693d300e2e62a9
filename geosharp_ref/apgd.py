"""Auto-PGD (Croce & Hein 2020) over a tangent space with a Riemannian norm ball.

Maximises f(ξ) over {ξ horizontal, ‖ξ‖_g ≤ ρ}. The space object supplies the geometry through the
written protocol :class:`Space` (no optional methods, nothing probed): starting points, the metric g,
the projection onto the horizontal g-ball, one ascent step (the direction d with the two pairings the
step sizes need), linear combinations and rescaling of tangent vectors.

The iteration (L2 version, step normalised in the metric):

    z = P(x_k + η d_k / ‖d_k‖_g)
    x_{k+1} = P(x_k + α (z − x_k) + (1 − α)(x_k − x_{k−1})),   α = 0.75 (α = 1 on the first step)

with P the radial step into the g-ball: the iterates are linear combinations of horizontal vectors (the
start is projected, every d is horizontal) and the horizontal projection is idempotent, so only the radial
step remains. For any inner product

    ‖x + t d‖² = ‖x‖² + 2t g(x, d) + t² g(d, d),

so with ``space.ascent_step(x, ∇) -> (d, g(d, d), g(x, d))`` the radial factor s of z = s (x + t d) costs
no pass over the parameters, x_{k+1} before its clip is the single combination
(2 − 2α + α s) x_k + α s t d_k − (1 − α) x_{k−1} (z is never formed), and only the new iterate's norm is a
metric norm.

Initial η = 2ρ. At checkpoints w_j = ⌈p_j N⌉, p₀ = 0, p₁ = 0.22,
p_{j+1} = p_j + max(p_j − p_{j−1} − 0.03, 0.06), the step is halved and the iterate restarts from
the best point when (1) fewer than 75 % of the steps since the last checkpoint increased f, or
(2) the step was not halved at the last checkpoint and the best value has not improved since.
The best iterate is kept, and with it its gradient (``keep_best_gradient``; by default where the vector holds fewer
bytes than :data:`KEEP_GRADIENT_BYTES` and than ``park_bytes``), so a restart from a best point older than the
current iterate costs no gradient evaluation: ``n_iter`` of them follow the one at the start. For larger vectors,
where memory counts, the best point's gradient is evaluated again at each restart instead (one more evaluation per
restart: 5 of the 26 of a 20-iteration run on MiniLM; where f and its gradient are deterministic functions of the
point, as on the CPU, the iterates are those of keeping it bit for bit, and a parameter-sized vector fewer is alive
between restarts; on a GPU a backward pass that accumulates with atomics can differ in its last bits when
repeated). A best point older than the current iterate is parked (:mod:`geosharp_ref.parking`: an anonymous
temporary file on the CPU, host memory on an accelerator) once the momentum step has used it (as x_prev) when it is
large (``park_bytes``, default :data:`PARK_BYTES` = 256 MiB: a 135 M-parameter float64 model's vector is 1.1 GB),
and restored bit for bit on a restart or at the end; the iterates do not change.

Host synchronisation: the step normalisation stays on the device; the only value read back per
iteration is f (returned as a float by ``f_and_grad``), which the best-iterate and step-size
bookkeeping needs anyway.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

from .parking import park

__all__ = ["PARK_BYTES", "KEEP_GRADIENT_BYTES", "Space", "ModelSpace", "apgd_checkpoints", "apgd", "APGDResult",
           "value_and_grad", "radial_clip", "apgd_step", "lincomb", "combine", "EuclideanSpace",
           "tensor_bytes"]


#: Auto-PGD keeps the best point's gradient for a restart where a tangent vector holds fewer bytes than this
#: (a MiniLM-L6's float32 vector, 91 MB, is kept; a 28 M-parameter float64 one, 224 MB, is evaluated again)
KEEP_GRADIENT_BYTES = 1 << 27
#: Auto-PGD parks an older best point of at least this many bytes (:mod:`geosharp_ref.parking`; see :func:`apgd`)
PARK_BYTES = 1 << 28


class Space(Protocol):
    """What :func:`apgd` uses of a perturbation space: a tangent space T at θ with a metric g, a
    horizontal subspace ℋ ⊂ T (g-orthogonal to the vertical directions of the symmetry) and the g-ball
    B_ρ = {ξ ∈ ℋ : ‖ξ‖_g ≤ ρ}. A tangent vector is a list of tensors (a space may return a list subclass
    that carries per-vector data, e.g. Gram products; Auto-PGD only passes it back to the space).

    * ``zeros()`` — 0 ∈ T.
    * ``random(rho, generator)`` — a random start (Auto-PGD projects it).
    * ``inner(xi, eta)`` — g(ξ, η), a 0-d tensor (may stay on the device).
    * ``project(xi, rho)`` — P_ℋ then radially into B_ρ: ξ ↦ s P_ℋ ξ, s = min(1, ρ/‖P_ℋ ξ‖_g) (exact
      projection onto B_ρ because P_ℋ is g-orthogonal and the ball is a g-ball).
    * ``ascent_step(xi, grad, consume=False) -> (d, g(d, d), g(ξ, d))`` — the ascent direction d ∈ ℋ at ξ for
      the gradient ``grad`` that the space's ``f_and_grad`` returned at ξ (for a Riemannian metric
      d = P_ℋ 𝔾⁻¹ ∂f/∂ξ, and then g(ξ, d) = ⟨ξ, ∂f/∂ξ⟩_F, g(d, d) = ⟨d, ∂f/∂ξ⟩_F: element-wise pairings), with
      the two pairings Auto-PGD needs for ‖x + t d‖² (any inner product: the space computes them as it can).
      ``consume=True``: ``grad`` is not used afterwards, and the space may release its tensors as d is formed.
      ``consume=False``: ``grad`` stays usable, and a second call with it gives the same d and pairings bit for
      bit (a space may cache what the first call computed in ``grad``): Auto-PGD steps a second time from the
      best point's kept gradient on a restart.
    * ``lincomb(terms, consume=None)`` — Σ cᵢ ξᵢ for ``terms`` = [(cᵢ, ξᵢ)], cᵢ numbers or 0-d tensors;
      ``consume``: one of the ξᵢ that is not used afterwards (the space may release its tensors as the sum is
      formed).

    Ownership: Auto-PGD passes ``consume`` for the gradient once the ascent direction is formed from it (unless it
    keeps that gradient, the best point's, for a restart) and for the direction once the next iterate is, so a
    space that releases them holds the direction in place of the gradient and the new iterate in place of the
    direction (a parameter-sized vector fewer at a time); a space may also ignore ``consume`` (the values are the
    same).
    * ``scale(xi, s)`` — s ξ (s a number or a 0-d tensor).
    """

    def zeros(self) -> list: ...

    def random(self, rho: float, generator: torch.Generator | None) -> list: ...

    def inner(self, xi: list, eta: list) -> torch.Tensor: ...

    def project(self, xi: list, rho: float) -> list: ...

    def ascent_step(self, xi: list, grad, consume: bool = False) -> tuple: ...

    def lincomb(self, terms: Sequence[tuple], consume: list | None = None) -> list: ...

    def scale(self, xi: list, s) -> list: ...


class ModelSpace(Space, Protocol):
    """A :class:`Space` of perturbations of a model's parameters θ (what the sharpness entry points use
    besides Auto-PGD): E(ξ) the perturbed parameters (γ_ξ(1), to second order), F(ξ) = L(E(ξ)).

    * ``perturbed_params(xi)`` — the parameter dict at E(ξ) (differentiable in ξ).
    * ``value_and_grad(loss_of_params)`` — ``f_and_grad(ξ) -> (float F(ξ), grad)``, ``grad`` in the form
      ``ascent_step`` takes (it need not be ∂F/∂ξ: e.g. cotangents ∂L/∂E of the perturbed blocks).
    * ``norm(xi)`` — ‖ξ‖_g as a float.
    """

    def perturbed_params(self, xi: list) -> dict: ...

    def value_and_grad(self, loss_of_params: Callable) -> Callable: ...

    def norm(self, xi: list) -> float: ...


class EuclideanSpace:
    """The plain Euclidean ball in Rⁿ as a :class:`Space` (everything horizontal, g = ⟨·,·⟩, d = ∇):
    the simplest space, for tests and examples. ``f_and_grad`` returns ∂f/∂x."""

    def __init__(self, dim: int, dtype=torch.float64):
        self.dim, self.dtype = dim, dtype

    def zeros(self):
        return [torch.zeros(self.dim, dtype=self.dtype)]

    def random(self, rho, generator=None):
        return [torch.randn(self.dim, generator=generator, dtype=self.dtype)]

    def inner(self, xi, eta):
        return torch.as_tensor(sum((x * y).sum() for x, y in zip(xi, eta)))

    def project(self, xi, rho):
        return radial_clip(xi, self.inner(xi, xi), rho)[0]

    def ascent_step(self, xi, grad, consume=False):
        return list(grad), self.inner(grad, grad), self.inner(xi, grad)

    def lincomb(self, terms, consume=None):
        return lincomb(terms, consume)

    def scale(self, xi, s):
        return [x * s for x in xi]


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


def lincomb(terms, consume=None):
    """Σᵢ cᵢ ξᵢ for tangent vectors (lists of tensors), ``terms`` = [(cᵢ, ξᵢ)]: one pass per term and
    one new tensor per entry; ``consume``: one of the ξᵢ, each of its entries released (set to None) once the
    result's entry that reads it exists."""
    out = []
    for j in range(len(terms[0][1])):
        out.append(combine([(c, v[j]) for c, v in terms]))
        if consume is not None:
            consume[j] = None
    return out


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


def _scale_list(xi, s):
    return [x * (s.to(x.dtype) if torch.is_tensor(s) else s) for x in xi]


def radial_clip(xi, sq_norm, rho, on_device: bool | None = None, scale=None):
    """(ξ · min(1, ρ/‖ξ‖), its squared norm) given ‖ξ‖² as a tensor.

    On accelerators (``on_device`` None: the norm's device is not the CPU) the factor stays on the
    device (no host synchronisation; ρ/0 = inf clamps to 1) and every ξ is rescaled; on the CPU,
    where reading the norm costs nothing, ξ inside the ball is returned as is (saves a pass over all
    parameters). ``on_device=True`` forces the synchronisation-free path (tests run it on the CPU).
    ``scale(ξ, s)`` rescales (a space's :meth:`Space.scale`; default: every tensor times s)."""
    if not xi:
        return xi, torch.as_tensor(sq_norm).clamp_min(0)
    s, sq = _clip_factor(sq_norm, rho, on_device)
    if s is None:
        return xi, sq
    return (scale or _scale_list)(xi, s), sq


def _next_iterate(space: Space, x, x_prev, ascent, xx, eta, rho, a, consume=False):
    """x + a(z − x) + (1 − a)(x − x_prev) before its clip, z = P(x + η d/‖d‖), from ``ascent`` = (d, g(d, d),
    g(x, d)) and ``xx`` = ‖x‖²: one combination (z is never built); ``consume``: d is released as it is formed."""
    d, dd, xg = ascent
    # normalised step η d/‖d‖ (0 when d = 0), kept on the device: no host synchronisation here
    dd = torch.as_tensor(dd).clamp_min(0)
    dn = dd.sqrt()
    step = torch.where(dn > 0, eta / dn, torch.zeros_like(dn))
    zz = xx + 2 * step * xg + step * step * dd  # ‖x + step·d‖²
    s, _ = _clip_factor(zz, rho, None)  # z = s (x + step·d)
    s = 1.0 if s is None else s
    # x_new = x + a(z − x) + (1 − a)(x − x_prev) = (2 − 2a + a s) x + a s step d − (1 − a) x_prev
    terms = [(2 - 2 * a + a * s, x), (a * s * step, d)] + ([(a - 1, x_prev)] if a != 1 else [])
    return space.lincomb(terms, consume=d if consume else None)


def apgd_step(space: Space, x, x_prev, g, xx, eta, rho, a):
    """One Auto-PGD update without the gradient evaluation:

        (d, g(d, d), g(x, d)) = space.ascent_step(x, g),  z = P(x + η d/‖d‖),
        x_new = P(x + a(z − x) + (1 − a)(x − x_prev))

    with P the radial step into the ball (the iterates stay horizontal, see the module doc) and
    ``xx`` = ‖x‖². Returns (x_new, ‖x_new‖²)."""
    x_new = _next_iterate(space, x, x_prev, space.ascent_step(x, g), xx, eta, rho, a)
    return radial_clip(x_new, space.inner(x_new, x_new), rho, scale=space.scale)


def apgd(f_and_grad, space: Space, rho: float, n_iter: int = 20, random_start: bool = False,
         generator: torch.Generator | None = None, momentum: float = 0.75,
         rho_osc: float = 0.75, start=None, park_bytes: int | None = PARK_BYTES,
         keep_best_gradient: bool | None = None, first: Callable | None = None) -> APGDResult:
    """Maximise f over the horizontal g-ball of radius ``rho``; ``f_and_grad(xi) -> (float, grad)`` with
    ``grad`` in the form ``space.ascent_step`` takes. ``start``: a tangent vector to start from (projected;
    overrides ``random_start``). ``park_bytes``: a best point older than the current iterate whose tensors hold
    at least this many bytes waits in an anonymous temporary file, once the momentum step has used it as x_prev,
    until a restart or the end needs it (:mod:`geosharp_ref.parking`: the same tensor objects get their values back
    bit for bit, so the iterates are unchanged; None: never). ``keep_best_gradient``: keep the best point's
    gradient for a restart (True), or evaluate it again there (False; a vector fewer alive); None: keep it where
    the vector holds fewer than :data:`KEEP_GRADIENT_BYTES` bytes and fewer than ``park_bytes`` (see the module
    doc). ``first``: ``first(x₀) -> (f, grad)`` in place of ``f_and_grad`` for the first evaluation, at the
    projected start x₀, where the caller has a cheaper way to the same values (the sharpness pipeline's
    :func:`~geosharp_ref.sharpness.pipeline.at_zero` from ξ = 0: a gradient at θ all of a model's runs share)."""
    if start is not None:
        x = [t.clone() for t in start]
    else:
        x = space.random(rho, generator) if random_start else space.zeros()
    x = space.project(x, rho)
    xx = space.inner(x, x)  # ‖x‖²
    f, g = (f_and_grad if first is None else first)(x)
    f0 = f
    values, steps = [f], []
    n = tensor_bytes(x)  # a vector Auto-PGD would park is not kept beside its parked point (halving the saving)
    keep = (n < KEEP_GRADIENT_BYTES and (park_bytes is None or n < park_bytes) if keep_best_gradient is None
            else bool(keep_best_gradient))
    x_best, f_best, xx_best = x, f, xx
    g_best = g if keep else None  # the best point's gradient (not kept: evaluated again on a restart)
    parked = None  # x_best's tensors in a temporary file while it is older than x (park_bytes)
    x_prev = x
    eta = 2.0 * rho
    checkpoints = set(apgd_checkpoints(n_iter))
    last_check = 0
    halved_at_last_check = False
    f_best_at_last_check = f_best
    increases = 0
    for k in range(n_iter):
        # apgd_step, with every vector dropped once spent: the space forms d in the gradient's place and x_new
        # in d's (consume), x_prev is dropped once x_new exists (it stays alive only while it is the best point),
        # so three tangent vectors are alive while combining (x, x_prev, d becoming x_new) and x, x_new, the
        # perturbed parameters and the new gradient while evaluating, besides an older best point. With the best
        # point's gradient kept (keep), that gradient is alive throughout as well (with the factors' states it
        # carries: for the fast GL factor its cotangent blocks and Gram products), and when x is the best point d
        # is formed beside it, not in its place
        ascent = space.ascent_step(x, g, consume=not (keep and x is x_best))
        g = g_new = None
        x_new = _next_iterate(space, x, x_prev, ascent, xx, eta, rho, 1.0 if k == 0 else momentum, consume=True)
        ascent = x_prev = None
        if parked is None and x_best is not x and park_bytes is not None and tensor_bytes(x_best) >= park_bytes:
            parked = park(list(x_best))  # an older best point (x_prev was the last use it had besides a restart)
        x_new, xx_new = radial_clip(x_new, space.inner(x_new, x_new), rho, scale=space.scale)
        f_new, g_new = f_and_grad(x_new)
        values.append(f_new)
        steps.append(eta)
        if f_new > f:
            increases += 1
        x_prev, x, f, g, xx = x, x_new, f_new, g_new, xx_new
        if f_new > f_best:
            parked = _discard(parked)
            x_best, f_best, xx_best = x_new, f_new, xx_new
            g_best = g_new if keep else None
        x_new = g_new = None  # held as x and g
        it = k + 1
        if it in checkpoints and it < n_iter:
            oscillating = increases < rho_osc * (it - last_check)
            stalled = (not halved_at_last_check) and f_best <= f_best_at_last_check
            halved_at_last_check = oscillating or stalled
            if halved_at_last_check:
                eta /= 2.0
                if x_best is not x:  # restart from an older best point, with its kept gradient or a new one
                    parked = _restore(parked)
                    x, g = x_best, None  # the current iterate and its gradient dropped first
                    f, xx = f_best, xx_best
                    g = g_best if keep else f_and_grad(x)[1]
            f_best_at_last_check = f_best
            last_check = it
            increases = 0
    _restore(parked)
    return APGDResult(best_value=f_best, start_value=f0, best_xi=x_best, values=values, step_sizes=steps)


def tensor_bytes(tensors) -> int:
    """Bytes held by an iterable of tensors: Σ numel·element_size, skipping ``None`` (a frozen slot)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _restore(parked) -> None:
    """Give a parked best point its values back (nothing when none is parked); the handle is spent."""
    if parked is not None:
        parked.restore()
    return None


def _discard(parked) -> None:
    """Drop a parked best point that a better one replaced; the handle is spent."""
    if parked is not None:
        parked.discard()
    return None
