"""Committed joint kernels codegen/generated/norm_qk_{inv,mix} (norm weight Γ = diag(γ) × Q/K pair) on the
verification ladder, batched over a leading dimension: the batched CG projection equals a dense g-orthogonal
least-squares projection onto the span of hand-written vertical vectors (per batch element; horizontal,
idempotent), the inner product equals a hand-written torch metric and is invariant under random batched group
elements of each part (a ∈ [1e-2, 1e2], hypothesis), the geodesic acceleration equals −Γ(ξ, ξ) from autograd
Christoffel symbols of the hand-written metric, the second-order geodesic is equivariant, and the VJP equals
autograd (float64)."""
import importlib

import pytest
import torch
from hypothesis import given, settings

from geosharp_ref.testing import scales, seeds

NAMES = ["norm_qk_inv", "norm_qk_mix"]
D, HD, BATCH = 4, 2, 3
T = torch.float64


def mod(name):
    return importlib.import_module(f"codegen.generated.{name}")


def handwritten_metric(kind, G, H, gam, a, b):
    """g at one point (G, H (d, h), γ (d,)); tangents a, b = (a_G, a_H, a_γ) (a_γ the diagonal's vector)."""
    G2 = torch.diag(gam ** 2)
    out = (a[2] * b[2] / gam ** 2).sum()
    PtP, QtQ = G.T @ G2 @ G, H.T @ G2 @ H
    if kind == "inv":
        return out + torch.trace(torch.linalg.inv(PtP) @ a[0].T @ G2 @ b[0]) + torch.trace(
            torch.linalg.inv(QtQ) @ a[1].T @ G2 @ b[1])
    return out + torch.trace(QtQ @ a[0].T @ G2 @ b[0]) + torch.trace(PtP @ a[1].T @ G2 @ b[1])


def point(gen, batch=(BATCH,)):
    G = torch.randn(*batch, D, HD, generator=gen, dtype=T)
    H = torch.randn(*batch, D, HD, generator=gen, dtype=T)
    sign = torch.where(torch.rand(*batch, D, generator=gen, dtype=T) < 0.5, -1.0, 1.0)
    gam = sign * (0.5 + 1.5 * torch.rand(*batch, D, generator=gen, dtype=T))
    return G, H, torch.diag_embed(gam)


def tangent(gen, batch=(BATCH,)):
    return (torch.randn(*batch, D, HD, generator=gen, dtype=T), torch.randn(*batch, D, HD, generator=gen, dtype=T),
            torch.diag_embed(torch.randn(*batch, D, generator=gen, dtype=T)))


def flat(v):
    return torch.cat([v[0].flatten(), v[1].flatten(), torch.diagonal(v[2])])


def unflat(x):
    n = D * HD
    return x[:n].reshape(D, HD), x[n:2 * n].reshape(D, HD), x[2 * n:]


def coordinate_gram(kind, G, H, gam):
    N = 2 * D * HD + D
    E = torch.eye(N, dtype=T)
    return torch.stack([torch.stack([handwritten_metric(kind, G, H, gam, unflat(E[a]), unflat(E[b]))
                                     for b in range(N)]) for a in range(N)])


def vertical_columns(G, H, gam):
    """Hand-written vertical vectors: GL(h) units E: (G E, −H Eᵀ, 0); diagonal units X = e_k e_kᵀ: (−X G, −X H, γ_k e_k)."""
    cols = []
    for a in range(HD):
        for b in range(HD):
            E = torch.zeros(HD, HD, dtype=T)
            E[a, b] = 1
            cols.append(flat((G @ E, -H @ E.T, torch.zeros(D, D, dtype=T))))
    for k in range(D):
        X = torch.zeros(D, D, dtype=T)
        X[k, k] = 1
        cols.append(flat((-X @ G, -X @ H, X * gam[k])))
    return torch.stack(cols, 1)


@pytest.mark.parametrize("name", NAMES)
def test_batched_cg_projection_equals_dense_least_squares_projection_per_element(name):
    m, kind = mod(name), name.rsplit("_", 1)[1]
    gen = torch.Generator().manual_seed(1)
    pt, xi = point(gen), tangent(gen)
    out, iters, rel = m.horizontal_projection_with_residual(*pt, *xi)
    assert rel.shape == (BATCH,) and float(rel.max()) < 1e-12 and iters <= 2 * (HD * HD + D)
    again = m.horizontal_projection(*pt, *out, cache=m.prepare(*pt))
    for i in range(BATCH):
        G, H, gam = pt[0][i], pt[1][i], torch.diagonal(pt[2][i])
        Gm, V = coordinate_gram(kind, G, H, gam), vertical_columns(G, H, gam)
        x = flat([v[i] for v in xi])
        dense = x - V @ torch.linalg.lstsq(V.T @ Gm @ V, V.T @ Gm @ x, rcond=None).solution
        p = flat([o[i] for o in out])
        assert float((p - dense).abs().max()) < 1e-9 * max(1.0, float(x.abs().max()))
        assert float((V.T @ Gm @ p).abs().max()) < 1e-9 * float((V.T @ Gm @ x).abs().max())  # horizontal
        assert float((flat([a[i] for a in again]) - p).abs().max()) < 1e-9 * float(p.abs().max())  # idempotent
    # batched = one element at a time; a zero tangent is horizontal with residual 0
    single = m.horizontal_projection(*[b[1] for b in pt], *[x[1] for x in xi])
    assert all(float((s - o[1]).abs().max()) < 1e-10 for s, o in zip(single, out))
    zero, _, rel0 = m.horizontal_projection_with_residual(*pt, *[torch.zeros_like(x) for x in xi])
    assert float(rel0.abs().max()) == 0.0 and all(float(z.abs().max()) == 0.0 for z in zero)


@pytest.mark.parametrize("name", NAMES)
def test_batched_acceleration_equals_autograd_christoffel_of_handwritten_metric(name):
    m, kind = mod(name), name.rsplit("_", 1)[1]
    gen = torch.Generator().manual_seed(2)
    pt = point(gen)
    xi = m.horizontal_projection(*pt, *tangent(gen))
    acc = m.geodesic_acceleration(*pt, *xi)
    E2 = m.second_order_geodesic(*pt, *xi)
    for i in range(BATCH):
        theta = flat([b[i] for b in pt[:2]] + [pt[2][i]])
        v = flat([x[i] for x in xi])

        def g(th, a, b):
            G, H, gam = unflat(th)
            return handwritten_metric(kind, G, H, gam, unflat(a), unflat(b))

        N = theta.numel()
        E = torch.eye(N, dtype=T)

        def gram(th):
            return torch.stack([torch.stack([g(th, E[a], E[b]) for b in range(N)]) for a in range(N)])

        half_grad = 0.5 * torch.autograd.functional.jacobian(lambda th: g(th, v, v), theta)
        dG = torch.autograd.functional.jvp(lambda th: gram(th) @ v, theta, v)[1]
        ref = torch.linalg.solve(gram(theta), half_grad - dG)
        got = flat([a[i] for a in acc])
        assert float((got - ref).abs().max()) < 1e-8 * max(1.0, float(ref.abs().max()))
        # inner product = the hand-written metric
        assert abs(float(m.inner(*[b[i] for b in pt], *[x[i] for x in xi], *[x[i] for x in xi]) - g(theta, v, v))) \
            < 1e-10 * float(g(theta, v, v))
    assert all(torch.allclose(e, b + x + a / 2) for e, b, x, a in zip(E2, pt, xi, acc))


@pytest.mark.parametrize("name", NAMES)
def test_batched_vjp_equals_autograd(name):
    m = mod(name)
    gen = torch.Generator().manual_seed(3)
    pt = point(gen)
    xi = [x.requires_grad_(True) for x in tangent(gen)]
    cot = tangent(gen)
    E = m.second_order_geodesic(*pt, *xi)
    grads = torch.autograd.grad(sum((e * c).sum() for e, c in zip(E, cot)), xi)
    grads = (grads[0], grads[1], torch.diag_embed(torch.diagonal(grads[2], dim1=-2, dim2=-1)))  # Γ's tangents: diagonal
    vjp = m.second_order_geodesic_vjp(*pt, *[x.detach() for x in xi], *cot)
    scale = max(float(g.abs().max()) for g in grads)
    assert max(float((v - g).abs().max()) for v, g in zip(vjp, grads)) < 1e-10 * max(1.0, scale)


def _elements(gen, a):
    """Batched group elements of each part at scale a: A = a·Q₁ diag(s) Q₂ ∈ GL(h), D = diag(±a·u), s, u ∈ [0.5, 2]."""
    Q1 = torch.linalg.qr(torch.randn(BATCH, HD, HD, generator=gen, dtype=T))[0]
    Q2 = torch.linalg.qr(torch.randn(BATCH, HD, HD, generator=gen, dtype=T))[0]
    s = 0.5 + 1.5 * torch.rand(BATCH, HD, generator=gen, dtype=T)
    sign = torch.where(torch.rand(BATCH, D, generator=gen, dtype=T) < 0.5, -1.0, 1.0)
    u = 0.5 + 1.5 * torch.rand(BATCH, D, generator=gen, dtype=T)
    return a * Q1 @ torch.diag_embed(s) @ Q2, torch.diag_embed(sign * a * u)


@settings(max_examples=15, deadline=None)
@given(a=scales(), seed=seeds())
def test_metric_and_geodesic_are_invariant_under_batched_group_elements_of_each_part(a, seed):
    gen = torch.Generator().manual_seed(seed)
    pt, xi, eta = point(gen), tangent(gen), tangent(gen)
    A, Dm = _elements(gen, a)
    for name in NAMES:
        m = mod(name)
        before = m.inner(*pt, *xi, *eta)
        h = m.horizontal_projection(*pt, *xi)
        E = m.second_order_geodesic(*pt, *h)
        for act, g in ((m.act_0, A), (m.act_1, Dm)):  # every action is linear in θ: tangents move like points
            after = m.inner(*act(*pt, g), *act(*xi, g), *act(*eta, g))
            assert float(((after - before) / before.abs()).abs().max()) < 1e-9
            # the horizontal lift and E commute with the action: E(ψθ, dψ h) = ψ E(θ, h)
            moved = act(*pt, g)
            Em = m.second_order_geodesic(*moved, *m.horizontal_projection(*moved, *act(*h, g)))
            for x, y in zip(Em, act(*E, g)):
                assert float((x - y).abs().max()) < 1e-8 * max(1.0, float(y.abs().max()))
