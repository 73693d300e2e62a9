"""Generated kernels of joint geometries (codegen.joint): the CG projection equals the dense least-squares
projection onto the span of all vertical vectors, the geodesic acceleration equals the SymPy-derived reference
(itself checked against autograd Christoffel symbols), and the inner product is invariant under both parts'
actions (float64, random group elements)."""
import numpy as np
import pytest
import torch

from codegen.joint import generate_joint_module, joint_module_from_source
from tests.cases.joint import (block_sizes, coords, dense_projection, lora_attention_setup, norm_qk_setup,
                               random_point, random_tangent)

CASES = [(norm_qk_setup, {"d": 3, "h": 2}), (lora_attention_setup, {"d": 4, "h": 2, "r": 2})]


_MODULES = {}


def kernels(setup):
    """The generated module of a setup's geometry (generated once per test session)."""
    if setup not in _MODULES:
        _, _, geo = setup()
        _MODULES[setup] = joint_module_from_source("joint_kernels", generate_joint_module(geo, "joint_kernels"))
    return _MODULES[setup]


def _t(a):
    return torch.tensor(np.asarray(a), dtype=torch.float64)


@pytest.mark.parametrize("setup, dims", CASES)
def test_generated_joint_kernels_match_dense_projection_and_reference_acceleration(setup, dims):
    j, metric, geo = setup()
    mod = kernels(setup)
    sizes = block_sizes(j, **dims)
    rng = np.random.default_rng(4)
    vals = random_point(j, sizes, rng)
    X = random_tangent(j, vals, rng)
    blocks = [_t(vals[b]) for b in j.blocks]
    out, iters, rel = mod.horizontal_projection_with_residual(*blocks, *[_t(x) for x in X])
    assert rel.shape == () and float(rel) < 1e-12
    assert iters <= 2 * sum(len(geo.basis(i, sizes)) for i in range(len(j.parts)))
    x, dense, V, Gm = dense_projection(j, metric, geo, vals, X, sizes)
    p = coords(j, [o.numpy() for o in out])
    assert np.abs(p - dense).max() < 1e-9 * max(1.0, np.abs(x).max())
    acc = mod.geodesic_acceleration(*blocks, *out)
    ref = geo.acceleration(vals, [o.numpy() for o in out], sizes)
    assert max(float((a - _t(r)).abs().max()) for a, r in zip(acc, ref)) < 1e-10 * max(1.0, max(np.abs(r).max() for r in ref))
    E = mod.second_order_geodesic(*blocks, *out)
    assert all(torch.allclose(e, b + x + a / 2) for e, b, x, a in zip(E, blocks, out, acc))


@pytest.mark.parametrize("setup, dims", CASES)
def test_generated_joint_inner_product_is_invariant_under_every_part(setup, dims):
    j, metric, geo = setup()
    mod = kernels(setup)
    sizes = block_sizes(j, **dims)
    rng = np.random.default_rng(6)
    vals = random_point(j, sizes, rng)
    blocks = [_t(vals[b]) for b in j.blocks]
    xi, eta = [_t(x) for x in random_tangent(j, vals, rng)], [_t(x) for x in random_tangent(j, vals, rng)]
    before = mod.inner(*blocks, *xi, *eta)
    for i, part in enumerate(j.parts):
        h = int(part.group_element.shape[0].xreplace(sizes)) if hasattr(part.group_element.shape[0], "xreplace") \
            else int(part.group_element.shape[0])
        A = (torch.diag(torch.tensor(rng.uniform(0.3, 3.0, h), dtype=torch.float64)) if part.subalgebra is not None
             else torch.tensor(rng.standard_normal((h, h)), dtype=torch.float64) + 3 * torch.eye(h, dtype=torch.float64))
        act = getattr(mod, f"act_{i}")  # every action is linear in θ: tangents move like points
        after = mod.inner(*act(*blocks, A), *act(*xi, A), *act(*eta, A))
        assert abs(float(after - before)) < 1e-9 * abs(float(before))


@pytest.mark.parametrize("setup, dims", CASES)
def test_generated_joint_vjp_matches_autograd_through_the_generated_geodesic(setup, dims):
    j, metric, geo = setup()
    mod = kernels(setup)
    sizes = block_sizes(j, **dims)
    rng = np.random.default_rng(8)
    vals = random_point(j, sizes, rng)
    blocks = [_t(vals[b]) for b in j.blocks]
    xi = [_t(x).requires_grad_(True) for x in random_tangent(j, vals, rng)]
    cot = [_t(c) for c in random_tangent(j, vals, rng)]
    E = mod.second_order_geodesic(*blocks, *xi)
    grads = torch.autograd.grad(sum((e * c).sum() for e, c in zip(E, cot)), xi)
    # a diagonal block's tangents are diagonal: compare the diagonal part of autograd's gradient there
    grads = [torch.diag_embed(torch.diagonal(g)) if b in j.diagonal_blocks else g for b, g in zip(j.blocks, grads)]
    vjp = mod.second_order_geodesic_vjp(*blocks, *[x.detach() for x in xi], *cot)
    scale = max(float(g.abs().max()) for g in grads)
    assert max(float((v - g).abs().max()) for v, g in zip(vjp, grads)) < 1e-10 * max(1.0, scale)


@pytest.mark.parametrize("setup, dims", CASES)
def test_generated_joint_kernels_batched_equal_one_element_at_a_time(setup, dims):
    """A leading batch of base points (e.g. heads): every kernel equals its per-element call; per-element CG
    residuals all below tol, each element also against the dense least-squares projection."""
    j, metric, geo = setup()
    mod = kernels(setup)
    sizes = block_sizes(j, **dims)
    rng = np.random.default_rng(9)
    pts = [random_point(j, sizes, rng) for _ in range(3)]
    Xs = [random_tangent(j, v, rng) for v in pts]
    blocks = [torch.stack([_t(v[b]) for v in pts]) for b in j.blocks]
    xi = [torch.stack([_t(X[k]) for X in Xs]) for k in range(len(j.blocks))]
    out, iters, rel = mod.horizontal_projection_with_residual(*blocks, *xi)
    assert rel.shape == (3,) and float(rel.max()) < 1e-12
    acc = mod.geodesic_acceleration(*blocks, *out)
    lams = mod.horizontal_lambda(*blocks, *xi, cache=mod.prepare(*blocks))
    assert [tuple(L.shape[:1]) for L in lams] == [(3,)] * len(j.parts)
    for i, (vals, X) in enumerate(zip(pts, Xs)):
        one = mod.horizontal_projection(*[b[i] for b in blocks], *[x[i] for x in xi])
        assert all(float((a - o[i]).abs().max()) < 1e-10 * max(1.0, float(a.abs().max())) for a, o in zip(one, out))
        x, dense, _, _ = dense_projection(j, metric, geo, vals, X, sizes)
        assert np.abs(coords(j, [o[i].numpy() for o in out]) - dense).max() < 1e-9 * max(1.0, np.abs(x).max())
        a1 = mod.geodesic_acceleration(*[b[i] for b in blocks], *one)
        assert all(float((a - b[i]).abs().max()) < 1e-9 * max(1.0, float(a.abs().max())) for a, b in zip(a1, acc))
