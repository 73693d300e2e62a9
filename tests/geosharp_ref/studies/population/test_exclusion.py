"""Leaving a model out of a population's evaluations (geosharp_ref.studies.population.exclusion): an evaluation
stopped by a value that is not finite names the model, the measure and the radius and no value; after `population
exclude` it resumes without the model and is complete, its records those of the uninterrupted run for the other
models; `correlate` leaves the model out of every τ (recomputed here with scipy on the rest) and lists it; `status`
counts without it; and the command refuses a bad model, an empty reason or a second exclusion in one line, with
nothing written."""
import csv
import json

import pytest
from scipy.stats import kendalltau

from geosharp_ref.cli import main
from geosharp_ref.studies import population as pop
from geosharp_ref.studies.population import evaluation
from geosharp_ref.studies.population.exclusion import EXCLUDED, exclude_model, read_excluded
from geosharp_ref.studies.population.status import population_status
from tests import cases


def test_a_model_whose_value_is_not_finite_is_named_excluded_and_the_rest_evaluated(reference, tmp_path,
                                                                                       monkeypatch, capsys):
    from geosharp_ref.sharpness import SharpnessResult

    out = cases.copy_population(reference, tmp_path)
    real = evaluation.NAMED_MEASURES["adaptive"]

    class NaNOnModel000:  # the real measure, but not finite on the first model evaluated (model_000)
        name, metric, curvature, linearised = real.name, real.metric, real.curvature, real.linearised
        calls = 0

        def evaluate(self, model, batches, rho, **kw):
            NaNOnModel000.calls += 1
            if NaNOnModel000.calls == 1:
                return SharpnessResult("adaptive", rho, float("nan"), [float("nan")], [0.123], [0.456], [], 0.0)
            return real.evaluate(model, batches, rho, **kw)

    monkeypatch.setitem(evaluation.NAMED_MEASURES, "adaptive", NaNOnModel000())
    with pytest.raises(evaluation.NonFiniteUnitError) as err:
        pop.evaluate_population(out, **cases.POPULATION_EVAL)
    message = str(err.value)
    assert message.startswith("model_000: adaptive at ρ = 0.01 is not finite on this model")
    assert "population exclude" in message and "nan" not in message.lower() and "0.123" not in message
    assert (err.value.model, err.value.measure, err.value.rho_key) == ("model_000", "adaptive", "0.01")
    monkeypatch.undo()

    assert main(["population", "exclude", "--out", str(out), "--model", "model_000", "--reason",
                 "protocol amendment: leaves the population"]) == 0
    assert read_excluded(out) == {"model_000": "protocol amendment: leaves the population"}
    recs = pop.evaluate_population(out, **cases.POPULATION_EVAL)
    ref = [json.loads(line) for line in (reference / "results.jsonl").read_text().splitlines()]
    assert sorted(recs) == [f"model_{i:03d}" for i in range(1, cases.POPULATION_MODELS)]
    # complete without it: the canonical file holds the other models' records, those of the uninterrupted run
    want = "".join(json.dumps(r, sort_keys=True) + "\n" for r in ref if r["model"] != "model_000")
    assert (out / "results.jsonl").read_text() == want and not (out / "results.units").exists()

    capsys.readouterr()
    corr = pop.correlate_population(out, n_boot=20, plot=False)
    assert corr["models"] == cases.POPULATION_MODELS - 1 and corr["excluded"] == ["model_000"]
    assert corr["missing"] == 0 and "(1 excluded)" in capsys.readouterr().out
    rows = list(csv.DictReader(open(out / "correlation.csv")))
    assert [r["model"] for r in rows] == [r["model"] for r in ref[1:]]
    gap = [r["gap"] for r in ref[1:]]
    rho = next(iter(corr["tau"]))
    for m in corr["tau"][rho]:
        tau = kendalltau([r["values"][m][rho] for r in ref[1:]], gap).statistic
        assert corr["tau"][rho][m]["tau"] == pytest.approx(tau)

    status = population_status(out)
    assert status["excluded"] == ["model_000"]
    assert status["evaluations"]["main"]["models"] == cases.POPULATION_MODELS - 1
    assert status["evaluations"]["main"]["models_finished"] == cases.POPULATION_MODELS - 1


def test_exclude_refuses_bad_input_in_one_line_and_writes_nothing(trained, tmp_path, capsys):
    out = cases.copy_population(trained, tmp_path)
    argv = ["population", "exclude", "--out", str(out)]
    assert "has no model 'model_999'" in cases.cli_error_line(capsys, argv + ["--model", "model_999", "--reason", "x"])
    assert "--reason is empty" in cases.cli_error_line(capsys, argv + ["--model", "model_001", "--reason", "  "])
    assert not (out / EXCLUDED).exists()
    assert "does not exist" in cases.cli_error_line(capsys, ["population", "exclude", "--out", str(tmp_path / "none"),
                                                         "--model", "model_001", "--reason", "x"])
    assert exclude_model(out, "model_001", "first") == {"model_001": "first"}
    before = (out / EXCLUDED).read_text()
    assert "already left out" in cases.cli_error_line(capsys, argv + ["--model", "model_001", "--reason", "again"])
    assert (out / EXCLUDED).read_text() == before
    (out / EXCLUDED).write_text(json.dumps({"models": ["model_001"]}))  # damaged by hand
    assert "must map each model's name to the reason" in cases.cli_error_line(
        capsys, ["population", "status", "--out", str(out)])
    line = cases.cli_error_line(capsys, ["population", "evaluate", "--out", str(out), "--tag", "fresh",
                                         *cases.POPULATION_EVAL_ARGS])
    assert "must map each model's name to the reason" in line
    assert not (out / "evaluation-fresh.json").exists() and not (out / "results-fresh.parts").exists()
