"""Numerical verification of generated kernel modules (verification ladder rungs 3–5).

Each check compares a generated kernel with an independent computation:

* ``acceleration_vs_koszul``: γ̈(0) from the kernel vs −Γ(ξ, ξ) computed by torch.func from the
  metric alone (:mod:`geosharp_ref.verification.reference`), float64;
* ``projection``: C(proj ξ) = 0 (horizontal), proj(proj ξ) = proj ξ (idempotent), and the removed part
  is g-orthogonal to the result;
* ``gradient``: g(grad f, η) = ⟨∇f, η⟩_F for random η (definition of the Riemannian gradient);
* ``invariance``: g_{ψ(A,θ)}(dψ ξ, dψ η) = g_θ(ξ, η) and γ̈ is equivariant, for random A;
* ``geodesic_order``: ‖γ(t) − (θ + tξ + ½t²γ̈(0))‖ against a scipy-integrated geodesic decays as t³
  (slope of log error vs log t);
* ``second_order_vjp``: the generated E(ξ) = θ + ξ + ½γ̈(0) (also from ``second_order_geodesic_fwd``)
  and its generated vector-Jacobian product (with and without the forward's saved products) against
  θ + ξ + ½γ̈ built from the acceleration kernel and differentiated by ``torch.func.vjp``.

All use random well-conditioned inputs; no SymPy is imported.
"""
from __future__ import annotations


import numpy as np
import torch

from ..kernels import BUILTIN_MODULES, load_kernels
from .reference import geodesic_acceleration as koszul_acceleration
from .reference import integrate_geodesic
from .sampling import sample_group_element, sample_point, sample_tangent

__all__ = ["run_checks",
           "verification_table", "BUILTIN_MODULES"]

def _rel(a, b):
    num = max(float((x - y).abs().max()) for x, y in zip(a, b))
    den = max(max(float(y.abs().max()) for y in b), 1e-300)
    return num / den


def _eps_kw(mod):
    return {} if mod.ELEMENTWISE else {"eps": 0.0}


def _elementwise_metric(mod):
    """Metric on full tensors: per-coordinate metric summed over coordinates."""
    def g(point, xi, eta):
        val = mod.inner(*point, *xi, *eta, **_eps_kw(mod))
        return val.sum()
    return g


def acceleration_vs_koszul(mod, seed=0, sizes=None):
    mod = load_kernels(mod)
    point = sample_point(mod, sizes=sizes, seed=seed)
    xi = sample_tangent(mod, point, seed=seed + 1)
    got = mod.geodesic_acceleration(*point, *xi, **_eps_kw(mod))
    ref = koszul_acceleration(_elementwise_metric(mod), point, xi)
    return _rel(got, ref)


def projection_errors(mod, seed=0, batch=(2, 3), dtype=torch.float64, sizes=None):
    """(horizontal residual, idempotence error, orthogonality) relative errors."""
    mod = load_kernels(mod)
    point = sample_point(mod, batch=batch, sizes=sizes, seed=seed, dtype=dtype)
    xi = sample_tangent(mod, point, seed=seed + 1)
    kw = _eps_kw(mod)
    p = mod.horizontal_projection(*point, *xi, **kw)
    res = mod.horizontal_residual(*point, *p, **kw)
    res0 = mod.horizontal_residual(*point, *xi, **kw)
    horiz = float(res.abs().max() / res0.abs().max().clamp_min(1e-300))
    pp = mod.horizontal_projection(*point, *p, **kw)
    idem = _rel(pp, p)
    removed = tuple(x - y for x, y in zip(xi, p))
    ortho = mod.inner(*point, *p, *removed, **kw)
    scale = mod.inner(*point, *xi, *xi, **kw)
    orth = float((ortho.abs() / scale.abs()).max())
    return horiz, idem, orth


def gradient_error(mod, seed=0, batch=(2,), dtype=torch.float64):
    mod = load_kernels(mod)
    point = sample_point(mod, batch=batch, seed=seed, dtype=dtype)
    egrad = sample_tangent(mod, point, seed=seed + 1)
    eta = sample_tangent(mod, point, seed=seed + 2)
    kw = _eps_kw(mod)
    rg = mod.riemannian_gradient(*point, *egrad, **kw)
    lhs = mod.inner(*point, *rg, *eta, **kw)
    if mod.ELEMENTWISE:
        rhs = sum(e * t for e, t in zip(egrad, eta))
    else:
        rhs = sum((e * t).sum((-2, -1)) for e, t in zip(egrad, eta))
    return float(((lhs - rhs).abs() / rhs.abs().clamp_min(1e-12)).max())


def invariance_errors(mod, seed=0, batch=(3,), scale=1.0, dtype=torch.float64):
    """(metric invariance, acceleration equivariance) relative errors under a random A."""
    mod = load_kernels(mod)
    point = sample_point(mod, batch=batch, seed=seed, dtype=dtype)
    xi = sample_tangent(mod, point, seed=seed + 1)
    eta = sample_tangent(mod, point, seed=seed + 2)
    A = sample_group_element(mod, point, seed=seed + 3, scale=scale)
    kw = _eps_kw(mod)
    moved = mod.act(*point, A)
    push = _pushforward(mod, point, A)
    pxi, peta = push(xi), push(eta)
    g0 = mod.inner(*point, *xi, *eta, **kw)
    g1 = mod.inner(*moved, *pxi, *peta, **kw)
    ginv = float(((g1 - g0).abs() / g0.abs().clamp_min(1e-12)).max())
    a0 = push(mod.geodesic_acceleration(*point, *xi, **kw))
    a1 = mod.geodesic_acceleration(*moved, *pxi, **kw)
    return ginv, _rel(a1, a0)


def _pushforward(mod, point, A):
    """dψ_A(ξ) by forward-mode differentiation of the generated action (no formula assumed)."""
    def push(xi):
        return torch.func.jvp(lambda *p: mod.act(*p, A), tuple(point), tuple(xi))[1]
    return push


def geodesic_order(mod, seed=0, ts=(0.08, 0.04, 0.02, 0.01)):
    """Slope of log‖γ(t) − second-order expansion‖ vs log t (3 expected) and the errors."""
    mod = load_kernels(mod)
    point = sample_point(mod, seed=seed)
    xi = mod.horizontal_projection(*point, *sample_tangent(mod, point, seed=seed + 1), **_eps_kw(mod))
    acc = mod.geodesic_acceleration(*point, *xi, **_eps_kw(mod))

    def rhs(p, v):
        return mod.geodesic_acceleration(*p, *v, **_eps_kw(mod))

    errs = []
    for t in ts:
        exact, _ = integrate_geodesic(rhs, point, xi, t)
        approx = tuple(p + t * x + 0.5 * t * t * a for p, x, a in zip(point, xi, acc))
        errs.append(max(float((e - a).abs().max()) for e, a in zip(exact, approx)))
    slope = float(np.polyfit(np.log(ts), np.log(np.maximum(errs, 1e-300)), 1)[0])
    return slope, errs


def second_order_vjp_error(mod, seed=0, batch=(2,), dtype=torch.float64):
    """Max relative error of the generated ``second_order_geodesic`` (value) and
    ``second_order_geodesic_vjp`` (for a random cotangent) against autograd through θ + ξ + ½γ̈."""
    mod = load_kernels(mod)
    point = sample_point(mod, batch=batch, seed=seed, dtype=dtype)
    xi = sample_tangent(mod, point, seed=seed + 1)
    cot = sample_tangent(mod, point, seed=seed + 2)
    kw = _eps_kw(mod)

    def reference(*v):
        acc = mod.geodesic_acceleration(*point, *v, **kw)
        return tuple(p + x + 0.5 * a for p, x, a in zip(point, v, acc))

    value, pullback = torch.func.vjp(reference, *xi)
    got_value = mod.second_order_geodesic(*point, *xi, **kw)
    *fwd_value, saved = mod.second_order_geodesic_fwd(*point, *xi, **kw)
    ref_vjp = pullback(tuple(cot))
    got_vjp = mod.second_order_geodesic_vjp(*point, *xi, *cot, **kw)
    got_vjp_saved = mod.second_order_geodesic_vjp(*point, *xi, *cot, saved=saved, **kw)
    return max(_rel(got_value, value), _rel(fwd_value, value), _rel(got_vjp, ref_vjp),
               _rel(got_vjp_saved, ref_vjp))


def run_checks(name, seed=0) -> dict:
    mod = load_kernels(name)
    horiz, idem, orth = projection_errors(mod, seed=seed)
    ginv, ainv = invariance_errors(mod, seed=seed)
    slope, errs = geodesic_order(mod, seed=seed)
    return {
        "module": getattr(mod, "__name__", str(name)).rsplit(".", 1)[-1],
        "projection": mod.PROJECTION_KIND,
        "accel_vs_koszul": acceleration_vs_koszul(mod, seed=seed),
        "horizontal": horiz,
        "idempotent": idem,
        "orthogonal": orth,
        "gradient": gradient_error(mod, seed=seed),
        "metric_invariance": ginv,
        "accel_equivariance": ainv,
        "second_order_vjp": second_order_vjp_error(mod, seed=seed),
        "geodesic_slope": slope,
        "geodesic_err_min_t": errs[-1],
    }


def verification_table(names=BUILTIN_MODULES, tol=1e-9) -> tuple[bool, str]:
    """Run all checks on the modules; (all passed, printable table)."""
    cols = ["accel_vs_koszul", "horizontal", "idempotent", "orthogonal", "gradient",
            "metric_invariance", "accel_equivariance", "second_order_vjp"]
    head = f"{'module':<12s} {'proj':<10s} " + " ".join(f"{c[:12]:>12s}" for c in cols) + f" {'t^k slope':>9s}"
    lines = [head, "-" * len(head)]
    ok = True
    for name in names:
        r = run_checks(name)
        row_ok = all(r[c] < tol for c in cols)
        flat = r["geodesic_err_min_t"] < 1e-12  # flat metric: the expansion is exact
        row_ok = row_ok and (flat or abs(r["geodesic_slope"] - 3) < 0.3)
        ok &= row_ok
        slope = "exact" if flat else f"{r['geodesic_slope']:.2f}"
        lines.append(f"{r['module']:<12s} {r['projection']:<10s} "
                     + " ".join(f"{r[c]:12.1e}" for c in cols) + f" {slope:>9s}"
                     + ("" if row_ok else "  FAIL"))
    lines.append(f"(relative errors in float64, tolerance {tol:g}; slope of the second-order geodesic "
                 "error against an integrated ODE, 3 expected)")
    return ok, "\n".join(lines)
