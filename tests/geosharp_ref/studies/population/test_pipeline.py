"""`geosharp population pipeline` (amendment 13): every stage after training per model, on the package's tiny packed
vision population. The stages one after another (rebuild, calibrate, reliability, evaluate per tag) are the
independent reference; each record the pipeline writes must equal theirs byte for byte once its weights' digest
(hashed here with hashlib) is set aside."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from geosharp_ref.studies import population as pop
from geosharp_ref.studies.population import pack, pipeline
from geosharp_ref.studies.population.calibration import calibrate_population, evaluation_radii
from geosharp_ref.studies.population.exclusion import exclude_model
from geosharp_ref.studies.population.reliability import gap_reliability
from tests import cases

#: the calibration, two evaluations (one on the calibrated grid, one of a curvature measure) and the reliability
CALIBRATE = dict(sizes=[1e-3], measures=["adaptive"], models=2, batch_size=8, probe_rhos=(0.01, 0.03), n_iter=2)
EVALUATIONS = [dict(calibration=True, measures=["adaptive"], n_batches=2, batch_size=16, n_iter=3, tag=""),
               dict(rhos=[1.0], measures=["hessian-trace-inv"], n_batches=1, batch_size=16, tag="curvature",
                    curvature_options=dict(probes=2, steps=None, trace_method=None))]
RELIABILITY = dict(splits=5, seed=0)
#: the same plan as a plan file's argv
PLAN = {"calibrate": ["--sizes", "1e-3", "--measures", "adaptive", "--models", "2", "--batch-size", "8",
                      "--probe-rho", "0.01", "0.03", "--iters", "2"],
        "evaluate": [["--calibration", "--measures", "adaptive", "--batches", "2", "--batch-size", "16", "--iters",
                      "3"],
                     ["--rho", "1", "--measures", "hessian-trace-inv", "--batches", "1", "--batch-size", "16",
                      "--tag", "curvature", "--probes", "2"]],
        "reliability": ["--splits", "5", "--seed", "0"]}
#: every file both ways write, compared (the digests set aside)
COMPARED = ["calibration.json", "evaluation.json", "evaluation-curvature.json", "results.jsonl",
            "results-curvature.jsonl", "test_predictions.jsonl", "reliability.json", "population.json"]


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _without_digest(path):
    """The file's text with every line's ``weights_sha256`` removed (and ``seconds`` of a calibration)."""
    if path.suffix == ".jsonl":
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        return "".join(json.dumps({k: v for k, v in r.items() if k != pipeline.STAMP}, sort_keys=True) + "\n"
                       for r in lines)
    obj = json.loads(path.read_text())
    obj.pop("seconds", None)  # the calibration's time
    obj.pop("stamps", None)  # the digests of the calibration's models (the pipeline's)
    return obj


def _run(out, workers=2, **kw):
    args = dict(calibrate=CALIBRATE, evaluations=EVALUATIONS, reliability=RELIABILITY)
    args.update(kw)
    return pipeline.run_pipeline(out, workers=workers, progress=False, log=open(os.devnull, "w"), **args)


@pytest.fixture(scope="module")
def packed(trained, tmp_path_factory):
    to = tmp_path_factory.mktemp("pack") / "vit-pack"
    pack.pack_population(trained, to)
    return to


@pytest.fixture(scope="module")
def stages(packed, tmp_path_factory):
    """The stages one after another, as `run-sharpness.sh` ran them (rebuild, reliability, calibrate, evaluate)."""
    out = tmp_path_factory.mktemp("stages") / "vit"
    shutil.copytree(packed, out)
    torch.set_num_threads(1)
    pack.rebuild_population(out, workers=1, progress=False)
    gap_reliability(out, **RELIABILITY, progress=False, stream=open(os.devnull, "w"))
    calibrate_population(out, **CALIBRATE, progress=False)
    for e in EVALUATIONS:
        e = dict(e)
        rhos, sizes = evaluation_radii(out, e["measures"], e.pop("rhos", None),
                                       e.pop("calibration", False), None)
        pop.evaluate_population(out, rhos=rhos, sizes=sizes, progress=False, **e)
    return out


@pytest.fixture(scope="module")
def piped(packed, tmp_path_factory):
    """The pipeline, in two worker processes, on a copy of the pack."""
    out = tmp_path_factory.mktemp("piped") / "vit"
    shutil.copytree(packed, out)
    _run(out, workers=2)
    return out


def test_the_pipeline_writes_what_the_stages_write(stages, piped, trained):
    for name in COMPARED:
        assert _without_digest(piped / name) == _without_digest(stages / name), name
    # every line of a model carries the SHA-256 of its weights (hashed here), which are the trained ones
    man = json.loads((piped / "population.json").read_text())
    digests = {m["name"]: _sha(piped / m["dir"] / "model.safetensors") for m in man["models"]}
    assert digests == {m["name"]: _sha(trained / m["dir"] / "model.safetensors") for m in man["models"]}
    for name in ("results.jsonl", "results-curvature.jsonl", "test_predictions.jsonl"):
        lines = cases.jsonl(piped / name)
        assert len(lines) == len(digests) and all(r[pipeline.STAMP] == digests[r["model"]] for r in lines)
    assert not (piped / "results.units").exists() and not (piped / "retrained.jsonl").exists()
    # the calibration records the weights of the models it was fitted on
    stamps = json.loads((piped / "calibration.json").read_text())["stamps"]
    assert stamps == {n: {pipeline.STAMP: digests[n]} for n in ("model_000", "model_001")}
    assert not list((piped / "models").glob(".tmp-*"))


def test_status_counts_the_models_with_every_stage(piped, tmp_path):
    """`population status` (blind) counts the models whose predictions and every evaluation's record are written."""
    from geosharp_ref.studies.population.status import format_status, population_status

    out = tmp_path / "vit"
    shutil.copytree(piped, out)
    assert population_status(out)["every_stage"] == cases.POPULATION_MODELS
    lines = (out / "results-curvature.jsonl").read_text().splitlines(keepends=True)
    (out / "results-curvature.jsonl").write_text("".join(lines[1:]))  # the first model's curvature not written
    exclude_model(out, json.loads(lines[1])["model"], "a test")  # an excluded model: its predictions suffice
    status = population_status(out)
    assert status["every_stage"] == cases.POPULATION_MODELS - 1
    assert f"every stage (test predictions and every evaluation): {cases.POPULATION_MODELS - 1} of " \
           f"{cases.POPULATION_MODELS} models" in format_status(status)


def test_a_complete_population_is_not_loaded_again(piped, tmp_path, monkeypatch):
    out = tmp_path / "vit"
    shutil.copytree(piped, out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and not p.name.startswith(".")}
    monkeypatch.setattr(pop.evaluation, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    assert _run(out, workers=1) == dict(models=cases.POPULATION_MODELS, retrained=0)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and not p.name.startswith(".")} == before


def test_a_killed_pipeline_resumes_to_the_same_bytes(packed, piped, tmp_path):
    """A real SIGKILL of the command (its workers die with it) after its first result line, then a rerun."""
    out = tmp_path / "vit"
    shutil.copytree(packed, out)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    cmd = [sys.executable, "-m", "geosharp_ref.cli", "population", "pipeline", "--out", str(out), "--plan", str(plan),
           "--workers", "2", "--no-progress"]
    assert 1 <= cases.kill_after_lines(cmd, out / "results.jsonl", group=True) < cases.POPULATION_MODELS
    r = subprocess.run(cmd, env=cases.subprocess_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    for name in COMPARED:
        if name == "calibration.json":
            assert _without_digest(out / name) == _without_digest(piped / name)
        else:
            assert (out / name).read_text() == (piped / name).read_text(), name


def test_a_line_of_other_weights_is_measured_again_and_nothing_else(piped, tmp_path, monkeypatch):
    """A result line whose digest is not its model's (weights retrained on another machine after it was written)
    is discarded and that model's evaluation alone runs again; the files end as they were."""
    out = tmp_path / "vit"
    shutil.copytree(piped, out)
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    r = json.loads(lines[1])
    r[pipeline.STAMP] = "0" * 64
    (out / "results.jsonl").write_text(lines[0] + json.dumps(r, sort_keys=True) + "\n" + "".join(lines[2:]))
    loaded = []
    real = pop.evaluation.load_model
    monkeypatch.setattr(pop.evaluation, "load_model", lambda path, *a, **k: loaded.append(path.name) or real(path))
    _run(out, workers=1)
    assert loaded == [r["model"]]
    for name in COMPARED:
        assert (out / name).read_text() == (piped / name).read_text(), name


def test_discard_stale_drops_only_that_models_lines_of_other_weights(tmp_path):
    """In the pipeline's own files (predictions, probe runs, its evaluation "x") every line of the model without its
    digest goes; in another evaluation on disk ("y", run by hand) only a line with another digest, and a line with
    none only where the model was just retrained."""
    out = tmp_path / "vit"
    rows = [dict(model="a", weights_sha256="1", v=1), dict(model="a", weights_sha256="2", v=2),
            dict(model="a", v=3), dict(model="b", weights_sha256="2", v=4)]
    owned = [out / "test_predictions.jsonl", out / "calibration.units.jsonl", out / "results-x.jsonl",
             out / "results-x.parts" / "rank1.jsonl", out / "results-x.units" / "rank0.jsonl"]
    other = [out / "results-y.jsonl", out / "results-y.parts" / "rank0.jsonl", out / "results-y.units" / "rank0.jsonl"]

    def write():
        for path in owned + other:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))

    write()
    assert pipeline.discard_stale(out, "a", "1", ["x"]) == 2 * len(owned) + len(other)
    assert all([r["v"] for r in cases.jsonl(p)] == [1, 4] for p in owned)
    assert all([r["v"] for r in cases.jsonl(p)] == [1, 3, 4] for p in other)
    write()
    assert pipeline.discard_stale(out, "a", "1", ["x"], retrained=True) == 2 * len(owned + other)
    assert all([r["v"] for r in cases.jsonl(p)] == [1, 4] for p in owned + other)


def test_a_retrain_measures_with_one_thread_and_equal_weights_with_another_file_are_refused(packed, tmp_path,
                                                                                           monkeypatch):
    out = tmp_path / "vit"
    shutil.copytree(packed, out)
    man = json.loads((out / "population.json").read_text())
    for m, damaged in zip(man["models"][:2], ("model.safetensors", "config.json")):
        lines = (out / m["dir"] / "SHA256SUMS").read_text().splitlines()
        i = next(i for i, line in enumerate(lines) if line.endswith(damaged))
        lines[i] = ("0" if lines[i][0] != "0" else "1") + lines[i][1:]
        (out / m["dir"] / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    threads, real = [], pack.measure_one
    monkeypatch.setattr(pack, "measure_one", lambda *a: threads.append(torch.get_num_threads()) or real(*a))
    torch.set_num_threads(2)
    try:
        digest = pack.ensure_weights(out, man["models"][0], progress=False)
        assert threads == [1] and torch.get_num_threads() == 2
        assert digest == _sha(out / "models" / "model_000" / "model.safetensors")
        with pytest.raises(ValueError, match=r"model_001: the rebuilt weights have their recorded SHA-256 but "
                                             r"\['config.json'\] differ"):
            pack.ensure_weights(out, man["models"][1], progress=False)
    finally:
        torch.set_num_threads(1)
    assert pack.is_packed(out / "models" / "model_001") and threads == [1]


def test_the_reliability_is_computed_again_from_the_stored_predictions(piped, tmp_path):
    out = tmp_path / "vit"
    shutil.copytree(piped, out)
    (out / "reliability.json").write_text('{"models": 0}\n')  # e.g. written before a model was retrained
    _run(out, workers=1)
    assert (out / "reliability.json").read_text() == (piped / "reliability.json").read_text()


def test_weights_that_do_not_reproduce_are_retrained_with_their_errors_measured_again(packed, trained, piped,
                                                                                      tmp_path):
    """Two packed models whose recorded weights' SHA-256 this machine does not reproduce (damaged here, as another
    CPU's would differ), with a planted test error: both are retrained by the two workers at once, their errors
    measured again (the trained population's, as training measured them), the old records kept in superseded/, both
    manifest entries synced (no edit lost), and every other file as the clean pipeline wrote it."""
    out = tmp_path / "vit"
    shutil.copytree(packed, out)
    man = json.loads((out / "population.json").read_text())
    old = {}
    for m in man["models"][2:4]:  # outside the calibration's two models: both retrained inside the workers
        d = out / m["dir"]
        lines = (d / "SHA256SUMS").read_text().splitlines()
        i = next(i for i, line in enumerate(lines) if line.endswith("model.safetensors"))
        lines[i] = ("0" if lines[i][0] != "0" else "1") + lines[i][1:]
        (d / "SHA256SUMS").write_text("\n".join(lines) + "\n")
        record = json.loads((d / "geosharp_model.json").read_text())
        record["metrics"]["test_error"] = m["metrics"]["test_error"] = 0.999  # a sentinel: must be measured again
        (d / "geosharp_model.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        old[m["name"]] = lines[i][:64]
    (out / "population.json").write_text(json.dumps(man, indent=2))
    # and the first one's retrain killed between its two renames: the old directory aside, the new one half written
    name = man["models"][2]["name"]
    os.replace(out / "models" / name, out / "models" / f".swap-{name}")
    (out / "models" / f".tmp-rebuild-{name}-99999").mkdir()
    (out / "models" / f".tmp-rebuild-{name}-99999" / "config.json").write_text("{")
    assert _run(out, workers=2) == dict(models=cases.POPULATION_MODELS, retrained=2)
    assert not [p.name for p in (out / "models").iterdir() if p.name.startswith((".swap", ".tmp"))]
    retrained = cases.jsonl(out / "retrained.jsonl")
    assert sorted(r["model"] for r in retrained) == sorted(old)
    for r in retrained:
        name = r["model"]
        assert r["old_weights_sha256"] == old[name]
        assert r["weights_sha256"] == _sha(trained / "models" / name / "model.safetensors")
        assert _sha(out / "models" / name / "model.safetensors") == r["weights_sha256"]
        kept = out / "superseded" / f"{name}-{old[name][:16]}"
        assert json.loads((kept / "geosharp_model.json").read_text())["metrics"]["test_error"] == 0.999
        new = json.loads((out / "models" / name / "geosharp_model.json").read_text())
        first = json.loads((trained / "models" / name / "geosharp_model.json").read_text())
        assert new["metrics"] == first["metrics"] and new["hparams"] == first["hparams"]
        assert pack.read_sums(out / "models" / name) == pack.model_sums(trained / "models" / name)
    for name in COMPARED:
        assert _without_digest(out / name) == _without_digest(piped / name), name


def _stopped_training(packed, out, untrained):
    """A copy of the pack as `population train` leaves a population it has not finished (amendment 14): a manifest
    without metrics, not complete, and no directory for the models ``untrained`` (indices)."""
    shutil.copytree(packed, out)
    man = json.loads((out / "population.json").read_text())
    for m in man["models"]:
        m.pop("metrics")
    man["complete"] = False
    (out / "population.json").write_text(json.dumps(man, indent=2, sort_keys=True) + "\n")
    for i in untrained:
        shutil.rmtree(out / man["models"][i]["dir"])
    return man


def test_models_not_trained_yet_are_trained_as_population_train_trains_them(packed, trained, piped, tmp_path):
    """Amendment 14: on a population whose training stopped with two models untrained (one of the calibration's two,
    one outside it; a killed training's temporary directory beside them), the pipeline trains them, bit for bit as
    `population train` did, marks the population trained, and writes every file as it does on the whole one."""
    out = tmp_path / "vit"
    man = _stopped_training(packed, out, untrained=(1, 2))
    (out / "models" / ".tmp-model_002-99999").mkdir()
    live = out / "models" / f".tmp-model_002-{os.getpid()}"  # a live process's: an older trainer may be writing it
    live.mkdir()
    assert _run(out, workers=2) == dict(models=cases.POPULATION_MODELS, retrained=0)
    assert list((out / "models").glob(".tmp-*")) == [live] and not (out / "retrained.jsonl").exists()
    for m in man["models"]:
        assert _sha(out / m["dir"] / "model.safetensors") == _sha(trained / m["dir"] / "model.safetensors")
    for m in man["models"][1:3]:
        assert pack.model_sums(out / m["dir"]) == pack.model_sums(trained / m["dir"])
        new, first = (json.loads((d / m["dir"] / "geosharp_model.json").read_text()) for d in (out, trained))
        assert {k: v for k, v in new.items() if k != "seconds"} == {k: v for k, v in first.items() if k != "seconds"}
    for name in COMPARED:
        assert _without_digest(out / name) == _without_digest(piped / name), name


def test_the_pipeline_and_population_train_refuse_one_another(packed, tmp_path):
    """One trainer at a time (``.train.lock``): the pipeline is refused while `population train` holds the
    population, and `population train` while the pipeline does; neither trains a model."""
    from geosharp_ref.io.durable import exclusive_lock
    from geosharp_ref.studies.population.training import TRAIN_LOCK

    out = tmp_path / "vit"
    man = _stopped_training(packed, out, untrained=(3,))
    with exclusive_lock(out / TRAIN_LOCK):
        with pytest.raises(ValueError, match="`geosharp population train` is training the population"):
            _run(out, workers=1, calibrate=None, evaluations=EVALUATIONS[1:], reliability=None)
        with pytest.raises(ValueError, match="another `geosharp population train` or `pipeline` is training"):
            pop.train_population(out, **cases.POPULATION_TRAIN)
    assert not (out / man["models"][3]["dir"]).exists() and not (out / "results-curvature.jsonl").exists()


def test_a_model_is_excluded_while_the_training_is_unfinished(packed, tmp_path):
    """The evaluation's error of a value that is not finite says to exclude the model; the pipeline may still be
    training others then."""
    from geosharp_ref.studies.population.exclusion import read_excluded

    out = tmp_path / "vit"
    _stopped_training(packed, out, untrained=(3,))
    exclude_model(out, "model_003", "a test")
    assert read_excluded(out) == {"model_003": "a test"}


def test_a_calibration_whose_models_are_not_trained_is_refused_before_anything_is_written(packed, tmp_path):
    out = tmp_path / "vit"
    _stopped_training(packed, out, untrained=(1,))
    before = {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=r"the calibration's models \['model_001'\] are not trained yet"):
        calibrate_population(out, **CALIBRATE, progress=False)
    r = subprocess.run([sys.executable, "-m", "geosharp_ref.cli", "population", "calibrate", "--out", str(out),
                        *PLAN["calibrate"]], env=cases.subprocess_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"geosharp: error: the calibration's models ['model_001'] are not trained yet; let `geosharp population "
        f"train --out {out}` train them (or run `geosharp population pipeline`, which trains them first)"]
    assert {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    # its models trained, the training unfinished: the calibration runs
    calibrate_population(out, **dict(CALIBRATE, models=1), progress=False)
    assert json.loads((out / "calibration.json").read_text())["models_used"] == ["model_000"]


def test_another_calibration_or_a_measure_it_lacks_is_refused_before_anything_is_written(packed, piped, tmp_path):
    done, fresh = tmp_path / "done" / "vit", tmp_path / "fresh" / "vit"
    shutil.copytree(piped, done)
    shutil.copytree(packed, fresh)
    cases_ = [(done, dict(calibrate=dict(CALIBRATE, n_iter=3)), "holds another calibration"),
              (fresh, dict(evaluations=[dict(EVALUATIONS[0], measures=["geodesic-inv"])]),
               r"the calibration has no radii for \['geodesic-inv'\]"),
              (fresh, dict(evaluations=[dict(EVALUATIONS[0], sizes=[2e-3])]), "size 0.002 was not calibrated"),
              (fresh, dict(calibrate=dict(CALIBRATE, models=9)), "--models 9 exceeds the 4 models"),
              (fresh, dict(evaluations=[EVALUATIONS[0], dict(EVALUATIONS[1], measures=["no-such"])]),
               r"unknown measures \['no-such'\]")]
    # last: settings of an earlier evaluation that differ in more than the radii still to be calibrated
    cases_.append((fresh, {}, "holds other evaluation settings"))
    for out, kw, match in cases_:
        if match == "holds other evaluation settings":
            (fresh / "evaluation.json").write_text(json.dumps(dict(measures=["adaptive"], iters=99)))
        before = {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        with pytest.raises(ValueError, match=match):
            _run(out, workers=1, **kw)
        assert {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_an_excluded_model_gets_weights_and_predictions_only(packed, tmp_path):
    out, ref = tmp_path / "a" / "vit", tmp_path / "b" / "vit"
    for d in (out, ref):
        shutil.copytree(packed, d)
        exclude_model(d, "model_001", "a test")
    _run(out, workers=1, calibrate=None, evaluations=EVALUATIONS[1:], reliability=None)
    pack.rebuild_population(ref, workers=1, progress=False)
    e = dict(EVALUATIONS[1])
    pop.evaluate_population(ref, rhos=e.pop("rhos"), progress=False, **e)
    assert _without_digest(out / "results-curvature.jsonl") == _without_digest(ref / "results-curvature.jsonl")
    assert "model_001" not in (out / "results-curvature.jsonl").read_text()
    assert "model_001" in {r["model"] for r in cases.jsonl(out / "test_predictions.jsonl")}
    assert not pack.is_packed(out / "models" / "model_001")


def test_the_plan_file_is_parsed_by_the_commands_own_options(tmp_path):
    from geosharp_ref.cli.population import pipeline_stages

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    stages = pipeline_stages(tmp_path / "vit", plan)
    assert {k: v for k, v in stages["calibrate"].items() if k not in ("threads", "length_buckets")} == \
        dict(CALIBRATE, probe_rhos=[0.01, 0.03])
    assert stages["reliability"] == RELIABILITY
    for got, want in zip(stages["evaluations"], EVALUATIONS):
        assert {k: got[k] for k in want} == want


@pytest.mark.parametrize("plan, match", [
    ({"evaluate": [["--out", "x"]]}, "gives --out"),
    ({"evaluate": [["--threads", "2"]]}, "one thread each"),
    ({"evaluate": [["--rho", "-1"]]}, r"'evaluate'\[0\]: --rho"),
    ({"evaluate": [["--bogus"]]}, "unrecognized arguments"),
    ({"calibrate": "--sizes 1e-3"}, "must be a list of option strings"),
    ({"train": []}, "unknown stages"),
])
def test_a_bad_plan_is_one_line_and_writes_nothing(packed, tmp_path, capsys, plan, match):
    from geosharp_ref.cli import main

    out = tmp_path / "vit"
    shutil.copytree(packed, out)
    before = {str(p): p.read_bytes() for p in out.rglob("*")if p.is_file()}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    assert main(["population", "pipeline", "--out", str(out), "--plan", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("geosharp: error:") and err.count("\n") == 1
    import re

    assert re.search(match, err), err
    assert {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
