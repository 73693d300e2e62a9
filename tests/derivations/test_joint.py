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
from derivations.joint_geometry import derive_joint_geometry
from derivations.symmetry import Symmetry

_CACHE = {}


def norm_setup():
    if "norm" not in _CACHE:
        j = norm_qk(3)
        G, H, Gam = j.blocks
        xi, eta = j.tangent("xi"), j.tangent("eta")
        g = (Trace(Inverse(G.T * Gam * Gam * G) * xi[0].T * Gam * Gam * eta[0])
             + Trace(Inverse(H.T * Gam * Gam * H) * xi[1].T * Gam * Gam * eta[1])
             + Trace(Inverse(Gam) * Inverse(Gam) * xi[2] * eta[2].T))
        metric = JointMetric(j, g, "inv_lift")
        _CACHE["norm"] = (j, metric, derive_joint_geometry(metric))
    return _CACHE["norm"]


def lora_setup():
    if "lora" not in _CACHE:
        j = lora_attention()
        G, H, Bt, At = j.blocks
        xi, eta = j.tangent("xi"), j.tangent("eta")
        g = (Trace(Inverse(G.T * G) * xi[0].T * eta[0]) + Trace(Inverse(H.T * H) * xi[1].T * eta[1])
             + Trace(Inverse(G.T * G) * xi[2].T * At.T * At * eta[2]) + Trace(Inverse(At.T * At) * xi[3].T * eta[3]))
        metric = JointMetric(j, g, "lora_att_inv")
        _CACHE["lora"] = (j, metric, derive_joint_geometry(metric))
    return _CACHE["lora"]


def _sizes(j, **kw):
    return {d: kw[str(d)] for b in j.blocks for d in b.shape if str(d) in kw}


def _point(j, sizes, rng):
    vals = {}
    for b in j.blocks:
        r, c = (int(sp.sympify(d).xreplace(sizes)) for d in b.shape)
        vals[b] = np.diag(rng.uniform(0.5, 2.0, r) * rng.choice([-1, 1], r)) if b in j.diagonal_blocks \
            else rng.standard_normal((r, c))
    return vals


def _tangent(j, vals, rng):
    return [np.diag(rng.standard_normal(v.shape[0])) if b in j.diagonal_blocks else rng.standard_normal(v.shape)
            for b, v in zip(j.blocks, vals.values())]


def _coords(j, vecs):
    return np.concatenate([np.diag(v) if b in j.diagonal_blocks else np.ravel(v) for b, v in zip(j.blocks, vecs)])


def _uncoords(j, vals, c):
    out, k = [], 0
    for b in j.blocks:
        v = vals[b]
        n = v.shape[0] if b in j.diagonal_blocks else v.size
        out.append(np.diag(c[k:k + n]) if b in j.diagonal_blocks else c[k:k + n].reshape(v.shape))
        k += n
    return out


def _metric_gram(metric, j, vals, sizes):
    """Coordinate Gram g(e_i, e_j) (float64) of the metric expression."""
    N = len(_coords(j, list(vals.values())))
    units = [_uncoords(j, vals, np.eye(N)[k]) for k in range(N)]
    xi, eta = j.tangent("xi"), j.tangent("eta")
    Gm = np.zeros((N, N))
    for a in range(N):
        for b in range(N):
            env = {s: (v, None) for s, v in vals.items()}
            env.update({x: (u, None) for x, u in zip(xi, units[a])})
            env.update({t: (u, None) for t, u in zip(eta, units[b])})
            Gm[a, b] = DualEvaluator(sizes, env, exact=False).value(metric.expr)
    return Gm


def dense_projection(j, metric, geo, vals, X, sizes):
    """Dense reference ξ − V (Vᵀ g V)⁺ Vᵀ g ξ over the span of every part's vertical vectors, in coordinates:
    (x, projected x, V, coordinate Gram)."""
    Gm = _metric_gram(metric, j, vals, sizes)
    cols = []
    for i in range(len(j.parts)):
        for E in geo.basis(i, sizes):
            lams = [np.zeros_like(B) for B in (geo.basis(k, sizes)[0] for k in range(len(j.parts)))]
            lams[i] = E
            cols.append(_coords(j, geo.vertical_vector(vals, sizes, lams)))
    V = np.stack(cols, 1)
    x = _coords(j, X)
    return x, x - V @ np.linalg.lstsq(V.T @ Gm @ V, V.T @ Gm @ x, rcond=None)[0], V, Gm


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
    j, metric, geo = norm_setup()
    assert [r.status for r in geo.invariance] == ["proved", "proved"]
    G, H, Gam = j.blocks
    xi, eta = j.tangent("xi"), j.tangent("eta")
    inv = JointMetric(j, Trace(Inverse(G.T * G) * xi[0].T * eta[0]) + Trace(Inverse(H.T * H) * xi[1].T * eta[1]), "inv")
    res = prove_joint_invariance(inv, j)
    assert res[0].status == "proved" and res[1].status == "counterexample" and res[1].witness["value"] != 0
    # independent float64 check after a random D = diag(d), A ∈ GL(2)
    rng = np.random.default_rng(1)
    sizes = _sizes(j, d=3, h=2)
    vals, X, Y = _point(j, sizes, rng), None, None
    X, Y = _tangent(j, vals, rng), _tangent(j, vals, rng)
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


@pytest.mark.parametrize("setup, dims", [(norm_setup, {"d": 3, "h": 2}), (lora_setup, {"d": 4, "h": 2, "r": 2})])
def test_joint_projection_equals_dense_least_squares_projection(setup, dims):
    j, metric, geo = setup()
    assert geo.projection_kind == "iterative"  # the parts are coupled through the metric
    sizes = _sizes(j, **dims)
    rng = np.random.default_rng(2)
    vals = _point(j, sizes, rng)
    X = _tangent(j, vals, rng)
    ph, _, iters, rel = geo.project(vals, X, sizes)
    assert rel < 1e-12
    x, dense, V, Gm = dense_projection(j, metric, geo, vals, X, sizes)
    p = _coords(j, ph)
    assert np.abs(p - dense).max() < 1e-9 * max(1.0, np.abs(x).max())
    assert np.abs(V.T @ Gm @ p).max() < 1e-9 * np.abs(V.T @ Gm @ x).max()  # horizontal
    assert abs(p @ Gm @ (x - p)) < 1e-9 * (x @ Gm @ x)  # g-orthogonal
    again, _, _, _ = geo.project(vals, ph, sizes)
    assert np.abs(_coords(j, again) - p).max() < 1e-9 * max(1.0, np.abs(p).max())  # idempotent


def test_joint_geodesic_acceleration_matches_autograd_christoffel():
    j, metric, geo = norm_setup()
    sizes = _sizes(j, d=3, h=2)
    rng = np.random.default_rng(3)
    vals = _point(j, sizes, rng)
    xi = geo.project(vals, _tangent(j, vals, rng), sizes)[0]
    acc = _coords(j, geo.acceleration(vals, xi, sizes))

    def g_torch(theta, a, b):  # hand-written: Σ a_γ b_γ / γ² + tr((GᵀΓ²G)⁻¹ a_Gᵀ Γ² b_G) + the same for H
        G, H, gam = theta[:6].reshape(3, 2), theta[6:12].reshape(3, 2), theta[12:]
        G2 = torch.diag(gam ** 2)
        out = (a[12:] * b[12:] / gam ** 2).sum()
        for sl, M in ((slice(0, 6), G), (slice(6, 12), H)):
            W = torch.linalg.inv(M.T @ G2 @ M)
            out = out + torch.trace(W @ a[sl].reshape(3, 2).T @ G2 @ b[sl].reshape(3, 2))
        return out

    theta = torch.tensor(_coords(j, list(vals.values())), dtype=torch.float64)
    v = torch.tensor(_coords(j, xi), dtype=torch.float64)
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
    j, metric, _ = norm_setup()
    fam = joint_invariant_metrics(j, {"d": 3, "h": 2})
    assert len(fam.basis) >= 3
    assert all(r.status == "proved" for m in fam.basis for r in m.invariance)
    # definiteness: the lifted inv's three terms are each semidefinite on one block; nothing positive on no block
    assert all(m.definiteness in ("positive semidefinite", "indefinite") for m in fam.basis)
    assert {b for m in fam.basis for b in m.positive_on} == set(j.blocks)
    # the lifted inv metric lies in the span: least squares on values at random points has zero residual
    rng = np.random.default_rng(5)
    sizes = _sizes(j, d=3, h=2)
    xi, eta = j.tangent("xi"), j.tangent("eta")
    rows, rhs = [], []
    for _ in range(3 * len(fam.basis)):
        vals = _point(j, sizes, rng)
        env = {s: (v, None) for s, v in vals.items()}
        env.update({x: (u, None) for x, u in zip(xi, _tangent(j, vals, rng))})
        env.update({t: (u, None) for t, u in zip(eta, _tangent(j, vals, rng))})
        ev = DualEvaluator(sizes, env, exact=False)
        rows.append([ev.value(m.metric.expr) for m in fam.basis])
        rhs.append(ev.value(metric.expr))
    c, *_ = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)
    assert np.abs(np.array(rows) @ c - np.array(rhs)).max() < 1e-8 * np.abs(rhs).max()
