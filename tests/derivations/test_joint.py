"""Joint symmetries (derivations.joint, derivations.joint_geometry): norm weight × Q/K pair and LoRA GL(r) ×
attention GL(h). The declarations are product groups (commuting actions, proved), jointly invariant metrics are
proved and non-invariant ones refuted (and both confirmed by float64 evaluation after random group elements), the
CG projection equals a dense least-squares g-orthogonal projection onto the span of all vertical vectors
(horizontal, idempotent, g-orthogonal), and the geodesic acceleration equals −Γ(ξ, ξ) from Christoffel symbols
computed by autograd from a hand-written torch metric."""
import numpy as np
import pytest
import sympy as sp
import torch
from sympy import Inverse, MatrixSymbol, Trace

from derivations import DeclarationError, gl_pair
from derivations.exact_eval import DualEvaluator
from derivations.joint import (JointMetric, JointSymmetry, joint_invariant_metrics, lora_attention, norm_qk,
                               prove_joint_invariance)
from derivations.symmetry import Symmetry
from tests.cases.joint import (block_sizes, coords, dense_projection, lora_attention_setup, norm_qk_setup,
                               random_point, random_tangent)

def test_joint_declarations_are_product_groups_and_non_commuting_parts_are_refused():
    assert len(norm_qk(3).blocks) == 3 and len(lora_attention().blocks) == 4  # validated on construction
    pair = gl_pair()
    G, H = pair.blocks
    B = MatrixSymbol("B", *pair.group_element.shape)
    # G ↦ G B (preserves the projector G (GᵀG)⁻¹ Gᵀ): does not commute with G ↦ G A
    other = Symmetry("right_again", (G,), B, sp.Identity(G.shape[1]), (G * B,), (G * Inverse(G.T * G) * G.T,))
    with pytest.raises(DeclarationError):
        JointSymmetry("bad", (pair, other))


def test_joint_metric_is_proved_invariant_and_builtin_inv_is_refuted_by_the_norm_scaling():
    j, metric, geo = norm_qk_setup()
    assert [r.status for r in geo.invariance] == ["proved", "proved"]
    G, H, Gam = j.blocks
    xi, eta = j.tangent("xi"), j.tangent("eta")
    inv = JointMetric(j, Trace(Inverse(G.T * G) * xi[0].T * eta[0]) + Trace(Inverse(H.T * H) * xi[1].T * eta[1]), "inv")
    res = prove_joint_invariance(inv, j)
    assert res[0].status == "proved" and res[1].status == "counterexample" and res[1].witness["value"] != 0
    # independent float64 check after a random D = diag(d), A ∈ GL(2)
    rng = np.random.default_rng(1)
    sizes = block_sizes(j, d=3, h=2)
    vals, X, Y = random_point(j, sizes, rng), None, None
    X, Y = random_tangent(j, vals, rng), random_tangent(j, vals, rng)
    D, A = np.diag(rng.uniform(0.3, 3, 3)), rng.standard_normal((2, 2)) + 2 * np.eye(2)
    Di, AiT = np.linalg.inv(D), np.linalg.inv(A).T

    def act(v):  # the same linear map acts on points and tangents
        return {G: Di @ v[0] @ A, H: Di @ v[1] @ AiT, Gam: v[2] @ D}

    def value(m, pt, a, b):
        env = {s: (v, None) for s, v in pt.items()}
        env.update({x: (u, None) for x, u in zip(xi, a)})
        env.update({t: (u, None) for t, u in zip(eta, b)})
        return DualEvaluator(sizes, env, exact=False).value(m.expr)

    pt = [vals[G], vals[H], vals[Gam]]
    moved, mX, mY = act(pt), list(act(X).values()), list(act(Y).values())
    before, after = value(metric, vals, X, Y), value(metric, moved, mX, mY)
    assert abs(after - before) <= 1e-10 * abs(before)
    assert abs(value(inv, moved, mX, mY) - value(inv, vals, X, Y)) > 1e-3


@pytest.mark.parametrize("setup, dims", [(norm_qk_setup, {"d": 3, "h": 2}),
                                         (lora_attention_setup, {"d": 4, "h": 2, "r": 2})])
def test_joint_projection_equals_dense_least_squares_projection(setup, dims):
    j, metric, geo = setup()
    assert geo.projection_kind == "iterative"  # the parts are coupled through the metric
    sizes = block_sizes(j, **dims)
    rng = np.random.default_rng(2)
    vals = random_point(j, sizes, rng)
    X = random_tangent(j, vals, rng)
    ph, _, iters, rel = geo.project(vals, X, sizes)
    assert rel < 1e-12
    x, dense, V, Gm = dense_projection(j, metric, geo, vals, X, sizes)
    p = coords(j, ph)
    assert np.abs(p - dense).max() < 1e-9 * max(1.0, np.abs(x).max())
    assert np.abs(V.T @ Gm @ p).max() < 1e-9 * np.abs(V.T @ Gm @ x).max()  # horizontal
    assert abs(p @ Gm @ (x - p)) < 1e-9 * (x @ Gm @ x)  # g-orthogonal
    again, _, _, _ = geo.project(vals, ph, sizes)
    assert np.abs(coords(j, again) - p).max() < 1e-9 * max(1.0, np.abs(p).max())  # idempotent


def test_joint_geodesic_acceleration_matches_autograd_christoffel():
    j, metric, geo = norm_qk_setup()
    sizes = block_sizes(j, d=3, h=2)
    rng = np.random.default_rng(3)
    vals = random_point(j, sizes, rng)
    xi = geo.project(vals, random_tangent(j, vals, rng), sizes)[0]
    acc = coords(j, geo.acceleration(vals, xi, sizes))

    def g_torch(theta, a, b):  # hand-written: Σ a_γ b_γ / γ² + tr((GᵀΓ²G)⁻¹ a_Gᵀ Γ² b_G) + the same for H
        G, H, gam = theta[:6].reshape(3, 2), theta[6:12].reshape(3, 2), theta[12:]
        G2 = torch.diag(gam ** 2)
        out = (a[12:] * b[12:] / gam ** 2).sum()
        for sl, M in ((slice(0, 6), G), (slice(6, 12), H)):
            W = torch.linalg.inv(M.T @ G2 @ M)
            out = out + torch.trace(W @ a[sl].reshape(3, 2).T @ G2 @ b[sl].reshape(3, 2))
        return out

    theta = torch.tensor(coords(j, list(vals.values())), dtype=torch.float64)
    v = torch.tensor(coords(j, xi), dtype=torch.float64)
    N = theta.numel()
    E = torch.eye(N, dtype=torch.float64)

    def gram(th):
        return torch.stack([torch.stack([g_torch(th, E[a], E[b]) for b in range(N)]) for a in range(N)])

    Gm = gram(theta)
    half_grad = 0.5 * torch.autograd.functional.jacobian(lambda th: g_torch(th, v, v), theta)
    dG = torch.autograd.functional.jvp(lambda th: gram(th) @ v, theta, v)[1]
    ref = torch.linalg.solve(Gm, half_grad - dG).numpy()
    assert np.abs(acc - ref).max() < 1e-8 * max(1.0, np.abs(ref).max())


@pytest.mark.slow
def test_joint_invariant_metrics_of_norm_qk_contain_the_inv_lift():
    j, metric, _ = norm_qk_setup()
    fam = joint_invariant_metrics(j, {"d": 3, "h": 2})
    assert len(fam.basis) >= 3
    assert all(r.status == "proved" for m in fam.basis for r in m.invariance)
    # definiteness: the lifted inv's three terms are each semidefinite on one block; nothing positive on no block
    assert all(m.definiteness in ("positive semidefinite", "indefinite") for m in fam.basis)
    assert {b for m in fam.basis for b in m.positive_on} == set(j.blocks)
    # the lifted inv metric lies in the span: least squares on values at random points has zero residual
    rng = np.random.default_rng(5)
    sizes = block_sizes(j, d=3, h=2)
    xi, eta = j.tangent("xi"), j.tangent("eta")
    rows, rhs = [], []
    for _ in range(3 * len(fam.basis)):
        vals = random_point(j, sizes, rng)
        env = {s: (v, None) for s, v in vals.items()}
        env.update({x: (u, None) for x, u in zip(xi, random_tangent(j, vals, rng))})
        env.update({t: (u, None) for t, u in zip(eta, random_tangent(j, vals, rng))})
        ev = DualEvaluator(sizes, env, exact=False)
        rows.append([ev.value(m.metric.expr) for m in fam.basis])
        rhs.append(ev.value(metric.expr))
    c, *_ = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)
    assert np.abs(np.array(rows) @ c - np.array(rhs)).max() < 1e-8 * np.abs(rhs).max()
