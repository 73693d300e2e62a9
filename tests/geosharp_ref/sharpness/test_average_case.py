"""Average-case sharpness (issue 27 item 2): on the quotient and adaptive (Andriushchenko et al. 2023).

Independent references: the empirical covariance of the samplers against the metric (GᵀG, (HᵀH)⁻¹), the
metric kernel's g(ξ, η) statistics on a whole model's horizontal space, a direct re-implementation of
tml-epfl's Gaussian adaptive average sharpness, the spread of estimates over seeds against the reported
standard error (which falls as 1/√n), and orbit invariance with common random numbers (hypothesis).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from geosharp_ref.forward import model_loss
from geosharp_ref.sharpness import build_space, get_measure
from geosharp_ref.sharpness.average_case import (_gl_block, average_case_sharpness, isotropic_sample,
                                                 sample_perturbation)
from geosharp_ref.symmetry import symmetry_map
from geosharp_ref.testing import group_element, orbit_points
from geosharp_ref.sampling import well_conditioned
from geosharp_ref.verification.orbits import model_with_params, relative_change
from tests import cases

DT = torch.float64


@pytest.mark.parametrize("metric", ["inv", "mix"])
@pytest.mark.parametrize("eps", [0.0, 0.3])
def test_gl_sampler_row_covariance_is_the_inverse_metric(metric, eps):
    """Rows of ξ_G are N(0, GᵀG + εI) for inv and N(0, (HᵀH + εI)⁻¹) for mix: the metric's inverse per row
    (empirical covariance of 40000 rows within 4 %)."""
    gen = torch.Generator().manual_seed(0)
    G = well_conditioned((5, 3), gen, DT)
    H = well_conditioned((4, 3), gen, DT)
    draws = _gl_block(G.expand(8000, 5, 3), H.expand(8000, 4, 3), metric, eps, gen).reshape(-1, 3)
    emp = draws.mT @ draws / draws.shape[0]
    I = torch.eye(3, dtype=DT)
    want = G.mT @ G + eps * I if metric == "inv" else torch.linalg.inv(H.mT @ H + eps * I)
    white = torch.linalg.solve(want, emp)  # ≈ I
    assert float((white - I).abs().max()) < 0.04


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_whole_space_sample_is_metric_isotropic(bert, metric):
    """On a model's horizontal space: E[g(ξ, η)²] = g(η, η) for horizontal η (the g-isotropic Gaussian), the
    samples are horizontal, and the sphere samples have ‖ξ‖_g = ρ exactly."""
    model, _ = bert
    params = {n: p.detach() for n, p in model.named_parameters()}
    space = build_space(params, symmetry_map(model), metric)
    gen = torch.Generator().manual_seed(1)
    etas = [space.random(1.0, gen) for _ in range(2)]
    n = 600
    stats = np.zeros((n, 2))
    for i in range(n):
        xi = isotropic_sample(space, gen)
        stats[i] = [float(space.inner(xi, e)) ** 2 for e in etas]
    for j, e in enumerate(etas):
        want = float(space.inner(e, e))
        sem = stats[:, j].std() / math.sqrt(n)
        assert abs(stats[:, j].mean() - want) < 5 * sem + 1e-12, (stats[:, j].mean(), want, sem)
    xi = sample_perturbation(space, 0.3, "sphere", gen)
    assert abs(space.norm(xi) - 0.3) < 1e-12
    proj = space.project_horizontal(xi)
    assert max(float((a - b).abs().max()) for a, b in zip(proj, xi)) < 1e-12


def test_gaussian_adaptive_equals_tml_epfl_definition():
    """average-adaptive = E_{δ ~ N(0, ρ² diag|w|²)} L(w + δ) − L(w) (tml-epfl ``eval_average_sharpness``,
    adaptive, l2), re-implemented here with the same random numbers (one N(0, 1) draw per parameter in order)."""
    model = cases.mlp64(torch.nn.Tanh)
    gen = torch.Generator().manual_seed(0)
    batch = (torch.randn(16, 5, generator=gen, dtype=DT), torch.randint(0, 3, (16,), generator=gen))
    rho, n = 0.2, 12
    res = get_measure("average-adaptive").evaluate(model, [batch], rho, n_samples=n, seed=5, n_iter=3)
    params = dict(model.named_parameters())
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        l0 = float(model_loss(model, params, batch))
        vals = []
        for _ in range(n):
            moved = {k: w + rho * w.abs() * torch.randn(w.shape, generator=g, dtype=DT) for k, w in params.items()}
            vals.append(float(model_loss(model, moved, batch)) - l0)
    assert abs(res.mean - sum(vals) / n) < 1e-12
    assert abs(res.config["standard_error"] - np.std(vals, ddof=1) / math.sqrt(n)) < 1e-12
    assert res.measure == "average-adaptive" and res.config["distribution"] == "gaussian"


def test_standard_error_falls_as_one_over_sqrt_n():
    """The reported standard error falls as n^(−1/2) (fitted slope −0.5 ± 0.15 over n = 8 … 128) and matches
    the spread of the estimate over 24 seeds (ratio within [0.6, 1.6])."""
    model = cases.mlp64(torch.nn.Tanh)
    gen = torch.Generator().manual_seed(1)
    batch = (torch.randn(32, 5, generator=gen, dtype=DT), torch.randint(0, 3, (32,), generator=gen))
    ns = [8, 32, 128]
    ses = [average_case_sharpness(model, [batch], 0.3, n_samples=n, distribution="sphere", seed=3)
           .config["standard_error"] for n in ns]
    slope = float(np.polyfit(np.log(ns), np.log(ses), 1)[0])
    assert abs(slope + 0.5) < 0.15, ses
    runs = [average_case_sharpness(model, [batch], 0.3, n_samples=16, distribution="sphere", seed=s)
            for s in range(24)]
    spread = float(np.std([r.mean for r in runs], ddof=1))
    reported = float(np.sqrt(np.mean([r.config["standard_error"] ** 2 for r in runs])))
    assert 0.6 < spread / reported < 1.6, (spread, reported)


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_quotient_average_is_orbit_invariant_and_adaptive_changes(bert, metric):
    """With common random numbers (seed fixed), the quotient average-case sharpness at θ and ψ(a, θ) (all
    attention pairs moved, a ∈ [1e-2, 1e2], hypothesis) agree to 1e-8 relative (float64), also with the exact
    geodesic; adaptive average-case sharpness (Gaussian and sphere) changes by more than 1e-3."""
    model, batch = bert
    smap = symmetry_map(model)
    params = {n: p.detach() for n, p in model.named_parameters()}
    kw = dict(n_samples=4, seed=11)
    base = get_measure(f"average-geodesic-{metric}").evaluate(model, [batch], 0.2, **kw)
    base_exact = average_case_sharpness(model, [batch], 0.2, metric=metric, geodesic="exact", steps=3, **kw)
    adaptive = [get_measure(m).evaluate(model, [batch], 0.05, **kw)
                for m in ("average-adaptive", "average-adaptive-sphere")]

    @settings(max_examples=3, deadline=None, derandomize=True)
    @given(point=orbit_points([smap], params))
    def check(point):
        moved_model = model_with_params(model, point.params)
        moved = get_measure(f"average-geodesic-{metric}").evaluate(moved_model, [batch], 0.2, **kw)
        assert relative_change(base.mean, moved.mean) <= 1e-8
        moved = average_case_sharpness(moved_model, [batch], 0.2, metric=metric, geodesic="exact", steps=3, **kw)
        assert relative_change(base_exact.mean, moved.mean) <= 1e-8
    check()
    far = model_with_params(model, smap.act(dict(params), group_element(smap, params, 10.0, seed=0).value))
    for m, a in zip(("average-adaptive", "average-adaptive-sphere"), adaptive):
        assert relative_change(a.mean, get_measure(m).evaluate(far, [batch], 0.05, **kw).mean) > 1e-3


def test_bad_options(bert):
    model, batch = bert
    for kw, match in ((dict(distribution="ball"), "unknown distribution"), (dict(n_samples=1), "at least 2"),
                      (dict(geodesic="rk4"), "unknown geodesic")):
        with pytest.raises(ValueError, match=match):
            average_case_sharpness(model, [batch], 0.1, metric="mix", **kw)
    with pytest.raises(ValueError, match="rho"):
        average_case_sharpness(model, [batch], -1.0)


def test_cli_average_case_matches_library(tmp_path, capsys):
    """``geosharp evaluate --average-case`` = average_case_sharpness (quotient: sphere; adaptive: tml-epfl's
    Gaussian), mean ± standard error printed; ``--samples 1`` exits 2 with one line, nothing written."""
    import json

    import transformers

    from geosharp_ref.cli import main
    from tests.cases.files import assert_cli_refused
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    cases.bert(initializer_range=cases.IR, attn_implementation=None).save_pretrained(tmp_path / "bert")
    torch.save({"inputs": {"input_ids": torch.randint(50, (4, 8), generator=gen)},
                "targets": torch.randint(3, (4,), generator=gen)}, tmp_path / "bert.pt")
    m = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "bert", local_files_only=True,
                                                                        attn_implementation="eager")
    batch = ({"input_ids": torch.load(tmp_path / "bert.pt", weights_only=True)["inputs"]["input_ids"]},
             torch.load(tmp_path / "bert.pt", weights_only=True)["targets"])
    base = ["evaluate", str(tmp_path / "bert"), "--data", str(tmp_path / "bert.pt"), "--rho", "0.1", "--batches", "1",
            "--batch-size", "4", "--average-case", "--samples", "5", "--seed", "2", "--float64"]
    for metric, name in (("mix", "average-geodesic-mix"), ("adaptive", "average-adaptive")):
        out = tmp_path / f"{metric}.json"
        assert main(base + ["--metric", metric, "--json", str(out)]) == 0
        printed = capsys.readouterr().out
        d = json.loads(out.read_text())
        ref = average_case_sharpness(m, [batch], 0.1, metric=None if metric == "adaptive" else metric, n_samples=5,
                                     seed=2, dtype=DT, distribution="gaussian" if metric == "adaptive" else "sphere")
        assert d["measure"] == name and d["mean"] == pytest.approx(ref.mean, rel=1e-10, abs=1e-14)
        assert "Monte Carlo standard error" in printed

    bad = tmp_path / "bad.json"
    assert_cli_refused(capsys, base + ["--samples", "1", "--metric", "mix", "--json", str(bad)], tmp_path, bad,
                       ("--samples",))
