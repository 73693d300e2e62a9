"""Evaluating a population (geosharp_ref.studies.population.evaluation): results of every model, resumable
(torn last line, a real SIGKILL), torchrun/gloo ranks identical to one process, tagged ablations equal
to direct geodesic_sharpness calls."""
import json
import subprocess
import sys

import numpy as np
import pytest

from geosharp_ref.io.models import load_model
from geosharp_ref.sharpness import geodesic_sharpness, get_measure
from geosharp_ref.studies import population as pop
from geosharp_ref.symmetry import symmetry_map
from tests import cases

N_MODELS = cases.POPULATION_MODELS
TRAIN = cases.POPULATION_TRAIN
EVAL = cases.POPULATION_EVAL
EVAL_ARGS = cases.POPULATION_EVAL_ARGS


def test_reference_results(reference):
    lines = cases.jsonl(reference / "results.jsonl")
    assert [r["model"] for r in lines] == [f"model_{i:03d}" for i in range(N_MODELS)]
    for r in lines:
        assert set(r["values"]) == set(pop.MEASURES)
        for vals in r["values"].values():
            assert set(vals) == {"0.01", "0.05"}
            assert all(np.isfinite(v) and v >= 0 for v in vals.values())
        assert r["heads"] == 16  # 2 layers × 4 heads × (Q/K, V/O)
        # per-batch values are stored (the tweets protocol's requirement); the recorded value is their mean
        assert set(r["per_batch"]) == set(pop.MEASURES)
        for measure, cells in r["per_batch"].items():
            assert set(cells) == {"0.01", "0.05"}
            for rho, vals in cells.items():
                assert len(vals) == EVAL["n_batches"]
                assert float(np.mean(vals)) == pytest.approx(r["values"][measure][rho], rel=1e-12, abs=1e-15)
    # a second call skips everything and leaves the file byte-identical
    text = (reference / "results.jsonl").read_text()
    pop.evaluate_population(reference, **EVAL)
    assert (reference / "results.jsonl").read_text() == text
    with pytest.raises(ValueError, match="other evaluation settings"):
        pop.evaluate_population(reference, **dict(EVAL, n_iter=4))


def test_torn_last_line_is_repaired(reference, tmp_path):
    out = cases.copy_population(reference, tmp_path, results=True)
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    (out / "results.jsonl").write_text(lines[0] + lines[1] + lines[2][: len(lines[2]) // 2])  # killed mid-write
    pop.evaluate_population(out, **EVAL)
    assert (out / "results.jsonl").read_text() == (reference / "results.jsonl").read_text()


def test_sigkill_and_resume(reference, tmp_path):
    out = cases.copy_population(reference, tmp_path)
    cmd = [sys.executable, "-m", "geosharp_ref.cli", "population", "evaluate", "--out", str(out)] + EVAL_ARGS
    results = out / "results.jsonl"
    done = cases.kill_after_lines(cmd, results, timeout=120)
    assert 1 <= done < N_MODELS
    r = subprocess.run(cmd, env=cases.subprocess_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    names = [x["model"] for x in cases.jsonl(results)]
    assert sorted(names) == [f"model_{i:03d}" for i in range(N_MODELS)]  # each exactly once
    assert results.read_text() == (reference / "results.jsonl").read_text()  # same values, same order


def test_torchrun_two_gloo_ranks_match_single_process(reference, tmp_path):
    out = cases.copy_population(reference, tmp_path)
    # one model already done by an earlier run: the ranks share the three others
    ref_lines = (reference / "results.jsonl").read_text().splitlines(keepends=True)
    (out / "results.jsonl").write_text(ref_lines[1])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "geosharp_ref.cli", "population", "evaluate", "--out", str(out)] + EVAL_ARGS
    r = subprocess.run(cmd, env=cases.subprocess_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (out / "results.jsonl").read_text() == (reference / "results.jsonl").read_text()
    assert not (out / "results.parts").exists()


def test_tagged_ablation_evaluation_is_separate(reference, tmp_path):
    """Ablations go to their own files (--tag) and equal direct geodesic_sharpness calls with the flags."""
    out = cases.copy_population(reference, tmp_path, results=True)
    main_results = (out / "results.jsonl").read_text()
    ev = dict(EVAL, rhos=(0.02,), measures=("geodesic-mix-first-order", "geodesic-inv-frobenius"))
    recs = pop.evaluate_population(out, tag="abl", **ev)
    assert (out / "results.jsonl").read_text() == main_results  # untouched
    assert (out / "results-abl.jsonl").read_text().count("\n") == N_MODELS
    man = json.loads((out / "population.json").read_text())
    batches = pop.sharpness_batches(man, EVAL["n_batches"], EVAL["batch_size"], out)
    model = load_model(out / "models/model_001")
    first = geodesic_sharpness(model, batches, 0.02, metric="mix", n_iter=EVAL["n_iter"], geodesic_correction=False)
    frob = geodesic_sharpness(model, batches, 0.02, metric="inv", n_iter=EVAL["n_iter"], metric_norm=False)
    full = geodesic_sharpness(model, batches, 0.02, metric="mix", n_iter=EVAL["n_iter"])
    vals = recs["model_001"]["values"]
    assert vals["geodesic-mix-first-order"]["0.02"] == pytest.approx(first.mean, rel=1e-12)
    assert vals["geodesic-inv-frobenius"]["0.02"] == pytest.approx(frob.mean, rel=1e-12)
    assert first.mean != pytest.approx(full.mean, rel=1e-9)  # the ablation really changes the measure
    res = pop.correlate_population(out, n_boot=50, tag="abl", plot=False)
    assert set(res["tau"]["0.02"]) == set(ev["measures"]) and (out / "correlation-abl.json").is_file()
    with pytest.raises(FileNotFoundError, match="--tag nope"):
        pop.correlate_population(out, tag="nope")


def test_curvature_evaluation_records_the_standard_errors_of_each_batch(reference, tmp_path):
    """A tagged curvature evaluation (the tweets protocol's exploratory measures): each record's value, per-batch
    values and per-batch errors (Hutchinson standard errors, Lanczos residual bounds) equal direct
    ``get_measure(...).evaluate`` calls; the errors are positive and finite."""
    out = cases.copy_population(reference, tmp_path)
    measures = ("hessian-trace-mix", "hessian-top-eigenvalue-euclidean")
    recs = pop.evaluate_population(out, tag="curv", **dict(EVAL, rhos=(1.0,), measures=measures))
    man = json.loads((out / "population.json").read_text())
    batches = pop.sharpness_batches(man, EVAL["n_batches"], EVAL["batch_size"], out)
    model = load_model(out / "models/model_002")
    rec = recs["model_002"]
    for name in measures:
        direct = get_measure(name).evaluate(model, batches, 1.0, symmetry_map=symmetry_map(model), seed=0)
        assert rec["values"][name]["1"] == pytest.approx(direct.mean, rel=1e-10)
        assert rec["per_batch"][name]["1"] == pytest.approx(direct.per_batch, rel=1e-10)
        assert rec["errors"][name]["1"] == pytest.approx(direct.config["errors"], rel=1e-8)
        assert all(np.isfinite(e) and e > 0 for e in rec["errors"][name]["1"])
    assert "errors" not in cases.jsonl(reference / "results.jsonl")[0]  # Auto-PGD records have none
    res = pop.correlate_population(out, n_boot=50, tag="curv", plot=False)  # what the tweets analysis reads
    assert set(res["tau"]["1"]) == set(measures)
    header = (out / "correlation-curv.csv").read_text().splitlines()[0].split(",")
    assert {"gap", "train_error", "hessian-trace-mix@rho=1"} <= set(header)


def test_curvature_options_reach_the_curvature_measures_alone(reference, tmp_path):
    """``curvature_options`` (Hutch++ with 4 matvecs, 5 Lanczos steps) give each curvature record the value of a
    direct call with those options, and differ from the defaults'; the Auto-PGD measure beside them is unchanged;
    the options are stored with the settings only where given."""
    from geosharp_ref.sharpness.curvature import curvature_sharpness

    out = cases.copy_population(reference, tmp_path)
    measures = ("adaptive", "hessian-trace-mix", "hessian-top-eigenvalue-euclidean")
    opts = dict(probes=4, steps=5, trace_method="hutch++")
    settings = dict(EVAL, rhos=(1.0,), measures=measures, n_batches=1)
    rec = pop.evaluate_population(out, tag="opts", curvature_options=opts, **settings)["model_001"]
    assert json.loads((out / "evaluation-opts.json").read_text())["curvature"] == opts
    man = json.loads((out / "population.json").read_text())
    batches = pop.sharpness_batches(man, 1, EVAL["batch_size"], out)
    model = load_model(out / "models/model_001")
    smap = symmetry_map(model)
    trace = curvature_sharpness(model, batches, 1.0, quantity="trace", geometry="mix", probes=4,
                                trace_method="hutch++", symmetry_map=smap)
    top = curvature_sharpness(model, batches, 1.0, quantity="top-eigenvalue", geometry="euclidean", steps=5)
    assert rec["values"]["hessian-trace-mix"]["1"] == pytest.approx(trace.mean, rel=1e-10)
    assert rec["values"]["hessian-top-eigenvalue-euclidean"]["1"] == pytest.approx(top.mean, rel=1e-10)
    assert rec["errors"]["hessian-trace-mix"]["1"] == pytest.approx(trace.config["errors"], rel=1e-8)
    adaptive = get_measure("adaptive").evaluate(model, batches, 1.0, n_iter=EVAL["n_iter"], seed=0)
    assert rec["values"]["adaptive"]["1"] == pytest.approx(adaptive.mean, rel=1e-10)

    plain = pop.evaluate_population(out, tag="plain", **settings)["model_001"]  # the library's defaults
    assert "curvature" not in json.loads((out / "evaluation-plain.json").read_text())
    assert plain["values"]["adaptive"] == rec["values"]["adaptive"]
    for name in measures[1:]:
        assert plain["values"][name]["1"] != rec["values"][name]["1"]
    with pytest.raises(ValueError, match="--measures names none"):
        pop.evaluate_population(out, tag="x", curvature_options=dict(probes=4), **dict(settings, measures=["adaptive"]))
    assert not (out / "evaluation-x.json").exists()


def test_cli_curvature_options_equal_the_library(reference, tmp_path, capsys):
    """`population evaluate --probes/--trace-method/--lanczos-steps` on the hessian-* measures: the records equal
    the library's with the same curvature options, which the settings file stores."""
    from geosharp_ref.cli import main

    measures = ["hessian-trace-inv", "hessian-top-eigenvalue-mix"]
    a, b = cases.copy_population(reference, tmp_path / "a"), cases.copy_population(reference, tmp_path / "b")
    argv = ["population", "evaluate", "--out", str(a), "--rho", "1", "--batches", "1", "--batch-size", "16",
            "--measures", *measures, "--probes", "3", "--trace-method", "hutch++", "--lanczos-steps", "4",
            "--tag", "curv", "--no-progress"]
    assert main(argv) == 0, capsys.readouterr().err
    opts = dict(probes=3, trace_method="hutch++", steps=4)
    assert json.loads((a / "evaluation-curv.json").read_text())["curvature"] == opts
    pop.evaluate_population(b, rhos=(1.0,), n_batches=1, batch_size=16, measures=measures, tag="curv",
                            curvature_options=opts, progress=False)
    assert (a / "results-curv.jsonl").read_text() == (b / "results-curv.jsonl").read_text()


def test_a_killed_model_resumes_from_its_finished_measures(reference, tmp_path, monkeypatch):
    """An evaluation killed inside a model keeps that model's finished (measure, radius) units
    (results.units/); the rerun measures only the rest, and the results equal the uninterrupted ones byte for
    byte; the units are removed once the evaluation is complete. Units of other settings are not reused."""
    from geosharp_ref.studies.population import evaluation

    out = cases.copy_population(reference, tmp_path)
    units_per_model = len(pop.MEASURES) * len(EVAL["rhos"])
    die_at = units_per_model + 4  # inside the second model, after 3 of its units
    with monkeypatch.context() as mp:
        cases.count_measure_runs(mp, evaluation.NAMED_MEASURES, pop.MEASURES, die_at=die_at)
        with pytest.raises(cases.Killed):
            pop.evaluate_population(out, **EVAL)
    units = [json.loads(line) for f in sorted((out / "results.units").glob("rank*.jsonl"))
             for line in f.read_text().splitlines()]
    assert [u["model"] for u in units].count("model_001") == 3
    assert len(cases.jsonl(out / "results.jsonl")) == 1

    # units written under other settings are not reused
    other = dict(units[-1], settings="0" * 16, measure=units[-1]["measure"], value=-1.0)
    with open(out / "results.units" / "rank0.jsonl", "a") as f:
        f.write(json.dumps(other) + "\n")
    calls = cases.count_measure_runs(monkeypatch, evaluation.NAMED_MEASURES, pop.MEASURES)
    pop.evaluate_population(out, **EVAL)
    assert len(calls) == (N_MODELS - 1) * units_per_model - 3  # model_001's three finished units not measured again
    assert (out / "results.jsonl").read_text() == (reference / "results.jsonl").read_text()
    assert not (out / "results.units").exists()



def test_first_order_measures_take_one_gradient_per_batch_for_all_their_radii(reference, monkeypatch):
    """ρ‖∇L‖_* is linear in ρ: ``evaluate_model`` measures a first-order measure once (one gradient per batch) and
    rescales it for its other radii (``linearised_at``); every value and per-batch value equals a direct
    evaluation at that radius bit for bit, and so does the record's loss at θ; the Auto-PGD measure beside it is
    measured at every radius."""
    from geosharp_ref.sharpness import pipeline
    from geosharp_ref.studies.population import evaluation

    man = json.loads((reference / "population.json").read_text())
    batches = pop.sharpness_batches(man, 2, EVAL["batch_size"], reference)
    model = load_model(reference / "models/model_000")
    measures = ("adaptive", "geodesic-mix-linearised", "adaptive-linearised")
    rhos = (0.01, 0.05, 0.2)
    grads = []
    real = pipeline.gradient_dual_norm
    monkeypatch.setattr(pipeline, "gradient_dual_norm", lambda *a, **k: grads.append(1) or real(*a, **k))
    calls = cases.count_measure_runs(monkeypatch, evaluation.NAMED_MEASURES, measures)
    rec = evaluation.evaluate_model(model, batches, rhos, measures=measures, n_iter=2)
    assert calls.count("adaptive") == 3 and calls.count("adaptive-linearised") == 1
    assert len(grads) == 2 * len(batches)  # one gradient per batch for each first-order measure, not per radius
    monkeypatch.undo()
    smap = symmetry_map(model)
    for name in measures[1:]:
        for rho in rhos:
            direct = get_measure(name).evaluate(model, batches, rho, symmetry_map=smap)
            key = evaluation.rho_key(rho)
            assert rec["values"][name][key] == direct.mean and rec["per_batch"][name][key] == direct.per_batch
    assert rec["loss"] == sum(direct.loss_before) / len(direct.loss_before)


def test_linearised_at_equals_a_new_evaluation_and_refuses_other_results(reference):
    from geosharp_ref.sharpness import linearised_sharpness
    from geosharp_ref.sharpness.pipeline import linearised_at

    man = json.loads((reference / "population.json").read_text())
    batches = pop.sharpness_batches(man, 2, EVAL["batch_size"], reference)
    model = load_model(reference / "models/model_001")
    first = linearised_sharpness(model, batches, 0.02, metric="inv")
    again = linearised_sharpness(model, batches, 0.3, metric="inv")
    got = linearised_at(first, 0.3)
    for f in ("measure", "rho", "mean", "per_batch", "loss_before", "loss_after", "perturbation_norms", "config"):
        assert getattr(got, f) == getattr(again, f), f
    assert first.rho == 0.02 and first.config is not got.config
    with pytest.raises(ValueError, match="not a first-order result"):
        linearised_at(get_measure("adaptive").evaluate(model, batches, 0.02, n_iter=1), 0.3)
    with pytest.raises(ValueError, match="rho"):
        linearised_at(first, -1.0)


def test_a_measure_that_is_not_finite_stops_the_evaluation_at_its_model(reference, tmp_path, monkeypatch):
    """A NaN sharpness is refused where it is measured (ValueError naming the measure), before its unit is
    written, instead of by the correlation after every model."""
    from geosharp_ref.sharpness import SharpnessResult
    from geosharp_ref.studies.population import evaluation

    out = cases.copy_population(reference, tmp_path)

    class NaNMeasure:
        name, metric, curvature, linearised = "adaptive", None, None, False

        def evaluate(self, model, batches, rho, **kw):
            return SharpnessResult("adaptive", rho, float("nan"), [float("nan")], [0.1], [0.1], [], 0.0)

    monkeypatch.setitem(evaluation.NAMED_MEASURES, "adaptive", NaNMeasure())
    with pytest.raises(ValueError, match="adaptive at ρ = 0.01 is not finite"):
        pop.evaluate_population(out, **EVAL)
    units = list((out / "results.units").glob("rank*.jsonl")) if (out / "results.units").exists() else []
    assert not any('"adaptive"' in f.read_text() for f in units)
    assert not (out / "results.jsonl").exists() or not (out / "results.jsonl").read_text()
