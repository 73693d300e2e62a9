"""Generated kernels of the RoPE subgroup (rope_{half,interleaved}_{inv,mix}): the subgroup really keeps the scores of
Hugging Face-style rotate_half and interleaved rotary embeddings (full and partial), the projection equals a dense
least-squares g-orthogonal projection onto the span of the vertical vectors, inner / projection / gradient are
invariant (equivariant) under subgroup elements at scales 1e-2…1e2, the acceleration equals the metric-only Koszul
reference, the second-order geodesic is O(t³) against an integrated ODE, the cache is exact (float64)."""
import importlib
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from codegen import runtime as rt
from geosharp_ref.sampling import sample_point, sample_tangent
from geosharp_ref.verification.kernel_checks import (
    acceleration_vs_koszul,
    dense_projection_error,
    geodesic_order,
    projection_errors,
    second_order_vjp_error,
    subgroup_equivariance_errors,
)

ROPE = ["rope_half_inv", "rope_half_mix", "rope_interleaved_inv", "rope_interleaved_mix"]
SHAPES = [(8, None), (8, 6), (6, 2), (4, 0)]  # (h, rotary_dim)


def _mod(name):
    return importlib.import_module(f"codegen.generated.{name}")


# -- the subgroup keeps RoPE scores (implementations written here, independent of the kernels) --------------------

def _angles(pos, r, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
    return pos[:, None].double() * inv_freq  # (P, r/2)


def _rope_half(x, pos, r):
    """transformers' apply_rotary_pos_emb with rotate_half on the first r coordinates (partial rotary)."""
    ang = _angles(pos, r)
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    xr, xp = x[..., :r], x[..., r:]
    x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
    return torch.cat([xr * cos + torch.cat([-x2, x1], -1) * sin, xp], -1)


def _rope_interleaved(x, pos, r):
    """GPT-J's rotate_every_two: pairs (2i, 2i + 1), sin/cos repeated element-wise."""
    ang = _angles(pos, r)
    cos, sin = ang.cos().repeat_interleave(2, -1), ang.sin().repeat_interleave(2, -1)
    xr, xp = x[..., :r], x[..., r:]
    rot = torch.stack([-xr[..., 1::2], xr[..., ::2]], -1).flatten(-2)
    return torch.cat([xr * cos + rot * sin, xp], -1)


ROTARY = {"half": _rope_half, "interleaved": _rope_interleaved}


def _scores(G, H, x, pos, rope, r):
    q, k = rope(x @ G, pos, r), rope(x @ H, pos, r)
    return q @ k.mT


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("h,r", SHAPES)
@given(seed=st.integers(0, 10_000), log_scale=st.floats(-2, 2))
@settings(max_examples=15, deadline=None)
def test_subgroup_elements_keep_rope_scores(pairing, h, r, seed, log_scale):
    """q R_{p−p'} kᵀ is unchanged under (G A, H A⁻ᵀ) for A from the module's subgroup, at random positions; a
    generic GL(h) element changes it, and so does an element of the other pairing's subgroup (h ≥ 4)."""
    mod = _mod(f"rope_{pairing}_mix")
    gen = torch.Generator().manual_seed(seed)
    d, P = 10, 7
    G, H = torch.randn(d, h, generator=gen, dtype=torch.float64), torch.randn(d, h, generator=gen, dtype=torch.float64)
    x = torch.randn(P, d, generator=gen, dtype=torch.float64)
    pos = torch.randint(0, 4096, (P,), generator=gen)
    A = mod.random_group_element(G, generator=gen, scale=10.0 ** log_scale, rotary_dim=r)
    rope = ROTARY[pairing]
    s0 = _scores(G, H, x, pos, rope, r if r is not None else h)
    GA, HA = mod.act(G, H, A)
    s1 = _scores(GA, HA, x, pos, rope, r if r is not None else h)
    scale = float(s0.abs().max())
    assert float((s1 - s0).abs().max()) < 1e-11 * scale
    rr = h if r is None else r
    if rr >= 2:  # a generic element of GL(h) does not commute with the rotations
        B = torch.linalg.qr(torch.randn(h, h, generator=gen, dtype=torch.float64))[0] * (0.5 + torch.rand(h, generator=gen, dtype=torch.float64))
        s2 = _scores(*mod.act(G, H, B), x, pos, rope, rr)
        assert float((s2 - s0).abs().max()) > 1e-3 * scale
    if rr >= 4:
        other = _mod(f"rope_{'interleaved' if pairing == 'half' else 'half'}_mix")
        B = other.random_group_element(G, generator=gen, rotary_dim=r)
        s3 = _scores(*mod.act(G, H, B), x, pos, rope, rr)
        assert float((s3 - s0).abs().max()) > 1e-3 * scale


def test_subalgebra_dimensions():
    for h, r in SHAPES:
        rr = h if r is None else r
        assert rt.rope_basis(h, "half", r).dim == rr + (h - rr) ** 2
    assert rt.rope_basis(64, "half").dim == 64  # full rotary: an h-dimensional system per head
    cache = _mod("rope_half_mix").prepare(*sample_point(_mod("rope_half_mix"), batch=(3,), sizes={"n": 9, "m": 8, "h": 8}))
    assert cache.subalgebra_M_inv.shape == (3, 8, 8)


# -- projection against a dense least-squares projection onto span{v(E_k)} -------------------------------------------

@pytest.mark.parametrize("name", ROPE)
@pytest.mark.parametrize("h,r", SHAPES)
@given(seed=st.integers(0, 10_000))
@settings(max_examples=10, deadline=None)
def test_projection_equals_dense_least_squares(name, h, r, seed):
    err, resid = dense_projection_error(name, seed=seed, sizes={"n": h + 3, "m": h + 1, "h": h}, rotary_dim=r)
    assert resid < 1e-11 and err < 1e-10


@pytest.mark.parametrize("name", ROPE)
@pytest.mark.parametrize("h,r", SHAPES)
def test_projection_horizontal_idempotent_orthogonal(name, h, r):
    horiz, idem, orth = projection_errors(name, seed=h, sizes={"n": h + 2, "m": h + 1, "h": h}, rotary_dim=r)
    assert horiz < 1e-12 and idem < 1e-12 and orth < 1e-12


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_subgroup_projection_is_weaker_than_gl(metric):
    """V_K ⊂ V_GL: the GL-horizontal part of ξ is K-horizontal (projecting it again changes nothing), while the
    K-projection of ξ keeps a GL-vertical component (it is a different, larger horizontal space)."""
    mod, gl = _mod(f"rope_half_{metric}"), _mod(f"gl_{metric}")
    point = sample_point(mod, batch=(2,), sizes={"n": 9, "m": 8, "h": 6}, seed=3)
    xi = sample_tangent(mod, point, seed=4)
    p_gl = gl.horizontal_projection(*point, *xi)
    for a, b in zip(mod.horizontal_projection(*point, *p_gl), p_gl):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)
    p_k = mod.horizontal_projection(*point, *xi)
    assert float(gl.horizontal_residual(*point, *p_k).abs().max()) > 1e-3


# -- invariance under the subgroup ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ROPE)
@pytest.mark.parametrize("h,r", [(6, None), (6, 4)])
@given(seed=st.integers(0, 10_000), log_scale=st.floats(-2, 2))
@settings(max_examples=15, deadline=None)
def test_inner_projection_gradient_invariant_under_subgroup(name, h, r, seed, log_scale):
    """A = a·Ã in the subgroup, a ∈ [1e-2, 1e2] (float64): g unchanged, P and grad equivariant."""
    errs = subgroup_equivariance_errors(name, seed=seed, scale=10.0 ** log_scale,
                                        sizes={"n": h + 2, "m": h + 1, "h": h}, rotary_dim=r)
    assert max(errs) < 1e-10, errs


def test_projection_is_not_equivariant_under_generic_gl():
    """Control: the subgroup projection is not GL(h)-equivariant (a generic A does not normalise 𝔨)."""
    mod = _mod("rope_half_mix")
    point = sample_point(mod, sizes={"n": 8, "m": 7, "h": 4}, seed=1)
    xi = sample_tangent(mod, point, seed=2)
    A = torch.eye(4, dtype=torch.float64) + 0.3 * torch.randn(4, 4, generator=torch.Generator().manual_seed(0),
                                                             dtype=torch.float64)
    push = lambda v: torch.func.jvp(lambda *p: mod.act(*p, A), tuple(point), tuple(v))[1]  # noqa: E731
    p0 = push(mod.horizontal_projection(*point, *xi))
    p1 = mod.horizontal_projection(*mod.act(*point, A), *push(xi))
    assert max(float((a - b).abs().max()) for a, b in zip(p0, p1)) > 1e-3


# -- acceleration, geodesic, VJP (the total space's; checked at sizes where the pairings differ) ----------------------

@pytest.mark.parametrize("name", ROPE)
@given(seed=st.integers(0, 10_000))
@settings(max_examples=10, deadline=None)
def test_acceleration_equals_koszul(name, seed):
    assert acceleration_vs_koszul(name, seed=seed, sizes={"n": 7, "m": 6, "h": 4}) < 1e-9


@pytest.mark.parametrize("name", ROPE)
def test_second_order_geodesic_error_is_cubic(name):
    slope, errs = geodesic_order(name, seed=2, sizes={"n": 6, "m": 5, "h": 4})
    assert 2.7 < slope < 3.3, (slope, errs)


@pytest.mark.parametrize("name", ROPE)
def test_second_order_geodesic_vjp(name):
    assert second_order_vjp_error(name, seed=3) < 1e-12


# -- cache and run-time rotary dimension ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ROPE)
@pytest.mark.parametrize("h,r", [(8, None), (8, 6)])
def test_cached_equals_uncached_and_rotary_dim_travels_in_the_cache(name, h, r):
    mod = _mod(name)
    point = sample_point(mod, batch=(2, 3), sizes={"n": h + 2, "m": h + 1, "h": h}, seed=5)
    xi = sample_tangent(mod, point, seed=6)
    cache = mod.prepare(*point, rotary_dim=r)
    for fn in (mod.horizontal_projection, mod.horizontal_residual, mod.horizontal_lambda):
        a = fn(*point, *xi, rotary_dim=r)
        b = fn(*point, *xi, cache=cache)
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    if r is not None:
        full = mod.horizontal_projection(*point, *xi)
        assert max(float((x - y).abs().max()) for x, y in zip(full, mod.horizontal_projection(*point, *xi, cache=cache))) > 1e-6
        with pytest.raises(ValueError, match="rotary_dim"):
            mod.horizontal_projection(*point, *xi, cache=cache, rotary_dim=h)


@pytest.mark.parametrize("name", ["rope_half_inv", "rope_interleaved_mix"])
def test_projection_differentiable(name):
    mod = _mod(name)
    point = sample_point(mod, sizes={"n": 5, "m": 4, "h": 4}, seed=3)
    xi = sample_tangent(mod, point, seed=4)

    def f(*args):
        return sum((p ** 2).sum() for p in mod.horizontal_projection(*args[:2], *args[2:], rotary_dim=2))

    args = tuple(t.clone().requires_grad_(True) for t in point + xi)
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-6)


def test_float32_projection_agrees():
    mod = _mod("rope_half_mix")
    p64 = sample_point(mod, batch=(4,), sizes={"n": 10, "m": 9, "h": 8}, seed=5)
    x64 = sample_tangent(mod, p64, seed=6)
    r64 = mod.horizontal_projection(*p64, *x64)
    r32 = mod.horizontal_projection(*[p.float() for p in p64], *[x.float() for x in x64])
    for a, b in zip(r32, r64):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=2e-4, atol=2e-5)
    assert math.isfinite(float(r32[0].sum()))


def test_explicit_basis_subgroup_generates_working_kernels():
    """A subgroup declared by an explicit basis (so(3) at h = 3) derives and generates in memory; the generated
    projection equals the dense least-squares one and inner / projection / gradient are invariant under its elements."""
    import sympy as sp

    from codegen.generate import generate_module
    from derivations import Subalgebra, builtin_metric, derive_geometry, subgroup_pair
    from geosharp_ref.kernels import module_from_source

    def E(i, j):
        M = sp.zeros(3, 3)
        M[i, j] = 1
        return M

    so3 = Subalgebra("basis", matrices=(E(0, 1) - E(1, 0), E(0, 2) - E(2, 0), E(1, 2) - E(2, 1)))
    geo = derive_geometry(builtin_metric(subgroup_pair(so3, "so3_pair"), "inv"))
    mod = module_from_source("so3_inv", generate_module(geo, "so3_inv").source)
    sizes = {"n": 5, "m": 4, "h": 3}
    err, resid = dense_projection_error(mod, seed=1, sizes=sizes)
    assert err < 1e-10 and resid < 1e-11
    assert max(subgroup_equivariance_errors(mod, seed=2, sizes=sizes, scale=10.0)) < 1e-10
    with pytest.raises(ValueError, match="h = 3"):
        mod.subalgebra_basis(4)
