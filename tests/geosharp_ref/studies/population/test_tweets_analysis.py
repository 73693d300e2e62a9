"""The tweets analysis in its degenerate and skewed cases (geosharp_ref.studies.population.tweets_analysis and
tweets_report): an undefined contrast is judged "undecided" instead of stopping the analysis, a Δ outside its own
interval is flagged and named, the models an evaluation left out are named, and the report shows the protocol's
checks (the family's size, the models R was measured on), p-values of 0 at the bootstrap's resolution, the
verdicts' meaning, the ablations' sizes and the descriptive analyses, each as ``analysis.json`` holds it; Holm's
adjusted p-values reject exactly what the step-down procedure rejects."""
import csv
import json
import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from geosharp_ref.studies.population.reanalysis import signed_tau_difference
from geosharp_ref.studies.population.tweets_analysis import PRIMARY_FAMILY_SIZE, holm, judge_primary, models_left_out
from geosharp_ref.studies.population.tweets_report import render_report


def test_a_constant_measure_leaves_its_contrast_undecided_and_the_others_judged():
    rng = np.random.default_rng(1)
    gap, ada = rng.standard_normal(30), rng.standard_normal(30)
    good = signed_tau_difference(gap + 1.5 * rng.standard_normal(30), ada, gap, n_boot=200)
    flat = signed_tau_difference(np.ones(30), ada, gap, n_boot=200)
    family = judge_primary({"size=0.001": {"geodesic-inv - adaptive": flat, "geodesic-mix - adaptive": good}})
    assert family[0]["verdict"] == "undecided" and math.isnan(family[0]["p_holm"])
    p = min(1.0, 2 * min(good["p_positive"], 1 - good["p_positive"]))
    assert 0 < p < 0.5 and family[1]["p_bootstrap"] == p
    # Holm over both: the undefined contrast counts as p = 1, so the other is multiplied by 2
    assert family[1]["p_holm"] == pytest.approx(min(1.0, 2 * p)) and family[1]["verdict"] == "undecided"
    assert not family[0]["difference_outside_ci"] and not family[1]["difference_outside_ci"]


def test_a_difference_outside_its_interval_is_flagged():
    cells = {"size=0.01": {"geodesic-mix - adaptive": dict(difference=0.2, ci=[-0.1, 0.1], p_positive=0.2),
                           "geodesic-inv - adaptive": dict(difference=0.1, ci=[-0.1, 0.3], p_positive=0.8)}}
    assert [c["difference_outside_ci"] for c in judge_primary(cells)] == [True, False]


def _write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def test_models_left_out_names_each_evaluations_missing_models(tmp_path):
    names = [f"model_{i:03d}" for i in range(5)]
    (tmp_path / "population.json").write_text(json.dumps(dict(
        plan=dict(data=dict(dataset="tweets")), complete=True,
        models=[dict(name=n, dir=n, metrics=dict(gap=0.1, train_error=0.0, test_error=0.1)) for n in names])))
    _write_csv(tmp_path / "correlation.csv", ["model", "gap"], [[n, 0.1] for n in names if n != "model_003"])
    _write_csv(tmp_path / "correlation-curvature.csv", ["model", "gap"], [[n, 0.1] for n in names])
    assert models_left_out(tmp_path) == {"main": ["model_003"], "curvature": []}  # ablations not correlated


def _analysis(**over):
    tau = dict(tau=0.1, ci=[-0.1, 0.3], n=80)
    cell = dict(difference=0.25, ci=[0.1, 0.2], p_bootstrap=0.0, p_holm=0.0, paper_attenuated_difference=0.2,
                power_for_paper_attenuated=0.5, verdict="better", difference_outside_ci=True)
    other = dict(cell, difference=0.05, ci=[-0.1, 0.2], p_bootstrap=0.4, p_holm=0.8, verdict="undecided",
                 difference_outside_ci=False)
    res = dict(models=79, bootstrap=1000, seed=0,
               protocol_checks=dict(models_at_least=80, models_ok=False, reliability_at_least=0.9,
                                    reliability_ok=True, primary_family_size=2, primary_family_expected=8,
                                    primary_family_ok=False, reliability_models=80, reliability_covers_models=False),
               models_left_out={"main": ["model_017"], "ablations": ["model_017", "model_042"], "curvature": []},
               exclusion_reasons={"model_017": "amendment 11: not finite"},
               reliability=dict(pearson_full_spearman_brown=0.95, n_test=36173, tau_half=0.8),
               train_error=dict(min=0.0, median=0.01, max=0.04, above_0_05=0, above_0_10=0, tau_vs_gap=tau),
               signed_contrast={"size=0.001": {"geodesic-mix - adaptive": cell, "geodesic-inv - adaptive": other}},
               partial_tau_given_train_error={}, power=dict(min_detectable_tau_80=0.2, kendall_null_sd=0.08,
                                                            paper_attenuated={"adaptive": 0.1}),
               paper_mnli_tau={"adaptive": 0.06}, paper_mnli_tau_attenuated={"adaptive": 0.05},
               sensitivity_without_train_error_above_0_05=dict(excluded=[], models=79, max_train_error=0.05),
               ablations={"size=0.001": {"geodesic-mix-frobenius": dict(
                   vs="geodesic-mix", contrast_full_minus_ablation=dict(difference=0.0, ci=[0.0, 0.1]),
                   contrast_given_train_error=dict(difference=0.0, ci=[0.0, 0.1]), tau_between=0.9,
                   median_relative_difference=0.1, relative_size=0.00098, relative_size_full=0.00101)}},
               curvature_exploratory={},
               descriptive=dict(measure_agreement={"size=0.001": {"geodesic-mix-linearised": dict(
                   vs="geodesic-mix", tau=0.61, ci=[0.5, 0.7], median_ratio=0.93, p=0.0, n=79)}},
                   hyperparameter_tau={"lr": {"gap": dict(tau=0.47, p=0.01),
                                              "size=0.001": {"geodesic-mix": dict(tau=0.2, p=0.1),
                                                             "adaptive": dict(tau=-0.3, p=0.05)}}}))
    res.update(over)
    return res


def test_report_names_the_checks_the_left_out_models_and_the_descriptive_analyses(tmp_path):
    res = _analysis()
    (tmp_path / "analysis.json").write_text(json.dumps(res))
    _write_csv(tmp_path / "correlation_tau.csv", ["rho", "measure", "tau", "ci_low", "ci_high", "row"],
               [["0.5", "geodesic-mix", "0.1", "-0.1", "0.3", "size=0.001"]])
    text = render_report(tmp_path)
    lines = text.splitlines()
    assert "- Primary family (Holm): 2 contrasts: NOT MET (the protocol fixes 8)." in lines
    assert "- R was measured on 80 models, the analysis has 79." in lines
    assert "- Left out of the main evaluation: model_017 (amendment 11: not finite)." in lines
    assert ("- Left out of the ablations evaluation: model_017 (amendment 11: not finite), model_042 (no record)."
            in lines)
    assert not any("curvature evaluation" in ln for ln in lines)
    # p of 0: the bootstrap's resolution 2/B, times the family's size for Holm
    assert "| size=0.001 | geodesic-mix − adaptive | +0.250 | [+0.100, +0.200] | < 0.002 | < 0.004 | +0.200 |" in text
    assert "| size=0.001 | geodesic-inv − adaptive | +0.050 | [-0.100, +0.200] | 0.400 | 0.800 |" in text
    assert any(ln.startswith('Verdicts: "better": Holm-adjusted p < 0.05 and Δ > 0.') for ln in lines)
    skewed = [ln for ln in lines if ln.startswith("Δ lies outside its own percentile interval")]
    assert len(skewed) == 1 and skewed[0].endswith(": size=0.001 geodesic-mix − adaptive.")
    assert "| 1.00e-01 | 9.80e-04 / 1.01e-03 |" in text  # the ablation's and its full measure's sizes
    assert "| size=0.001 | geodesic-mix-linearised | geodesic-mix | 0.610 | [+0.500, +0.700] | 0.930 |" in text
    assert "| hyper-parameter | τ with the gap | size | adaptive | geodesic-mix |" in text
    assert "| lr | +0.470 | size=0.001 | -0.300 | +0.200 |" in text
    # nothing left out, the family complete, R on the same models
    fine = _analysis(models_left_out={"main": [], "ablations": []}, protocol_checks=dict(
        _analysis()["protocol_checks"], primary_family_size=PRIMARY_FAMILY_SIZE, primary_family_ok=True,
        reliability_covers_models=True))
    (tmp_path / "analysis.json").write_text(json.dumps(fine))
    lines = render_report(tmp_path).splitlines()
    assert f"- Primary family (Holm): {PRIMARY_FAMILY_SIZE} contrasts." in lines
    assert "- No model was left out of any evaluation." in lines
    assert not any(ln.startswith("- R was measured on") for ln in lines)


def _step_down_rejections(ps, alpha):
    """Holm's procedure as Holm (1979) states it: order the p-values p_(1) ≤ … ≤ p_(m), reject H_(1), …, H_(k−1)
    where k is the first rank with p_(k) > α / (m − k + 1), and nothing after it."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    rejected = set()
    for k, i in enumerate(order):
        if ps[i] > alpha / (len(ps) - k):
            break
        rejected.add(i)
    return rejected


@given(ps=st.lists(st.floats(0, 1), min_size=1, max_size=12), alpha=st.sampled_from([0.01, 0.05, 0.1]))
def test_holm_rejects_what_the_step_down_procedure_rejects(ps, alpha):
    """An adjusted p ≤ α exactly where the step-down procedure rejects (away from ties with a threshold, where the
    two roundings of (m − k + 1)·p ≤ α and p ≤ α / (m − k + 1) may differ), each adjusted p ≥ its p and ≤ 1, and
    the adjusted p-values rise with the p-values."""
    m = len(ps)
    assume(all(abs((m - k) * p - alpha) > 1e-12 for p in ps for k in range(m)))
    adj = holm(ps)
    assert {i for i, a in enumerate(adj) if a <= alpha} == _step_down_rejections(ps, alpha)
    assert all(p <= a <= 1.0 for p, a in zip(ps, adj))
    assert all(adj[i] <= adj[j] for i in range(m) for j in range(m) if ps[i] <= ps[j])


def _direct_cells(reliabilities, between, cell):
    """The power statement's contrast cells written out loop by loop (the reference for the shared helper)."""
    from geosharp_ref.studies.population.reanalysis import attenuated_tau
    from geosharp_ref.studies.population.tweets_analysis import PAPER_MNLI_TAU

    out = {}
    for R in reliabilities:
        ada = attenuated_tau(PAPER_MNLI_TAU["adaptive"], R)
        for b in between:
            for g in ("geodesic-inv", "geodesic-mix"):
                try:
                    out[R, b, g] = cell(attenuated_tau(PAPER_MNLI_TAU[g], R), ada, b)
                except ValueError:
                    out[R, b, g] = None
    return out


def test_power_statement_holds_each_cells_direct_power():
    """Every contrast cell, single-τ power and smallest detectable difference of a small power statement (two
    reliabilities, a τ_between where geodesic-mix cannot hold jointly) equals its direct computation."""
    from geosharp_ref.studies.population.reanalysis import attenuated_tau, contrast_power, kendall_power
    from geosharp_ref.studies.population.tweets_analysis import (PAPER_MNLI_TAU, _min_detectable_contrast,
                                                                   power_statement)

    rs, bs, sims = (0.9, 0.5), (0.2, 0.7), 40
    got = power_statement(n=30, reliabilities=rs, between=bs, sims=sims, seed=3)
    direct = _direct_cells(rs, bs, lambda tg, ta, b: contrast_power(tg, ta, b, 30, sims=sims, seed=3))
    assert direct[0.9, 0.7, "geodesic-mix"] is None and direct[0.9, 0.2, "geodesic-inv"] is not None
    for (R, b, g), c in direct.items():
        assert got["by_reliability"][f"R={R:g}"]["contrast"][f"tau_between={b:g}"][g] == c, (R, b, g)
    for R in rs:
        cell = got["by_reliability"][f"R={R:g}"]
        att = {m: attenuated_tau(t, R) for m, t in PAPER_MNLI_TAU.items()}
        assert cell["paper_attenuated"] == att
        assert cell["power_single_tau"] == {m: kendall_power(t, 30, sims=sims, seed=3) for m, t in att.items()}
        for b in bs:
            assert cell["contrast"][f"tau_between={b:g}"]["min_detectable_difference_80"] == \
                _min_detectable_contrast(att["adaptive"], b, 30, sims, 3)


def test_bootstrap_power_statement_holds_each_cells_direct_power():
    from geosharp_ref.studies.population.reanalysis import bootstrap_contrast_power, contrast_power
    from geosharp_ref.studies.population.tweets_analysis import bootstrap_power_statement

    def cell(tg, ta, b):
        return dict(bootstrap_contrast_power(tg, ta, b, 30, sims=12, n_boot=20, seed=1, progress=False),
                    fast_power=contrast_power(tg, ta, b, 30, sims=50, seed=1)["power"])

    got = bootstrap_power_statement(n=30, reliabilities=(0.9,), between=(0.2, 0.7), sims=12, n_boot=20, seed=1,
                                    progress=False, fast_sims=50)
    assert (got["models"], got["sims"], got["n_boot"]) == (30, 12, 20)
    for (R, b, g), c in _direct_cells((0.9,), (0.2, 0.7), cell).items():
        assert got["by_reliability"][f"R={R:g}"]["contrast"][f"tau_between={b:g}"][g] == c, (R, b, g)
