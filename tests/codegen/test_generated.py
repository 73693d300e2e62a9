"""Generated kernels: up to date, equal to the torch.func Koszul reference (rung 3), second-order
geodesic error O(t³) against an integrated ODE (rung 4), invariant along orbits, batched, float32,
autograd-friendly."""
import importlib

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from codegen.builtins import BUILTIN_GEOMETRIES, generate_builtins
from codegen.generate import GENERATED_DIR
from geosharp_ref.verification.kernel_checks import (
    acceleration_vs_koszul,
    geodesic_order,
    gradient_error,
    invariance_errors,
    projection_errors,
    second_order_vjp_error,
)
from geosharp_ref.verification.reference import geodesic_acceleration as koszul
from geosharp_ref.sampling import sample_point, sample_tangent

MODULES = list(BUILTIN_GEOMETRIES)
GL = ["gl_inv", "gl_mix"]


def test_generated_modules_are_not_stale():
    """Regenerating from the derivations reproduces the committed files byte for byte."""
    modules, _ = generate_builtins()
    stale = [m.name for m in modules if (GENERATED_DIR / f"{m.name}.py").read_text() != m.source]
    assert not stale, f"stale generated modules {stale}: run `geosharp derive` and commit"


def test_generated_modules_carry_header_and_no_sympy():
    for name in MODULES:
        text = (GENERATED_DIR / f"{name}.py").read_text()
        assert text.startswith("# GENERATED FILE - DO NOT EDIT.")
        assert "geosharp derive" in text.splitlines()[2]
        assert "sympy" not in text and "linalg.inv(" not in text


# -- rung 3: kernels vs the metric-only torch.func reference ----------------------------------------

def _inv_metric(point, xi, eta):  # written by hand from docs/MATH.md, independent of the engine
    G, H = point
    return (torch.trace(torch.linalg.solve(G.T @ G, xi[0].T @ eta[0]))
            + torch.trace(torch.linalg.solve(H.T @ H, xi[1].T @ eta[1])))


def _mix_metric(point, xi, eta):
    G, H = point
    return torch.trace(H.T @ H @ xi[0].T @ eta[0]) + torch.trace(G.T @ G @ xi[1].T @ eta[1])


@given(n=st.integers(1, 5), m=st.integers(1, 5), h=st.integers(1, 3), seed=st.integers(0, 10_000),
       kind=st.sampled_from(["inv", "mix"]))
def test_gl_acceleration_equals_handwritten_metric_koszul(n, m, h, seed, kind):
    h = min(h, n, m)
    mod = importlib.import_module(f"codegen.generated.gl_{kind}")
    point = sample_point(mod, sizes={"n": n, "m": m, "h": h}, seed=seed)
    xi = sample_tangent(mod, point, seed=seed + 1)
    got = mod.geodesic_acceleration(*point, *xi)
    ref = koszul(_inv_metric if kind == "inv" else _mix_metric, point, xi)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name", MODULES)
@given(seed=st.integers(0, 10_000))
def test_acceleration_equals_koszul_of_generated_metric(name, seed):
    assert acceleration_vs_koszul(name, seed=seed) < 1e-9


@pytest.mark.parametrize("name", MODULES)
@given(seed=st.integers(0, 10_000), batch=st.lists(st.integers(1, 3), min_size=0, max_size=2))
def test_batched_kernels_equal_per_item_kernels(name, seed, batch):
    """Leading dims (layers × heads) broadcast: a batched call equals calls per item."""
    mod = importlib.import_module(f"codegen.generated.{name}")
    if mod.ELEMENTWISE:
        batch = []  # element-wise kernels are batched by construction
    point = sample_point(mod, batch=tuple(batch), seed=seed)
    xi = sample_tangent(mod, point, seed=seed + 1)
    kw = {} if mod.ELEMENTWISE else {"eps": 0.0}
    full = mod.geodesic_acceleration(*point, *xi, **kw)
    proj = mod.horizontal_projection(*point, *xi, **kw)
    flat_p = [p.reshape(-1, *p.shape[len(batch):]) for p in point]
    flat_x = [x.reshape(-1, *x.shape[len(batch):]) for x in xi]
    for i in range(flat_p[0].shape[0]):
        one = mod.geodesic_acceleration(*[p[i] for p in flat_p], *[x[i] for x in flat_x], **kw)
        onep = mod.horizontal_projection(*[p[i] for p in flat_p], *[x[i] for x in flat_x], **kw)
        for f, o in zip(full, one):
            torch.testing.assert_close(f.reshape(-1, *o.shape)[i], o, rtol=1e-12, atol=1e-12)
        for f, o in zip(proj, onep):
            torch.testing.assert_close(f.reshape(-1, *o.shape)[i], o, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", MODULES)
def test_float32_agrees_with_float64(name):
    mod = importlib.import_module(f"codegen.generated.{name}")
    p64 = sample_point(mod, batch=(4,) if not mod.ELEMENTWISE else (), seed=5)
    x64 = sample_tangent(mod, p64, seed=6)
    kw = {} if mod.ELEMENTWISE else {"eps": 0.0}
    for fn in (mod.geodesic_acceleration, mod.horizontal_projection):
        r64 = fn(*p64, *x64, **kw)
        r32 = fn(*[p.float() for p in p64], *[x.float() for x in x64], **kw)
        for a, b in zip(r32, r64):
            assert a.dtype == torch.float32
            torch.testing.assert_close(a.double(), b, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("name", GL + ["diag_mix"])
def test_kernels_are_differentiable(name):
    mod = importlib.import_module(f"codegen.generated.{name}")
    point = sample_point(mod, sizes={"n": 3, "m": 2, "h": 2}, seed=3, elementwise_len=3)
    xi = sample_tangent(mod, point, seed=4)
    kw = {} if mod.ELEMENTWISE else {"eps": 0.0}

    def f(*args):
        k = len(point)
        acc = mod.geodesic_acceleration(*args[:k], *args[k:], **kw)
        proj = mod.horizontal_projection(*args[:k], *args[k:], **kw)
        return sum(a.sum() for a in acc) + sum((p ** 2).sum() for p in proj)

    args = tuple(t.clone().requires_grad_(True) for t in point + xi)
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-6)


# -- projection, gradient, invariance ------------------------------------------------------------

@pytest.mark.parametrize("name", MODULES)
@given(seed=st.integers(0, 10_000))
def test_projection_is_horizontal_idempotent_orthogonal(name, seed):
    horiz, idem, orth = projection_errors(name, seed=seed)
    assert horiz < 1e-9 and idem < 1e-9 and orth < 1e-9


@pytest.mark.parametrize("name", MODULES)
def test_riemannian_gradient_represents_euclidean_differential(name):
    assert gradient_error(name, seed=7) < 1e-10


@pytest.mark.parametrize("name", MODULES)
@given(seed=st.integers(0, 10_000), log_scale=st.floats(-2, 2))
def test_metric_and_acceleration_invariant_along_orbits(name, seed, log_scale):
    """Rung 5 at kernel level: for A = a·Ã, a ∈ [1e-2, 1e2], metric values are unchanged and γ̈
    transforms like a tangent vector."""
    ginv, ainv = invariance_errors(name, seed=seed, scale=10.0 ** log_scale)
    assert ginv < 1e-8 and ainv < 1e-8


@pytest.mark.parametrize("name", GL)
def test_eps_relaxation_handles_rank_deficient_weights(name):
    """Without relaxation a rank-deficient G has no (GᵀG)⁻¹ (Cholesky fails loudly); with ε > 0 the
    kernels are finite, and on full-rank weights a tiny ε changes results only at order ε."""
    mod = importlib.import_module(f"codegen.generated.{name}")
    G, H = sample_point(mod, seed=1)
    xi = sample_tangent(mod, (G, H), seed=2)
    Gd = G.clone()
    Gd[:, 1] = Gd[:, 0]
    with pytest.raises(torch.linalg.LinAlgError):
        mod.geodesic_acceleration(Gd, H, *xi)
    for fn in (mod.horizontal_projection, mod.geodesic_acceleration):
        assert all(torch.isfinite(o).all() for o in fn(Gd, H, *xi, eps=1e-4))
        exact, relaxed = fn(G, H, *xi), fn(G, H, *xi, eps=1e-9)
        for a, b in zip(exact, relaxed):
            assert 0 < float((a - b).abs().max()) < 1e-6 * float(a.abs().max())


# -- rung 4: second-order geodesic vs integrated ODE ---------------------------------------------

@pytest.mark.parametrize("name", [m for m in MODULES if m != "translation"])
def test_second_order_geodesic_error_is_cubic(name):
    slope, errs = geodesic_order(name, seed=2)
    assert 2.7 < slope < 3.3, (slope, errs)
    assert all(np.diff(np.log(errs)) < 0)


def test_translation_geodesics_are_straight_lines():
    slope, errs = geodesic_order("translation", seed=2)
    assert max(errs) < 1e-12


# -- second-order geodesic and its generated VJP ---------------------------------------------------

@pytest.mark.parametrize("name", MODULES)
@given(seed=st.integers(0, 10_000))
def test_second_order_geodesic_and_vjp_equal_autograd(name, seed):
    """Generated E(ξ) = θ + ξ + ½γ̈ and its generated VJP (with and without saved products) vs torch.func.vjp of θ + ξ + ½γ̈ built
    from the acceleration kernel (float64, random cotangent)."""
    assert second_order_vjp_error(name, seed=seed) < 1e-12


class _CountProducts(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts matrix products by the size of what they contract or produce (n·h² ones are 'large')."""

    def __init__(self, large):
        super().__init__()
        self.large, self.counts = large, {"large": 0, "small": 0, "big_elementwise": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.bmm.default, torch.ops.aten.mm.default):
            a, b = args[0], args[1]
            big = max(a.shape[-2], a.shape[-1], b.shape[-1]) >= self.large
            self.counts["large" if big else "small"] += 1
        elif func in (torch.ops.aten.add.Tensor, torch.ops.aten.sub.Tensor, torch.ops.aten.mul.Tensor) \
                and torch.is_tensor(out) and out.shape[-2:].numel() >= self.large:
            self.counts["big_elementwise"] += 1
        return out


@pytest.mark.parametrize("name", GL)
def test_second_order_geodesic_cost(name):
    """The cost rules hold for E and its VJP: with a cache, E takes 8 products of size n·h²
    (per block: two Gram-type reductions, B·(I + …) and ξ·(I + …)) and one n×h addition per
    block; the VJP takes 12 (six reductions shared across terms, two big products per block more),
    10 with the forward's Gᵀξ_G, Hᵀξ_H passed as ``saved``, and gives the same result."""
    mod = importlib.import_module(f"codegen.generated.{name}")
    point = sample_point(mod, batch=(2,), sizes={"n": 40, "m": 30, "h": 3}, seed=0)
    xi, cot = sample_tangent(mod, point, seed=1), sample_tangent(mod, point, seed=2)
    cache = mod.prepare(*point)
    with _CountProducts(large=30) as fwd:
        *E, saved = mod.second_order_geodesic_fwd(*point, *xi, cache=cache)
    with _CountProducts(large=30) as bwd:
        vjp = mod.second_order_geodesic_vjp(*point, *xi, *cot, cache=cache)
    with _CountProducts(large=30) as bwd_saved:
        vjp_saved = mod.second_order_geodesic_vjp(*point, *xi, *cot, cache=cache, saved=saved)
    assert fwd.counts["large"] == 8 and fwd.counts["big_elementwise"] == 2, fwd.counts
    assert bwd.counts["large"] == 12 and bwd.counts["big_elementwise"] == 4, bwd.counts
    assert len(saved) == 2 and bwd_saved.counts["large"] == 10, bwd_saved.counts  # Gᵀξ_G, Hᵀξ_H reused
    assert len(E) == 2  # (E_G, E_H); their values are checked against autograd above
    for a, b in zip(vjp, vjp_saved):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
