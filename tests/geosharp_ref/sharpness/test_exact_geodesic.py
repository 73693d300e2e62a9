"""Exact geodesics (issue 27 item 3): RK4 integration of γ̈ = −Γ(γ̇, γ̇) per factor.

Independent references: scipy's DOP853 on −Γ computed from the metric alone by torch.func (Koszul formula,
:mod:`geosharp_ref.verification.reference`), the closed-form geodesics of the diagonal network (docs/MATH.md),
central finite differences for the gradient through the integration, the generic factors for the fast GL
factor's hook, the second-order geodesic (the gap is O(ρ³), measured slope), and orbit invariance (hypothesis).
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from geosharp_ref.kernels import load_kernels
from geosharp_ref.sampling import sample_point, sample_tangent
from geosharp_ref.sharpness import (GLPairFactor, ProductSpace, build_space, geodesic_sharpness, get_measure,
                                   model_loss)
from geosharp_ref.sharpness.exact_geodesic import (DEFAULT_STEPS, ExactGeodesicAt, rk4_geodesic,
                                                   second_order_params)
from geosharp_ref.sharpness.pipeline import EvaluationOptions
from geosharp_ref.symmetry import NoAttentionPairsWarning, symmetry_map
from geosharp_ref.testing import orbit_points
from geosharp_ref.verification.orbits import model_with_params, relative_change
from geosharp_ref.verification.reference import geodesic_acceleration as koszul_acceleration
from geosharp_ref.verification.reference import integrate_geodesic

DT = torch.float64
ORBIT_RTOL = 1e-8


def _rel(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b)) / max(float(y.abs().max()) for y in b)


def _metric(mod):
    kw = {} if mod.ELEMENTWISE else {"eps": 0.0}
    return lambda p, x, e: mod.inner(*p, *x, *e, **kw).sum()


def _kernel_acc(mod):
    kw = {} if mod.ELEMENTWISE else {"eps": 0.0}
    return lambda p, v: tuple(mod.geodesic_acceleration(*p, *v, **kw))


def _horizontal(mod, point, seed, size):
    """A horizontal tangent of metric norm ``size`` at ``point``."""
    kw = {} if mod.ELEMENTWISE else {"eps": 0.0}
    xi = mod.horizontal_projection(*point, *sample_tangent(mod, point, seed=seed), **kw)
    n = float(mod.inner(*point, *xi, *xi, **kw).sum()) ** 0.5
    return tuple(x * (size / n) for x in xi)


@pytest.mark.parametrize("name", ["gl_inv", "gl_mix", "scaling", "diag_inv", "diag_mix"])
def test_rk4_equals_scipy_on_metric_only_christoffel(name):
    """RK4 (64 steps) with the generated acceleration kernel = DOP853 (rtol 1e-12) with −Γ from the metric
    alone, at ‖ξ‖_g = 0.5 (a strongly curved stretch: the second order is off by ~1e-2 there); RK4's error
    falls by ~2⁴ per halving of the step."""
    mod = load_kernels(name)
    point = sample_point(mod, seed=3, sizes={"n": 4, "m": 3, "h": 2, "k": 2})
    xi = _horizontal(mod, point, 4, 0.5)
    ref, vref = integrate_geodesic(lambda p, v: koszul_acceleration(_metric(mod), p, v), point, xi, 1.0)
    x64, v64 = rk4_geodesic(_kernel_acc(mod), point, xi, 64)
    assert _rel(x64, ref) < 1e-10 and _rel(v64, vref) < 1e-9
    errs = [_rel(rk4_geodesic(_kernel_acc(mod), point, xi, n)[0], ref) for n in (4, 8)]
    if errs[0] > 1e-13:  # not flat (the translation-free factors here all curve)
        assert 10 < errs[0] / errs[1] < 24, errs


@pytest.mark.parametrize("name", ["diag_inv", "diag_mix"])
def test_rk4_equals_closed_form_diagonal_geodesics(name):
    """docs/MATH.md: with ξ = (u ⊙ b, v ⊙ b) the metric-(5) geodesic is (u e^{bt}, v e^{bt}) and the
    metric-(6) one (u √(1 + 2bt), v √(1 + 2bt)) (default steps, b up to 0.3)."""
    mod = load_kernels(name)
    gen = torch.Generator().manual_seed(0)
    u, v = torch.rand(6, generator=gen, dtype=DT) + 0.5, torch.rand(6, generator=gen, dtype=DT) + 0.5
    b = 0.3 * (2 * torch.rand(6, generator=gen, dtype=DT) - 1)
    f = torch.exp(b) if name == "diag_inv" else torch.sqrt(1 + 2 * b)
    (gu, gv), _ = rk4_geodesic(_kernel_acc(mod), (u, v), (u * b, v * b), DEFAULT_STEPS)
    assert _rel((gu, gv), (u * f, v * f)) < 2e-7
    (gu, gv), _ = rk4_geodesic(_kernel_acc(mod), (u, v), (u * b, v * b), 64)
    assert _rel((gu, gv), (u * f, v * f)) < 1e-11


@pytest.mark.parametrize("name", ["gl_inv", "gl_mix"])
def test_geodesic_stays_horizontal(name):
    """A geodesic with horizontal initial velocity keeps a horizontal velocity (Riemannian submersion): the
    generated horizontal residual C(γ̇(1)) at γ(1) is ≤ 1e-10 of a generic vector's and falls as h⁴ with the
    RK4 step (it is the integration error, not a drift of the equation)."""
    mod = load_kernels(name)
    point = sample_point(mod, seed=5, sizes={"n": 5, "m": 4, "h": 3})
    xi = _horizontal(mod, point, 6, 0.6)
    generic = float(mod.horizontal_residual(*point, *sample_tangent(mod, point, seed=6), eps=0.0).abs().max())
    res = []
    for n in (16, 32):
        x, v = rk4_geodesic(_kernel_acc(mod), point, xi, n)
        res.append(float(mod.horizontal_residual(*x, *v, eps=0.0).abs().max()))
    assert res[1] < 1e-10 * generic and 10 < res[0] / res[1] < 24, res


# -- on a model ---------------------------------------------------------------------------------------------

def _space(model, metric, fast=True, **kw):
    params = {n: p.detach() for n, p in model.named_parameters()}
    return params, build_space(params, symmetry_map(model), metric, fast=fast, **kw)


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_space_hook_fast_equals_generic_and_scipy(bert, metric):
    """The fast GL factor's ``geodesic_parts`` (buckets) and the generic factors give the same γ_ξ(1); one
    head's blocks equal scipy's integration of the same kernel."""
    model, _ = bert
    params, fast = _space(model, metric, geodesic="exact")
    _, generic = _space(model, metric, fast=False, geodesic="exact")
    xi = fast.random(0.3, torch.Generator().manual_seed(1))
    a, b = fast.perturbed_params(list(xi)), generic.perturbed_params(list(xi))
    assert max(float((a[n] - b[n]).abs().max()) for n in a) < 1e-12
    part = fast.bound[0].parts[0]
    G, H = (t[:1] for t in part.point)
    vG, vH = (t[:1] for t in part.gather(xi[:fast.sizes[0]]))
    mod = load_kernels(f"gl_{metric}")
    ref, _ = integrate_geodesic(_kernel_acc(mod), (G[0], H[0]), (vG[0], vH[0]), 1.0)
    got, _ = rk4_geodesic(_kernel_acc(mod), (G, H), (vG, vH), DEFAULT_STEPS)
    assert _rel((got[0][0], got[1][0]), ref) < 1e-9


def test_stacked_buckets_equal_per_group(bert):
    """The fast GL factor's stacked buckets (as on a GPU) integrate each group as on its own."""
    model, _ = bert
    params = {n: p.detach() for n, p in model.named_parameters()}
    groups = tuple(symmetry_map(model).groups)
    spaces = [ProductSpace(params, [GLPairFactor(groups, "mix", stack=s)], geodesic="exact", steps=4)
              for s in (True, False)]
    assert len(spaces[0].bound[0].parts) < len(spaces[1].bound[0].parts)
    xi = spaces[1].random(0.3, torch.Generator().manual_seed(4))
    a, b = (s.perturbed_params(list(xi)) for s in spaces)
    assert max(float((a[n] - b[n]).abs().max()) for n in a) < 1e-13


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_gradient_through_rk4_matches_finite_differences(bert, metric):
    """⟨(∂γ_ξ(1)/∂ξ)ᵀ ū, η⟩ with ū = ∂L/∂γ(1) (the ascent hook's pullback) = the central finite difference of
    L(γ_{ξ+sη}(1)) in s (float64)."""
    model, batch = bert
    params, space = _space(model, metric, geodesic="exact")
    gen = torch.Generator().manual_seed(2)
    xi, eta = list(space.random(0.2, gen)), list(space.random(0.2, gen))
    f = space.value_and_grad(lambda p: model_loss(model, p, batch))
    _, cot = f(xi)
    k = space.sizes[0]
    pulled = space.bound[0].pullback(xi[:k], list(cot[:k]))
    grad = pulled + list(cot[k:])
    analytic = sum(float((g * e).sum()) for g, e in zip(grad, eta))

    def F(s):
        with torch.no_grad():
            return float(model_loss(model, space.perturbed_params([x + s * e for x, e in zip(xi, eta)]), batch))
    s = 1e-5
    fd = (F(s) - F(-s)) / (2 * s)
    assert abs(fd - analytic) <= 1e-6 * abs(analytic)


def _slope(rhos, gaps):
    return float(np.polyfit(np.log(rhos), np.log(np.abs(gaps)), 1)[0])


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_gap_to_second_order_is_cubic_in_rho(bert, metric):
    """Along a fixed horizontal direction, L(γ_ξ(1)) − L(θ + ξ + ½γ̈(0)) = O(ρ³) (fitted slope 3 ± 0.15), and
    the pipeline's reported gap at its maximiser (``config["geodesic_gap"]``) has the same order."""
    model, batch = bert
    _, space = _space(model, metric, geodesic="exact")
    u = space.random(1.0, torch.Generator().manual_seed(7))
    u = [x / space.norm(u) for x in u]
    rhos = np.geomspace(2e-3, 2e-2, 4)
    gaps = []
    with torch.no_grad():
        for r in rhos:
            xi = [r * x for x in u]
            gaps.append(float(model_loss(model, space.perturbed_params(xi), batch))
                        - float(model_loss(model, second_order_params(space, xi), batch)))
    assert abs(_slope(rhos, gaps) - 3) < 0.15, gaps
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoAttentionPairsWarning)
        res = [geodesic_sharpness(model, [batch], float(r), metric=metric, n_iter=5, geodesic="exact")
               for r in rhos]
    pipe = [r.config["geodesic_gap"][0] for r in res]
    assert abs(_slope(rhos, pipe) - 3) < 0.3, pipe
    for r in res:  # the second-order value at the maximiser is reported beside the exact one
        assert r.measure == f"geodesic-{metric}-exact" and r.config["steps"] == DEFAULT_STEPS
        assert abs(r.mean - r.config["second_order_per_batch"][0]) < 1e-3 * abs(r.mean)


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_exact_geodesic_sharpness_is_orbit_invariant(bert, metric):
    """Exact geodesic sharpness at θ and ψ(a, θ) (all attention pairs moved, a ∈ [1e-2, 1e2] log-uniform,
    hypothesis) agree to 1e-8 relative in float64; so does the reported gap."""
    model, batch = bert
    smap = symmetry_map(model)
    params = {n: p.detach() for n, p in model.named_parameters()}
    base = geodesic_sharpness(model, [batch], 0.1, metric=metric, n_iter=4, geodesic="exact", steps=4)

    @settings(max_examples=3, deadline=None, derandomize=True)
    @given(point=orbit_points([smap], params))
    def check(point):
        moved = geodesic_sharpness(model_with_params(model, point.params), [batch], 0.1, metric=metric, n_iter=4,
                                   geodesic="exact", steps=4)
        assert relative_change(base.mean, moved.mean) <= ORBIT_RTOL
        assert relative_change(base.config["second_order_per_batch"][0],
                               moved.config["second_order_per_batch"][0]) <= ORBIT_RTOL
    check()


def test_options_and_named_measures():
    """Validation (one place: EvaluationOptions) and the named exact measures."""
    assert EvaluationOptions(metric="mix", geodesic="exact").steps == DEFAULT_STEPS
    assert EvaluationOptions(metric="mix", geodesic="exact", steps=3).measure_name == "geodesic-mix-exact"
    for bad, match in ((dict(geodesic="rk4"), "unknown geodesic"), (dict(geodesic="exact", steps=0), "steps"),
                       (dict(geodesic="exact", steps=2.5), "steps"),
                       (dict(geodesic="exact", geodesic_correction=False), "choose one")):
        with pytest.raises(ValueError, match=match):
            EvaluationOptions(metric="mix", **bad)
    for m in ("inv", "mix"):
        meas = get_measure(f"geodesic-{m}-exact")
        assert meas.geodesic == "exact" and meas.metric == m and meas.base == f"geodesic-{m}" and not meas.ablated


def test_flat_rest_and_zero_velocity(bert):
    """The adaptive rest moves on the straight line θ + ξ and ξ = 0 stays at θ."""
    model, _ = bert
    params, space = _space(model, "mix", geodesic="exact")
    assert all(isinstance(b, ExactGeodesicAt) for b in space.bound)
    zero = space.perturbed_params(space.zeros())
    assert all(torch.equal(zero[n], params[n]) for n in params)
    xi = space.random(0.2, torch.Generator().manual_seed(3))
    moved = space.perturbed_params(xi)
    k = sum(space.sizes)
    for n, x in zip(space.adaptive_names, xi[k:]):
        assert torch.allclose(moved[n], params[n] + x, rtol=0, atol=1e-15)
    assert math.isfinite(space.norm(xi))


# -- command line -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved_bert(tmp_path_factory):
    """A tiny saved BERT (initializer range 0.5) and 6 examples."""
    from tests import cases
    root = tmp_path_factory.mktemp("exact")
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    cases.bert(initializer_range=cases.IR, attn_implementation=None).save_pretrained(root / "bert")
    torch.save({"inputs": {"input_ids": torch.randint(50, (6, 8), generator=gen)},
                "targets": torch.randint(3, (6,), generator=gen)}, root / "bert.pt")
    return root


def test_cli_exact_geodesic_matches_library(saved_bert, tmp_path, capsys):
    """``geosharp evaluate --geodesic exact --steps 4`` = geodesic_sharpness(geodesic="exact", steps=4), with the
    second-order value at the maximiser printed and saved; bad combinations exit 2 with one line, nothing written."""
    import json

    import transformers

    from geosharp_ref.cli import main
    from tests.cases.files import assert_cli_refused
    out = tmp_path / "r.json"
    base = ["evaluate", str(saved_bert / "bert"), "--data", str(saved_bert / "bert.pt"), "--rho", "0.05",
            "--batches", "2", "--batch-size", "3", "--iters", "3", "--float64"]
    assert main(base + ["--metric", "mix", "--geodesic", "exact", "--steps", "4", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    d = json.loads(out.read_text())
    assert d["measure"] == "geodesic-mix-exact" and d["config"]["steps"] == 4
    assert "second order at the maximiser" in printed and "exact geodesic (4 RK4 steps)" in printed
    m = transformers.AutoModelForSequenceClassification.from_pretrained(saved_bert / "bert", local_files_only=True,
                                                                        attn_implementation="eager")
    x = torch.load(saved_bert / "bert.pt", weights_only=True)
    batches = [({"input_ids": x["inputs"]["input_ids"][3 * i:3 * i + 3]}, x["targets"][3 * i:3 * i + 3])
               for i in range(2)]
    ref = geodesic_sharpness(m, batches, 0.05, metric="mix", n_iter=3, dtype=DT, geodesic="exact", steps=4)
    assert d["per_batch"] == pytest.approx(ref.per_batch, rel=1e-12, abs=1e-14)
    assert d["config"]["geodesic_gap"] == pytest.approx(ref.config["geodesic_gap"], rel=1e-9, abs=1e-15)

    bad = tmp_path / "bad.json"
    for extra, needle in ((["--metric", "adaptive", "--geodesic", "exact"], "--geodesic exact"),
                          (["--metric", "mix", "--geodesic", "exact", "--steps", "0"], "steps"),
                          (["--metric", "mix", "--geodesic", "exact", "--no-geodesic-correction"], "choose one")):
        assert_cli_refused(capsys, base + extra + ["--json", str(bad)], tmp_path, bad, (needle,))


@pytest.mark.slow
def test_bench_case_runs_quick():
    """benchmarks/geodesic_cases.py (case 7 of benchmarks/run.py) in quick mode: finite ratios, its section."""
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[3])
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks.geodesic_cases import case_geodesic, render_geodesic
    r = case_geodesic(True, torch.device("cpu"), 1)
    assert all(math.isfinite(r[f"{m}_ratio"]["median"]) and r[f"{m}_ratio"]["median"] > 0 for m in ("mix", "inv"))
    assert r["flops"]["mix-exact"] > r["flops"]["mix-second-order"]  # the RK4 stages are matrix products too
    text = render_geodesic(r)
    assert "## 7. Exact vs second-order geodesic sharpness" in text and "| tiny BERT (quick) |" in text
