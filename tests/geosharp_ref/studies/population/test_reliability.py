"""Split-half reliability of a population's gaps (``geosharp_ref.studies.population.reliability``), on the
tiny vision population: predictions against the recorded test errors, τ_half against a direct recomputation
with scipy, resumption, and the bad inputs."""
import hashlib
import io
import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import kendalltau

from geosharp_ref.cli import main
from geosharp_ref.studies.population.evaluation import load_population_model
from geosharp_ref.studies.population.manifest import read_manifest
from geosharp_ref.studies.population.pack import STAMP
from geosharp_ref.studies.population.pipeline import model_complete
from geosharp_ref.studies.population.reliability import (PREDICTIONS, gap_reliability, split_half_gaps,
                                                          split_half_reliability, predict_test_set)
from geosharp_ref.studies.population.tasks import get_task
from tests import cases


@pytest.fixture(scope="module")
def population(trained, tmp_path_factory):
    return cases.copy_population(trained, tmp_path_factory.mktemp("reliability"))


def test_predictions_reproduce_the_recorded_test_errors(population):
    man = read_manifest(population)
    preds = predict_test_set(population, progress=False)
    split = get_task(man["plan"]["task"]).load_split(man["plan"]["data"], population)
    y = split.y_test.numpy()
    for m in man["models"]:
        assert len(preds[m["name"]]) == len(y)
        assert np.mean(np.asarray(preds[m["name"]]) != y) == pytest.approx(m["metrics"]["test_error"], abs=1.5 / len(y))
    # one model directly, one example at a time (no batching)
    model = load_population_model(population, man["models"][1]).eval()
    with torch.no_grad():
        direct = [int(model(**{k: v[i:i + 1] for k, v in split.test.items()}).logits.argmax(-1)) for i in range(5)]
    assert preds[man["models"][1]["name"]][:5] == direct


def test_each_line_carries_the_digest_of_the_weights_that_predicted(population):
    """A hand-started run stamps its lines as the pipeline does, so the pipeline does not predict those models again."""
    predict_test_set(population, progress=False)
    man = read_manifest(population)
    digests = {m["name"]: hashlib.sha256((population / m["dir"] / "model.safetensors").read_bytes()).hexdigest()
               for m in man["models"]}
    lines = cases.jsonl(population / PREDICTIONS)
    assert {r["model"]: r[STAMP] for r in lines} == digests and len(lines) == len(digests)
    assert all(model_complete(population, m, tags=[], excluded=set()) for m in man["models"])


def test_a_line_of_other_weights_is_predicted_again(trained, tmp_path):
    """A model retrained since its line was written (its stamp is another digest) is predicted again, one line
    appended, the stored predictions of other weights unused; an unstamped line (written before the stamp) counts."""
    out = cases.copy_population(trained, tmp_path)
    first = predict_test_set(out, progress=False)
    lines = cases.jsonl(out / PREDICTIONS)
    stale = dict(lines[0], predictions=[0] * len(lines[0]["predictions"]), **{STAMP: "0" * 64})
    (out / PREDICTIONS).write_text("".join(json.dumps(r) + "\n" for r in [stale] + lines[1:]))
    assert predict_test_set(out, progress=False) == first
    now = cases.jsonl(out / PREDICTIONS)
    assert [r["model"] for r in now] == [r["model"] for r in lines + lines[:1]] and now[-1] == lines[0]
    unstamped = [{k: v for k, v in r.items() if k != STAMP} for r in lines]
    (out / PREDICTIONS).write_text("".join(json.dumps(r) + "\n" for r in unstamped))
    assert predict_test_set(out, progress=False) == first and len(cases.jsonl(out / PREDICTIONS)) == len(lines)


def test_split_half_tau_against_a_direct_recomputation(population):
    result = gap_reliability(population, splits=7, seed=3, progress=False, stream=io.StringIO())
    man = read_manifest(population)
    preds = predict_test_set(population, progress=False)
    y = get_task(man["plan"]["task"]).load_split(man["plan"]["data"], population).y_test.numpy()
    train = np.array([m["metrics"]["train_error"] for m in man["models"]])
    rng = np.random.default_rng(3)
    taus = []
    for _ in range(7):
        idx = rng.permutation(len(y))[: len(y) // 2]
        inside = np.isin(np.arange(len(y)), idx)
        ga = [np.mean([preds[m["name"]][j] != y[j] for j in range(len(y)) if inside[j]]) - t
              for m, t in zip(man["models"], train)]
        gb = [np.mean([preds[m["name"]][j] != y[j] for j in range(len(y)) if not inside[j]]) - t
              for m, t in zip(man["models"], train)]
        t = kendalltau(ga, gb).statistic
        taus.append(t if np.isfinite(t) else 0.0)
    assert result["tau_half"]["median"] == pytest.approx(float(np.median(taus)))
    r = math.sin(math.pi * np.median(taus) / 2)
    assert result["pearson_full_spearman_brown"] == pytest.approx(2 * r / (1 + r))
    if r > 0:  # the ceiling in τ units: τ = (2/π) arcsin r for a bivariate normal
        assert math.sin(math.pi * result["tau_ceiling"] / 2) ** 2 == pytest.approx(2 * r / (1 + r))
    else:  # an unreliable gap leaves no room for any correlation
        assert result["tau_ceiling"] == 0.0 and result["correlation_ceiling"] == 0.0
    gaps = [m["metrics"]["gap"] for m in man["models"]]
    assert result["gap_sd"] == pytest.approx(float(np.std(gaps, ddof=1)), abs=1e-9)
    assert json.loads((population / "reliability.json").read_text()) == result


def test_split_half_gaps_of_a_model_that_errs_only_in_one_half():
    wrong = np.array([[True, True, False, False], [False, False, False, False]])
    half = np.array([True, True, False, False])
    ga, gb = split_half_gaps(wrong, np.array([0.25, 0.0]), half)
    assert ga.tolist() == [0.75, 0.0] and gb.tolist() == [-0.25, 0.0]


@pytest.mark.parametrize("spread, seed", [(0.02, 0), (0.01, 1)])
def test_split_half_reliability_estimates_the_reliability_of_a_binomial_test_set(spread, seed):
    """100 models of true error p_m ≈ 0.2 ± ``spread``, each test document wrong independently with probability p_m:
    the measured error's reliability over n = 2,000 documents is var(p) / (var(p) + mean(p(1 − p)) / n) (≈ 0.82 and
    ≈ 0.48 here); the split-half estimate projected by Spearman–Brown recovers it within 0.08."""
    rng = np.random.default_rng(seed)
    p = np.clip(0.2 + spread * rng.standard_normal(100), 0.01, 0.99)
    wrong = rng.random((100, 2000)) < p[:, None]
    true = p.var() / (p.var() + np.mean(p * (1 - p)) / 2000)
    _, (lo, hi), r_full = split_half_reliability(wrong, np.full(100, 0.01), splits=50, seed=seed)
    assert abs(r_full - true) < 0.08 and lo < hi


def test_predictions_resume_and_refuse_a_foreign_manifest(population, tmp_path):
    full = cases.copy_population(population, tmp_path / "full")
    expected = predict_test_set(full, progress=False)  # this test's own complete predictions file
    out = cases.copy_population(population, tmp_path)
    lines = (full / PREDICTIONS).read_text().splitlines(keepends=True)
    (out / PREDICTIONS).write_text(lines[0] + lines[1][:10])  # one model done, the next torn
    assert predict_test_set(out, progress=False) == expected
    assert (out / PREDICTIONS).read_text() == "".join(lines)
    (out / PREDICTIONS).unlink()
    man = json.loads((out / "population.json").read_text())
    man["models"][0]["metrics"]["test_error"] += 0.25
    (out / "population.json").write_text(json.dumps(man))
    with pytest.raises(ValueError, match="do not belong together"):
        predict_test_set(out, progress=False)


def test_cli_reliability_and_its_bad_input(population, tmp_path, capsys):
    assert main(["population", "reliability", "--out", str(population), "--splits", "5", "--no-progress"]) == 0
    assert "split-half reliability of the gap over 4 models" in capsys.readouterr().out
    err = cases.cli_error_line(capsys, ["population", "reliability", "--out", str(population), "--splits", "0"])
    assert "--splits must be a positive integer" in err
    assert "nothing" in cases.cli_error_line(capsys, ["population", "reliability", "--out", str(tmp_path / "nothing")])


def test_correlate_reports_the_ceiling_of_the_same_models(reference, tmp_path):
    from geosharp_ref.studies.population.correlation import correlate_population

    out = cases.copy_population(reference, tmp_path, results=True)
    stream = io.StringIO()
    assert "gap_reliability" not in correlate_population(out, n_boot=50, plot=False, stream=io.StringIO())
    rel = gap_reliability(out, splits=5, progress=False, stream=io.StringIO())
    result = correlate_population(out, n_boot=50, plot=False, stream=stream)
    assert result["gap_reliability"] == {k: rel[k] for k in ("tau_half", "tau_ceiling", "correlation_ceiling")}
    assert f"no measure can reach |τ| above about {rel['tau_ceiling']:.2f}" in stream.getvalue()
    # with --where the models are a stratum, not what the reliability was measured on
    hparams = [m["hparams"] for m in read_manifest(out)["models"]]
    key, value = max(((k, h[k]) for h in hparams for k in h), key=lambda kv: sum(h.get(kv[0]) == kv[1] for h in hparams))
    assert sum(h.get(key) == value for h in hparams) >= 3
    sub = correlate_population(out, n_boot=50, plot=False, stream=io.StringIO(), where={key: value})
    assert "gap_reliability" not in sub
