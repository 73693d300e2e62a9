"""Independent, SymPy-free reference for geodesic accelerations (verification ladder rungs 3 and 4).

Everything here is computed from the metric *alone* with ``torch.func``; nothing is derived
symbolically, so it cross-checks the SymPy derivations and the generated kernels.

Coordinates. A point is a tuple of float64 tensors, e.g. ``(G, H)``; a tangent vector has the same
structure, e.g. ``(xi_G, xi_H)``. Internally both are flattened into one coordinate vector x ∈ Rᴺ
(concatenation of the row-major flattenings), so "coordinate fields" are the N unit vectors eₖ.

Koszul formula for coordinate fields. For a metric g_x(ξ, η) = ξᵀ G(x) η, the Levi-Civita
connection satisfies, for constant (coordinate) fields ξ, η,

    g(Γ(ξ, ξ), η) = D_ξ g(·)(ξ, η) − ½ D_η g(·)(ξ, ξ)          for all η,

(equivalently the Euler–Lagrange equation of the energy ½∫ g(γ̇, γ̇):
G γ̈ + (D_γ̇ G) γ̇ − ½ ∇ₓ(γ̇ᵀ G γ̇) = 0), so with b(ξ) := (D_ξ G) ξ − ½ ∇ₓ(ξᵀ G(x) ξ) ∈ Rᴺ

    Γ(ξ, ξ) = G(x)⁻¹ b(ξ),          γ̈(0) = −Γ(ξ, ξ).

Cost: one N×N metric matrix and one dense solve, so use small sizes (N ≲ a few hundred).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from torch.func import grad, jacrev, jvp


__all__ = ["christoffel_contraction", "geodesic_acceleration", "integrate_geodesic",
           "metric_matrix"]


def _as_tuple(x) -> tuple[tuple[torch.Tensor, ...], bool]:
    if isinstance(x, torch.Tensor):
        return (x,), True
    return tuple(x), False


def _flatten(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.reshape(-1) for p in parts])


def _unflattener(like: Sequence[torch.Tensor]) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    shapes = [p.shape for p in like]
    sizes = [p.numel() for p in like]

    def unflatten(v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(c.reshape(s) for c, s in zip(torch.split(v, sizes), shapes))

    return unflatten


def _flat_metric(metric, point):
    """g(x, ξ, η) on flat float64 vectors, plus the flat point and the unflattener."""
    parts, single = _as_tuple(point)
    for i, p in enumerate(parts):
        if p.dtype != torch.float64:
            raise ValueError(f"point[{i}] must be float64, got {p.dtype}")
    unflatten = _unflattener(parts)

    def wrap(v):
        t = unflatten(v)
        return t[0] if single else t

    def g(x, xi, eta):
        return metric(wrap(x), wrap(xi), wrap(eta))

    return g, _flatten(parts), unflatten, single


def metric_matrix(metric, point) -> torch.Tensor:
    """The N×N matrix G_ij = g_x(e_i, e_j) in flattened coordinates (for inspection/tests)."""
    g, x, _, _ = _flat_metric(metric, point)
    zero = torch.zeros_like(x)
    # ∇_η g(x, ξ, η) = G ξ (g is linear in η); its Jacobian in ξ is G.
    return jacrev(grad(g, argnums=2), argnums=1)(x, zero, zero)


def christoffel_contraction(metric, point, xi):
    """Γ(ξ, ξ) at ``point`` from the metric alone (Koszul formula for coordinate fields).

    Args:
        metric: ``metric(point, xi, eta) -> scalar tensor``, bilinear in (xi, eta), smooth in point.
        point: tuple of float64 tensors (unbatched), e.g. ``(G, H)``; a bare tensor is accepted.
        xi: tangent vector, same structure and shapes as ``point``.
    Returns:
        Γ(ξ, ξ) shaped like ``point`` (tuple, or a tensor if ``point`` was a tensor), where
        G(x) Γ(ξ, ξ) = (D_ξ G) ξ − ½ ∇ₓ(ξᵀ G(x) ξ).
    """
    g, x, unflatten, single = _flat_metric(metric, point)
    xi_parts, _ = _as_tuple(xi)
    if len(xi_parts) != len(unflatten(x)) or any(
            a.shape != b.shape for a, b in zip(xi_parts, unflatten(x))):
        raise ValueError("xi must have the same structure and shapes as point: got "
                         f"{[tuple(a.shape) for a in xi_parts]} vs "
                         f"{[tuple(b.shape) for b in unflatten(x)]}")
    v = _flatten(xi_parts).to(torch.float64)
    zero = torch.zeros_like(x)

    # metric matrix G(x): Jacobian in ξ of ∇_η g(x, ξ, η) = G(x) ξ
    Gx = jacrev(grad(g, argnums=2), argnums=1)(x, zero, zero)
    # b1 = (D_ξ G) ξ : directional derivative in x (direction ξ) of x ↦ G(x) ξ
    _, b1 = jvp(lambda y: grad(g, argnums=2)(y, v, zero), (x,), (v,))
    # b2 = ∇ₓ g_x(ξ, ξ)
    b2 = grad(g, argnums=0)(x, v, v)
    gamma = torch.linalg.solve(Gx, b1 - 0.5 * b2)
    out = unflatten(gamma)
    return out[0] if single else out


def geodesic_acceleration(metric, point, xi):
    """γ̈(0) = −Γ(ξ, ξ) for the geodesic with γ(0) = point, γ̇(0) = xi (same shapes as point)."""
    gam = christoffel_contraction(metric, point, xi)
    if isinstance(gam, torch.Tensor):
        return -gam
    return tuple(-c for c in gam)


def integrate_geodesic(acceleration_fn, point, xi, t, rtol: float = 1e-12, atol: float = 1e-14):
    """Integrate γ̈ = acceleration_fn(γ, γ̇) from γ(0) = point, γ̇(0) = xi up to time ``t``.

    ``acceleration_fn(point_tuple, velocity_tuple) -> tuple`` works on tuples of float64 tensors
    (e.g. ``lambda p, v: geodesic_acceleration(metric, p, v)`` or a generated kernel). The state
    (γ, γ̇) is flattened into one float64 vector and integrated with
    ``scipy.integrate.solve_ivp(method="DOP853", rtol=rtol, atol=atol)``.

    Returns ``(γ(t), γ̇(t))``, each shaped like ``point`` (tuple, or tensor if point was a tensor).
    Raises ``RuntimeError`` if the integrator fails.
    """
    from scipy.integrate import solve_ivp

    parts, single = _as_tuple(point)
    xi_parts, _ = _as_tuple(xi)
    unflatten = _unflattener(parts)
    x0 = _flatten(parts).detach().to(torch.float64)
    v0 = _flatten(xi_parts).detach().to(torch.float64)
    n = x0.numel()

    def wrap(v):
        tup = unflatten(v)
        return tup[0] if single else tup

    def rhs(_s, y):
        yt = torch.from_numpy(np.ascontiguousarray(y))
        x, v = yt[:n], yt[n:]
        with torch.no_grad():
            acc = acceleration_fn(wrap(x), wrap(v))
        acc_parts, _ = _as_tuple(acc)
        return np.concatenate([y[n:], _flatten(acc_parts).detach().to(torch.float64).numpy()])

    y0 = torch.cat([x0, v0]).numpy()
    t = float(t)
    if t == 0.0:
        yT = y0
    else:
        sol = solve_ivp(rhs, (0.0, t), y0, method="DOP853", rtol=rtol, atol=atol)
        if not sol.success:
            raise RuntimeError(f"geodesic integration failed: {sol.message}")
        yT = sol.y[:, -1]
    yT = torch.from_numpy(np.array(yT, dtype=np.float64))
    return wrap(yT[:n]), wrap(yT[n:])
