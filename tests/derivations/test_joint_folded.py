"""Folded metrics of the norm weight × Q/K joint symmetry (derivations.joint_folded): the pullback of
Σ dγ²/γ² ⊕ g_pair(ΓG, ΓH) by the fold (γ, G, H) ↦ (γ, ΓG, ΓH).

Checked against independent computations: invariance is proved symbolically for both parts (and the unfolded
``inv`` and a wrong fold are refuted), then confirmed in float64 with a hand-written numpy metric after random
group elements; the derived projection equals a dense least-squares g-orthogonal projection onto the span of ALL
vertical vectors (hand-written), is horizontal and idempotent; the derived geodesic acceleration and the
hand-simplified closed form G̈ = Γ⁻¹Ĝ̈ − 2Γ⁻¹Ξξ_G − Γ⁻²Ξ²G equal −Γ(ξ, ξ) from Christoffel symbols of the dense
metric computed by torch autograd, for general ξ (ξ_γ ≠ 0, not horizontal)."""
import numpy as np
import pytest
import torch
from sympy import Inverse, Trace

from derivations.errors import MetricError
from derivations.exact_eval import DualEvaluator
from derivations.joint import JointMetric, norm_qk, prove_joint_invariance
from derivations.joint_builtins import joint_builtin_metric
from derivations.joint_folded import FOLDED_KINDS, derive_folded_geometry, fold_tangent, folded_metric, norm_pair

from .folded_numeric import (ONE, QK, closed_form_acceleration, closed_form_projection, dense_projection, flat, g_hand,
                             gram, pair_acceleration, random_point, sizes_of, split, to_values, vertical_span)

_GEO = {}


def geometry(kind, folded=QK):
    if (kind, folded) not in _GEO:
        _GEO[kind, folded] = derive_folded_geometry(folded_metric(kind, joint=norm_pair(3, folded)))
    return _GEO[kind, folded]


# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, folded", [(k, f) for k in sorted(FOLDED_KINDS) for f in (QK, ONE)],
                         ids=lambda v: "+".join(v) if isinstance(v, tuple) else v)
def test_folded_metric_is_proved_invariant_under_both_parts_and_is_a_fold(kind, folded):
    geo = geometry(kind, folded)
    assert [r.status for r in geo.invariance] == ["proved", "proved"]
    assert set(geo.lemmas) == {"pullback", "norm_vertical", "pair_vertical"}
    assert geo.kind == FOLDED_KINDS[kind] and geo.solve.kind == ("sylvester" if kind == "folded_inv" else "explicit")
    j = geo.joint
    G, H, Gam = j.blocks
    xi, eta = j.tangent("xi"), j.tangent("eta")
    fx, fe = fold_tangent(j, xi), fold_tangent(j, eta)
    assert fx[0] == Gam * xi[0] + xi[2] * G  # dφ derived by matrix calculus
    assert fx[1] == (Gam * xi[1] + xi[2] * H if folded == QK else xi[1])
    if folded == ONE:
        return
    # the built-in name resolves to the same metric; a hand-written expanded form is recognised as the fold
    assert joint_builtin_metric("norm_qk", kind).expr == geo.metric.expr
    S = lambda B: B.T * Gam * Gam * B  # noqa: E731
    if kind == "folded_inv":
        hand = (Trace(Inverse(Gam) ** 2 * xi[2] * eta[2]) + Trace(Inverse(S(G)) * fx[0].T * fe[0])
                + Trace(Inverse(S(H)) * fx[1].T * fe[1]))
        again = derive_folded_geometry(JointMetric(j, hand, "by_hand"))
        assert again.kind == "inv" and [r.status for r in again.invariance] == ["proved", "proved"]


def test_unfolded_and_wrongly_folded_metrics_are_refuted_by_the_norm_scaling():
    j = norm_qk(3)
    G, H, Gam = j.blocks
    xi, eta = j.tangent("xi"), j.tangent("eta")
    scale = Trace(Inverse(Gam) * Inverse(Gam) * xi[2] * eta[2])
    unfolded = JointMetric(j, Trace(Inverse(G.T * G) * xi[0].T * eta[0]) + Trace(Inverse(H.T * H) * xi[1].T * eta[1])
                           + scale, "inv_unfolded")
    res = prove_joint_invariance(unfolded, j)
    assert res[0].status == "proved" and res[1].status == "counterexample" and res[1].witness["value"] != 0
    # fold by Γ² instead of Γ: still GL(h)-invariant, not D-invariant
    F = lambda B, x: Gam * Gam * x + xi[2] * B  # noqa: E731
    Fe = lambda B, x: Gam * Gam * x + eta[2] * B  # noqa: E731
    S = lambda B: B.T * Gam ** 4 * B  # noqa: E731
    wrong = JointMetric(j, Trace(Inverse(S(G)) * F(G, xi[0]).T * Fe(G, eta[0]))
                        + Trace(Inverse(S(H)) * F(H, xi[1]).T * Fe(H, eta[1])) + scale, "wrong_fold")
    res = prove_joint_invariance(wrong, j)
    assert res[0].status == "proved" and res[1].status == "counterexample"
    with pytest.raises(MetricError, match="not the pullback"):  # jointly invariant (the lifted inv), not a fold
        derive_folded_geometry(joint_builtin_metric("norm_qk", "inv"))


#: (kind, folded blocks, d, h, m): norm × Q/K (m = d), and one reader: norm × V/O (m ≠ d) and a GL(1) unit (h = 1)
def _id(v):
    return "+".join(v) if isinstance(v, tuple) else str(v)


CASES = [("folded_inv", QK, 5, 2, 5), ("folded_mix", QK, 5, 2, 5), ("folded_inv", QK, 4, 3, 4),
         ("folded_mix", QK, 3, 3, 3), ("folded_inv", ONE, 5, 2, 3), ("folded_mix", ONE, 4, 2, 6),
         ("folded_inv", ONE, 5, 1, 3), ("folded_mix", ONE, 5, 1, 4)]


@pytest.mark.parametrize("kind, folded, d, h, m", [CASES[2], CASES[3], CASES[5], CASES[7]], ids=_id)
def test_folded_metric_float64_invariance_and_expression_match_the_hand_written_metric(kind, folded, d, h, m):
    geo = geometry(kind, folded)
    j, fold_h = geo.joint, folded == QK
    sizes = sizes_of(j, d, h, m)
    rng = np.random.default_rng(11)
    G, H, gam = random_point(rng, d, h, m)
    a = (rng.standard_normal((d, h)), rng.standard_normal((m, h)), rng.standard_normal(d))
    b = (rng.standard_normal((d, h)), rng.standard_normal((m, h)), rng.standard_normal(d))
    xi, eta = j.tangent("xi"), j.tangent("eta")
    env = {s: (v, None) for s, v in to_values(j, G, H, gam).items()}
    env.update({x: (v if v.ndim == 2 else np.diag(v), None) for x, v in zip(xi, a)})
    env.update({t: (v if v.ndim == 2 else np.diag(v), None) for t, v in zip(eta, b)})
    derived = DualEvaluator(sizes, env, exact=False).value(geo.metric.expr)
    before = g_hand(kind, G, H, gam, a, b, fold_h=fold_h)
    assert abs(derived - before) <= 1e-12 * abs(before)
    for trial in range(3):  # random D (any signs), A ∈ GL(h): points and tangents move by the same linear map
        D = rng.uniform(1e-2, 1e2, d) * rng.choice([-1.0, 1.0], d)
        A = rng.standard_normal((h, h)) + 2 * np.eye(h)
        Di, AiT = np.diag(1 / D), np.linalg.inv(A).T

        def act(x):
            return Di @ x[0] @ A, (Di if fold_h else np.eye(m)) @ x[1] @ AiT, x[2] * D

        after = g_hand(kind, *act((G, H, gam)), act(a), act(b), fold_h=fold_h)
        assert abs(after - before) <= 1e-9 * abs(before)


@pytest.mark.parametrize("kind, folded, d, h, m", CASES, ids=_id)
def test_folded_projection_equals_dense_least_squares_projection(kind, folded, d, h, m):
    geo = geometry(kind, folded)
    j, fold_h = geo.joint, folded == QK
    rng = np.random.default_rng(d * 10 + h)
    G, H, gam = random_point(rng, d, h, m)
    theta = flat(G, H, gam)
    x = rng.standard_normal(theta.shape[0])
    xG, xH, xg = split(x, d, h, m)
    sizes = sizes_of(j, d, h, m)
    p = flat(*[v if k < 2 else np.diag(v) for k, v in enumerate(
        geo.project(to_values(j, G, H, gam), [xG, xH, np.diag(xg)], sizes))])
    M, V = gram(kind, theta, d, h, m=m, fold_h=fold_h), vertical_span(theta, d, h, m, fold_h)
    dense = dense_projection(kind, G, H, gam, x, fold_h)
    scale = max(1.0, np.abs(x).max())
    assert np.abs(p - dense).max() < 1e-9 * scale
    closed = flat(*closed_form_projection(kind, G, H, gam, xG, xH, xg, fold_h))
    assert np.abs(closed - dense).max() < 1e-9 * scale
    assert np.abs(split(p, d, h, m)[2]).max() == 0.0  # horizontal vectors do not move γ
    assert np.abs(V.T @ M @ p).max() < 1e-9 * np.abs(V.T @ M @ x).max()  # horizontal
    assert abs(p @ M @ (x - p)) < 1e-9 * (x @ M @ x)  # g-orthogonal
    pG, pH, pg = split(p, d, h, m)
    again = flat(*[v if k < 2 else np.diag(v) for k, v in enumerate(
        geo.project(to_values(j, G, H, gam), [pG, pH, np.diag(pg)], sizes))])
    assert np.abs(again - p).max() < 1e-9 * max(1.0, np.abs(p).max())  # idempotent


@pytest.mark.parametrize("kind, folded, d, h, m", [CASES[0], CASES[1], CASES[3], CASES[4], CASES[5], CASES[7]],
                         ids=_id)
def test_folded_acceleration_matches_autograd_christoffel(kind, folded, d, h, m):
    geo = geometry(kind, folded)
    j, fold_h = geo.joint, folded == QK
    rng = np.random.default_rng(7 + d + h)
    G, H, gam = random_point(rng, d, h, m)
    x = rng.standard_normal((d + m) * h + d)  # general: ξ_γ ≠ 0, not horizontal
    xG, xH, xg = split(x, d, h, m)
    acc = geo.acceleration(to_values(j, G, H, gam), [xG, xH, np.diag(xg)], sizes_of(j, d, h, m))
    derived = flat(acc[0], acc[1], np.diag(acc[2]))
    # closed form: G̈ = Γ⁻¹Ĝ̈ − 2Γ⁻¹Ξξ_G − Γ⁻²Ξ²G (the same for H if it reads the norm, else Ḧ = Ĥ̈), γ̈ = ξ_γ²/γ
    closed = closed_form_acceleration(kind, G, H, gam, xG, xH, xg, fold_h)
    # −Γ(ξ, ξ) = M⁻¹[½ ∇_θ ξᵀMξ − (D_ξ M) ξ], M the dense metric of the hand-written torch g
    th = torch.tensor(flat(G, H, gam), dtype=torch.float64)
    v = torch.tensor(x, dtype=torch.float64)
    M = gram(kind, th, d, h, lib=torch, m=m, fold_h=fold_h)
    half = 0.5 * torch.autograd.functional.jacobian(
        lambda t: g_hand(kind, *split(t, d, h, m), split(v, d, h, m), split(v, d, h, m), torch, fold_h), th)
    dM = torch.autograd.functional.jvp(lambda t: gram(kind, t, d, h, torch, m, fold_h) @ v, th, v)[1]
    ref = torch.linalg.solve(M, half - dM).numpy()
    scale = max(1.0, np.abs(ref).max())
    assert np.abs(derived - ref).max() < 1e-8 * scale
    assert np.abs(closed - ref).max() < 1e-8 * scale


def test_folded_geodesic_is_the_pullback_of_the_product_geodesic_to_second_order():
    """E(ξ) = θ + ξ + ½γ̈ agrees with φ⁻¹(γ exp(tξ_γ/γ), exact pair geodesic …) to O(t³): the fold-derived
    second-order geodesic vs finite differences of φ⁻¹ of the product curve (γ exact, Ĝ to second order)."""
    geo = geometry("folded_mix")
    j, d, h = geo.joint, 4, 2
    rng = np.random.default_rng(5)
    G, H, gam = random_point(rng, d, h)
    xG, xH, xg = rng.standard_normal((d, h)), rng.standard_normal((d, h)), rng.standard_normal(d)
    vals, sizes = to_values(j, G, H, gam), sizes_of(j, d, h)
    Gam, Xi = np.diag(gam), np.diag(xg)
    aGh, aHh = pair_acceleration("folded_mix", Gam @ G, Gam @ H, Gam @ xG + Xi @ G, Gam @ xH + Xi @ H)

    def curve(t):  # φ⁻¹ of the product curve, the pair part to second order (its third-order term drops below)
        g_t = gam * np.exp(t * xg / gam)
        Gh = Gam @ G + t * (Gam @ xG + Xi @ G) + t * t / 2 * aGh
        return np.diag(1 / g_t) @ Gh

    t = 1e-3
    fd = (curve(t) - 2 * curve(0) + curve(-t)) / t ** 2
    acc = geo.acceleration(vals, [xG, xH, np.diag(xg)], sizes)
    assert np.abs(acc[0] - fd).max() < 1e-4 * max(1.0, np.abs(fd).max())


@pytest.mark.slow
def test_folded_metrics_lie_outside_the_two_sided_ansatz_family_that_contains_the_lifted_inv():
    """joint_invariant_metrics' two-sided ansatz tr(W ξ_iᵀ V η_j) pairs blocks of equal shape, so it has no cross term
    ξ_Γ·η_G; the folded metrics (which have) are not in the family, while the lifted ``inv`` is (least squares of
    values at random points: residual 0 vs O(1))."""
    from derivations.joint import joint_invariant_metrics

    j = norm_qk(3)
    fam = joint_invariant_metrics(j, {"d": 3, "h": 2})
    assert all(r.status == "proved" for m in fam.basis for r in m.invariance)
    resid = _span_residuals(j, fam)
    assert resid["inv"] < 1e-9
    assert resid["folded_inv"] > 1e-3 and resid["folded_mix"] > 1e-3


@pytest.mark.parametrize("kind, folded, d, h, m", [CASES[0], CASES[1], CASES[7]], ids=_id)
def test_generated_folded_kernels_agree_with_the_closed_form(kind, folded, d, h, m):
    """codegen.joint.generate_joint_module on FoldedGeometry.joint_geometry() (in memory): batched ``inner``,
    ``geodesic_acceleration`` and the CG ``horizontal_projection`` equal the hand-written metric and the closed-form
    acceleration / projection per batch element; the VJP equals autograd through ``second_order_geodesic``."""
    from codegen.joint import generate_joint_module, joint_module_from_source

    geo = geometry(kind, folded)
    j, B, fold_h = geo.joint, 3, folded == QK
    name = f"{j.name}_{kind}"
    mod = joint_module_from_source(name, generate_joint_module(geo.joint_geometry(), name))
    rng = np.random.default_rng(21)
    pts = [random_point(rng, d, h, m) for _ in range(B)]
    xs = [(rng.standard_normal((d, h)), rng.standard_normal((m, h)), rng.standard_normal(d)) for _ in range(B)]
    ys = [(rng.standard_normal((d, h)), rng.standard_normal((m, h)), rng.standard_normal(d)) for _ in range(B)]

    def batch(items):
        return [torch.tensor(np.stack([it[k] if k < 2 else np.diag(it[k]) for it in items]), dtype=torch.float64)
                for k in range(3)]

    th, xi, eta = batch(pts), batch(xs), batch(ys)
    inner = mod.inner(*th, *xi, *eta).numpy().reshape(B)
    acc = [a.numpy() for a in mod.geodesic_acceleration(*th, *xi)]
    proj, iters, resid = mod.horizontal_projection_with_residual(*th, *xi)
    assert float(resid.max()) < 1e-12
    sizes = sizes_of(j, d, h, m)
    for b in range(B):
        ref = g_hand(kind, *pts[b], xs[b], ys[b], fold_h=fold_h)
        assert abs(inner[b] - ref) <= 1e-10 * abs(ref)
        vals, tang = to_values(j, *pts[b]), [xs[b][0], xs[b][1], np.diag(xs[b][2])]
        want = geo.acceleration(vals, tang, sizes)
        for k in range(3):
            assert np.abs(acc[k][b] - want[k]).max() < 1e-9 * max(1.0, np.abs(want[k]).max())
        want = geo.project(vals, tang, sizes)
        for k in range(3):
            assert np.abs(proj[k][b].numpy() - want[k]).max() < 1e-9 * max(1.0, np.abs(want[k]).max())
    cot = batch([(rng.standard_normal((d, h)), rng.standard_normal((m, h)), rng.standard_normal(d)) for _ in range(B)])
    xv = [x.clone().requires_grad_(True) for x in xi]
    out = mod.second_order_geodesic(*th, *xv)
    grads = torch.autograd.grad(sum((o * c).sum() for o, c in zip(out, cot)), xv)
    vjp = mod.second_order_geodesic_vjp(*th, *xi, *cot)
    for k in range(3):
        want = torch.diag_embed(torch.diagonal(grads[k], dim1=-2, dim2=-1)) if k == 2 else grads[k]
        assert torch.allclose(vjp[k], want, rtol=1e-10, atol=1e-10)


def _span_residuals(j, fam, seed=4):
    """Relative least-squares residual of the lifted inv and the folded metrics on the span of ``fam``'s basis
    (values at random float64 points, tangents of Γ diagonal)."""
    sizes = sizes_of(j, 3, 2)
    rng = np.random.default_rng(seed)
    xi, eta = j.tangent("xi"), j.tangent("eta")
    targets = {"inv": joint_builtin_metric("norm_qk", "inv"), **{k: folded_metric(k) for k in FOLDED_KINDS}}
    rows, rhs = [], {k: [] for k in targets}
    for _ in range(4 * len(fam.basis)):
        G, H, gam = random_point(rng, 3, 2)
        env = {s: (v, None) for s, v in to_values(j, G, H, gam).items()}
        for sym in (xi, eta):
            env.update({s: (v, None) for s, v in zip(sym, (rng.standard_normal((3, 2)), rng.standard_normal((3, 2)),
                                                            np.diag(rng.standard_normal(3))))})
        ev = DualEvaluator(sizes, env, exact=False)
        rows.append([ev.value(m.metric.expr) for m in fam.basis])
        for k, m in targets.items():
            rhs[k].append(ev.value(m.expr))
    A = np.array(rows)
    return {k: np.abs(A @ np.linalg.lstsq(A, np.array(b), rcond=None)[0] - b).max() / np.abs(b).max()
            for k, b in rhs.items()}


@pytest.mark.slow
def test_folded_ansatz_family_contains_the_folded_metrics_all_proved():
    """derivations.joint_folded_family: the GL pair's ansatz pulled back by the fold, Γ-invariant forms and products
    of invariant 1-forms; every basis element proved under both parts; folded_inv and folded_mix are in the span,
    the lifted inv (no ΞG terms) is not."""
    from derivations.joint_folded_family import folded_invariant_metrics

    j = norm_qk(3)
    fam = folded_invariant_metrics(j, {"d": 3, "h": 2})
    assert len(fam.basis) >= 3
    assert all(r.status == "proved" for m in fam.basis for r in m.invariance)
    resid = _span_residuals(j, fam)
    assert resid["folded_inv"] < 1e-9 and resid["folded_mix"] < 1e-9
    assert resid["inv"] > 1e-3
