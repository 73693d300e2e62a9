"""``geosharp population status`` (geosharp_ref.studies.population.status) on the tiny vision population at each
stage: training not finished, a killed evaluation, a calibration in progress, the reliability; every count and
time against the files themselves, the whole status compared (so it holds no result value), nothing written."""
import json
import shutil
import statistics

import pytest

from geosharp_ref.cli import main
from geosharp_ref.studies import population as pop
from geosharp_ref.studies.population import calibration, evaluation
from geosharp_ref.studies.population.reliability import gap_reliability, predict_test_set
from geosharp_ref.studies.population.status import format_status, population_status
from tests import cases

EVAL = cases.POPULATION_EVAL


def _snapshot(root):
    return sorted((p.relative_to(root), p.stat().st_mtime_ns) for p in root.rglob("*"))


def _training_seconds(out, names):
    return [json.loads((out / "models" / n / "geosharp_model.json").read_text())["seconds"] for n in names]


def test_status_of_a_population_in_training(trained, tmp_path, capsys):
    out = cases.copy_population(trained, tmp_path)
    names = [f"model_{i:03d}" for i in range(cases.POPULATION_MODELS)]
    seconds = _training_seconds(out, names[:-1])
    shutil.rmtree(out / "models" / names[-1])  # the last model not trained yet, and a killed run's directory
    (out / "models" / ".tmp-model_003-123").mkdir()
    packed = out / "models" / names[1]  # a packed model (`population pack`): its sums, not its weights
    (packed / "SHA256SUMS").write_text(f"{'0' * 64}  model.safetensors\n")
    (packed / "model.safetensors").unlink()
    man = json.loads((out / "population.json").read_text())
    (out / "population.json").write_text(json.dumps(dict(man, complete=False)))
    # one model retrained twice by `population pipeline` (two sittings' machines): counted once
    (out / "retrained.jsonl").write_text("".join(json.dumps(dict(model=names[0], weights_sha256=h)) + "\n"
                                                 for h in ("1" * 64, "2" * 64)))
    before = _snapshot(out)
    status = population_status(out)
    med = statistics.median(seconds)
    assert status == dict(
        out=str(out), task=man["plan"]["task"],
        training=dict(planned=4, trained=3, packed=1, retrained=1, complete=False, in_progress_dirs=1,
                      median_seconds_per_model=med, remaining_worker_hours=med / 3600),
        reliability=dict(models_predicted=0, written=False),
        calibration=dict(written=False, probe_runs_finished=0, mean_seconds_per_run=None), evaluations={},
        excluded=[], every_stage=None)
    capsys.readouterr()
    assert main(["population", "status", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.strip() == format_status(status)
    assert "3 of 4 models trained (1 packed: rebuilt from their recipes when loaded) (1 retrained on a machine that " \
           "did not rebuild them), training not finished; 1 in progress" in text and "evaluations: none" in text
    assert main(["population", "status", "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(status))
    assert _snapshot(out) == before  # nothing written


def test_status_of_a_killed_evaluation_and_calibration(reference, trained, tmp_path, monkeypatch):
    out = cases.copy_population(trained, tmp_path)
    per_model = len(pop.MEASURES) * len(EVAL["rhos"])
    with monkeypatch.context() as mp:
        cases.count_measure_runs(mp, evaluation.NAMED_MEASURES, pop.MEASURES, die_at=per_model + 4)
        with pytest.raises(cases.Killed):
            pop.evaluate_population(out, **EVAL)
    with monkeypatch.context() as mp:
        cases.count_measure_runs(mp, calibration.NAMED_MEASURES, ["adaptive"], die_at=3)
        with pytest.raises(cases.Killed):
            calibration.calibrate_population(out, sizes=(1e-3,), measures=("adaptive",), models=2, batch_size=16,
                                             probe_rhos=(0.01, 0.05), n_iter=3, progress=False)
    units = cases.jsonl(out / "results.units" / "rank0.jsonl")
    assert len(units) == per_model + 3 and all(u["seconds"] > 0 for u in units)  # the units carry their times
    runs = cases.jsonl(out / "calibration.units.jsonl")
    status = population_status(out)
    mean = statistics.fmean(u["seconds"] for u in units)
    left = (cases.POPULATION_MODELS - 1) * per_model - 3
    assert status["evaluations"] == {"main": dict(
        models_finished=1, models=cases.POPULATION_MODELS, units_per_model=per_model, models_in_progress=1,
        units_finished_in_models_in_progress=3, units_left=left, mean_seconds_per_unit=mean,
        remaining_worker_hours=left * mean / 3600, correlated=False)}
    assert status["calibration"] == dict(written=False, probe_runs_finished=2,
                                         mean_seconds_per_run=statistics.fmean(u["seconds"] for u in runs))
    assert "main: 1 of 4 models finished (+3 of 6 units of the 1 model in progress)" in format_status(status)
    # a second worker's model in progress (as `population pipeline` has one per worker): counted apart
    other = next(m["name"] for m in json.loads((out / "population.json").read_text())["models"]
                 if m["name"] not in {u["model"] for u in units})
    with open(out / "results.units" / "rank1.jsonl", "w") as f:
        f.write(json.dumps(dict(units[-1], model=other)) + "\n")
    two = population_status(out)["evaluations"]["main"]
    assert (two["models_in_progress"], two["units_finished_in_models_in_progress"], two["units_left"]) == \
        (2, 4, left - 1)
    assert f"(+4 of {2 * per_model} units of the 2 models in progress)" in format_status(population_status(out))
    (out / "results.units" / "rank1.jsonl").unlink()

    pop.evaluate_population(out, **EVAL)  # finished: the units are gone, the records are whole
    pop.correlate_population(out, n_boot=20, plot=False)
    assert (out / "results.jsonl").read_text() == (reference / "results.jsonl").read_text()
    main_eval = population_status(out)["evaluations"]["main"]
    assert (main_eval["models_finished"], main_eval["units_left"], main_eval["correlated"]) == (4, 0, True)
    assert main_eval["mean_seconds_per_unit"] is None


def test_status_of_the_reliability(trained, tmp_path):
    out = cases.copy_population(trained, tmp_path)
    predict_test_set(out, progress=False)
    assert population_status(out)["reliability"] == dict(models_predicted=cases.POPULATION_MODELS, written=False)
    gap_reliability(out, splits=10, progress=False)
    assert population_status(out)["reliability"]["written"] is True
    assert "reliability: written" in format_status(population_status(out))
