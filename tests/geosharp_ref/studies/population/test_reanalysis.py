"""The re-analysis of committed populations (signed contrast, attenuation, partial τ, power): unit checks and
``docs/minilm/*/reanalysis.json`` recomputed from the committed per-model files."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import kendalltau

from geosharp_ref.stats import paired_abs_tau_difference
from geosharp_ref.studies.population.reanalysis import (REANALYSIS, attenuated_tau, bootstrap_contrast_power,
                                                        contrast_power, kendall_null_sd, kendall_power, partial_tau,
                                                        partial_tau_difference, partial_tau_with_ci, reanalyse,
                                                        signed_tau_difference)

DOCS = Path(__file__).resolve().parents[4] / "docs"


def _data(n=30, seed=1):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(n)
    return g + rng.standard_normal(n), 0.3 * g + rng.standard_normal(n), g


def test_signed_difference_point_and_paired_resamples():
    x1, x2, y = _data()
    got = signed_tau_difference(x1, x2, y, n_boot=200, seed=3)
    assert got["difference"] == pytest.approx(kendalltau(x1, y).statistic - kendalltau(x2, y).statistic)
    assert got["ci"][0] <= got["mean"] <= got["ci"][1] and got["n"] == 30
    # every τ positive on every resample: the signed and the absolute contrast coincide (the same resamples)
    a = 5 * y + 0.1 * x1
    b = 5 * y + x2
    s, ab = signed_tau_difference(a, b, y, n_boot=200, seed=3), paired_abs_tau_difference(a, b, y, n_boot=200, seed=3)
    assert s["difference"] == pytest.approx(ab["difference"])
    assert s["ci"] == pytest.approx(ab["ci"])


def test_signed_difference_interval_is_a_paired_bootstrap_of_the_models():
    """The interval and sd agree with a plain scipy loop over paired resamples drawn from another generator (up to
    the Monte-Carlo error of 2,000 resamples), and pairing matters: two measures that share most of their noise
    give a paired sd below 0.6× that of resampling each τ on its own."""
    rng = np.random.default_rng(11)
    y = rng.standard_normal(80)
    shared = rng.standard_normal(80)
    x1 = y + shared + 0.3 * rng.standard_normal(80)
    x2 = 0.8 * y + shared + 0.3 * rng.standard_normal(80)
    got = signed_tau_difference(x1, x2, y, n_boot=2000, seed=0)

    def tau(x, rows):
        return np.array([kendalltau(x[r], y[r]).statistic for r in rows])

    ref = np.random.default_rng(2024)
    rows = [ref.choice(80, 80) for _ in range(2000)]
    paired = tau(x1, rows) - tau(x2, rows)
    assert got["ci"] == pytest.approx(np.quantile(paired, [0.025, 0.975]), abs=0.02)
    assert got["sd"] == pytest.approx(paired.std(ddof=1), rel=0.1)
    unpaired = tau(x1, rows) - tau(x2, [ref.choice(80, 80) for _ in range(2000)])
    assert got["sd"] < 0.6 * unpaired.std(ddof=1)


def test_signed_difference_sign_where_abs_is_biased():
    x1, x2, y = _data()
    got = signed_tau_difference(-x2, x2, y, n_boot=100)  # τ(−x, y) − τ(x, y) = −2 τ(x, y); |…| gives 0
    assert got["difference"] == pytest.approx(-2 * kendalltau(x2, y).statistic)
    assert paired_abs_tau_difference(-x2, x2, y, n_boot=100)["difference"] == pytest.approx(0, abs=1e-12)


def test_attenuated_tau():
    assert attenuated_tau(0.28, 1.0) == pytest.approx(0.28)
    assert attenuated_tau(0.28, 0.0) == 0.0
    # by hand: sin(0.14π) = 0.42578, × √0.377 = 0.26143, arcsin = 0.26449, × 2/π = 0.16838
    assert attenuated_tau(0.28, 0.377) == pytest.approx(0.16838, abs=2e-5)
    assert attenuated_tau(-0.28, 0.5) == pytest.approx(-attenuated_tau(0.28, 0.5))
    assert math.isnan(attenuated_tau(0.28, float("nan")))  # an undefined R is not "no attenuation"


@pytest.mark.parametrize("tau, reliability", [(0.28, 0.5), (0.38, 0.9), (-0.3, 0.7), (0.8, 0.5)])
def test_attenuated_tau_is_the_tau_of_a_gap_measured_with_noise(tau, reliability):
    """Normal pairs with Pearson r = sin(πτ/2) have Kendall τ; noise on the gap that leaves a fraction R of its
    variance true lowers the τ observed on 20,000 pairs to attenuated_tau(τ, R) (its sampling sd there ≈ 0.005)."""
    rng = np.random.default_rng(5)
    r = math.sin(math.pi * tau / 2)
    x = rng.standard_normal(20000)
    true_gap = r * x + math.sqrt(1 - r ** 2) * rng.standard_normal(20000)
    gap = true_gap + math.sqrt(1 / reliability - 1) * rng.standard_normal(20000)
    assert kendalltau(x, true_gap).statistic == pytest.approx(tau, abs=0.015)
    assert kendalltau(x, gap).statistic == pytest.approx(attenuated_tau(tau, reliability), abs=0.015)
    assert abs(attenuated_tau(tau, reliability)) < abs(tau) - 0.01


def test_signed_difference_of_a_constant_measure_is_undefined_not_an_error():
    """A constant measure defines τ on no resample: the contrast's interval and p are NaN (judge_primary then says
    "undecided") instead of an IndexError from an empty quantile."""
    rng = np.random.default_rng(0)
    y, x = rng.standard_normal(20), rng.standard_normal(20)
    got = signed_tau_difference(np.full(20, 0.5), x, y, n_boot=50)
    assert got["n"] == 20 and all(math.isnan(v) for v in (got["difference"], *got["ci"], got["p_positive"]))


def test_partial_tau():
    x, _, y = _data(n=40)
    z = np.random.default_rng(9).standard_normal(40)
    txy, txz, tyz = (kendalltau(a, b).statistic for a, b in ((x, y), (x, z), (y, z)))
    assert partial_tau(x, y, z) == pytest.approx((txy - txz * tyz) / math.sqrt((1 - txz ** 2) * (1 - tyz ** 2)))
    w = x + np.random.default_rng(4).standard_normal(40)
    d = partial_tau_difference(x, w, y, z, n_boot=200)
    assert d["difference"] == pytest.approx(partial_tau(x, y, z) - partial_tau(w, y, z))
    assert d["ci"][0] < d["ci"][1]
    assert math.isnan(partial_tau_difference(x, z, y, z, n_boot=20)["ci"][0])  # τ(z, y | z) is undefined


def test_partial_tau_drops_a_model_that_is_not_finite():
    """As every other τ of the analysis: a model with a NaN or inf anywhere gives the interval and n of the
    population without it, not a NaN point estimate over an interval of the resamples that happened to miss it."""
    x, _, y = _data(n=40)
    z = np.random.default_rng(9).standard_normal(40)
    w = x + np.random.default_rng(4).standard_normal(40)
    for bad in (float("nan"), float("inf")):
        xb, zb = x.copy(), z.copy()
        xb[3], zb[7] = bad, bad
        keep = np.ones(40, bool)
        keep[[3, 7]] = False
        got = partial_tau_with_ci(xb, y, zb, n_boot=200)
        assert got == partial_tau_with_ci(x[keep], y[keep], z[keep], n_boot=200)
        assert got["n"] == 38 and math.isfinite(got["tau"])
        got = partial_tau_difference(xb, w, y, zb, n_boot=200)
        assert got == partial_tau_difference(x[keep], w[keep], y[keep], z[keep], n_boot=200) and got["n"] == 38


def test_power():
    assert kendall_null_sd(40) == pytest.approx(math.sqrt(2 * 85 / (9 * 40 * 39)))
    assert kendall_power(0.0, 40, sims=2000) == pytest.approx(0.05, abs=0.02)
    assert kendall_power(0.4, 40, sims=1000) > 0.9
    assert contrast_power(0.3, 0.0, 0.7, 80, sims=500)["power"] > 0.9
    with pytest.raises(ValueError, match="not jointly possible"):
        contrast_power(0.9, -0.9, 0.9, 20, sims=10)


def test_the_bootstrap_test_has_its_level_and_the_fast_power_is_near_it():
    """The primary test run on simulated populations: with τ_geo = τ_ada it claims "better" in ≈ α/2 = 2.5 % of
    400 populations (binomial se 0.8 %); at a cell of power ≈ 0.75 it agrees with :func:`contrast_power` (2,000
    populations) within 0.1, and the bootstrap's sd is not narrower than the spread of Δ across populations that
    :func:`contrast_power` uses in its place (amendment 15)."""
    null = bootstrap_contrast_power(0.1, 0.1, 0.45, 40, sims=400, n_boot=200)
    assert abs(null["power"] - 0.025) < 0.025 and null["power_se"] == pytest.approx(
        math.sqrt(null["power"] * (1 - null["power"]) / 400))
    slow, fast = bootstrap_contrast_power(0.35, 0.1, 0.45, 40, sims=200, n_boot=200), contrast_power(0.35, 0.1, 0.45, 40)
    assert abs(slow["power"] - fast["power"]) < 0.1 and slow["bootstrap_sd"] > 0.97 * fast["sd"]
    with pytest.raises(ValueError, match="not jointly possible"):
        bootstrap_contrast_power(0.9, -0.9, 0.9, 20, sims=2)


@pytest.mark.parametrize("population", sorted(p.parent.name for p in (DOCS / "minilm").glob(f"*/{REANALYSIS}")))
def test_committed_reanalysis_recomputed(population):
    out = DOCS / "minilm" / population
    committed = json.loads((out / REANALYSIS).read_text())
    got = json.loads(json.dumps(reanalyse(out, write=False)))

    def close(a, b, path="") :
        if isinstance(a, dict):
            assert set(a) == set(b), path
            for k in a:
                close(a[k], b[k], f"{path}/{k}")
        elif isinstance(a, list):
            assert len(a) == len(b), path
            for i, (u, v) in enumerate(zip(a, b)):
                close(u, v, f"{path}[{i}]")
        elif isinstance(a, float):
            assert a == pytest.approx(b, abs=1e-9, nan_ok=True), path
        else:
            assert a == b, path

    close(committed, got)


def test_reanalysis_committed_for_both_minilm_populations():
    assert {p.parent.name for p in (DOCS / "minilm").glob(f"*/{REANALYSIS}")} >= {"seeds", "recipes"}


def test_a_contrast_with_no_possible_power_population_is_reported_without_power(tmp_path):
    """Where the measured τ between the two measures, with the paper's attenuated τ, is not jointly possible (no
    trivariate normal has them; contrast_power refuses), the contrast keeps its value and interval and states no
    power, instead of stopping the whole analysis."""
    import shutil

    out = tmp_path / "recipes"
    shutil.copytree(DOCS / "minilm" / "recipes", out)
    corr = json.loads((out / "correlation.json").read_text())
    row = next(iter(corr["measure_agreement"]))
    corr["measure_agreement"][row]["geodesic-mix"]["tau"] = 0.999  # against adaptive: then not jointly possible
    (out / "correlation.json").write_text(json.dumps(corr))
    with pytest.raises(ValueError, match="not jointly possible"):
        contrast_power(0.38, 0.06, 0.999, 40, sims=10)  # the cell's three τ (R ≤ 1 only lowers both)
    got = reanalyse(out, write=False, n_boot=50, sims=50)
    cell = got["signed_contrast"][row]["geodesic-mix - adaptive"]
    assert cell["power_for_paper_attenuated"] is None and cell["tau_between_measures"] == 0.999
    assert math.isfinite(cell["difference"]) and all(math.isfinite(v) for v in cell["ci"])
    import io

    from geosharp_ref.studies.population import reanalysis

    printed = io.StringIO()
    reanalysis._print(out, got, printed)  # the command's summary: that cell without a power
    line = next(ln for ln in printed.getvalue().splitlines() if f"{row} τ(geodesic-mix - adaptive)" in ln)
    assert "paper attenuated" in line and "power" not in line


def test_power_of_an_undefined_tau_is_undefined():
    assert math.isnan(kendall_power(float("nan"), 80, sims=10))  # not 0: an undefined R attenuates τ to NaN
