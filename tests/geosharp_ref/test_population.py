"""Vision populations (tiny ViTs on sklearn digits): training, resumable evaluation (real SIGKILL),
torchrun/gloo evaluation identical to single-process, correlation outputs, CLI."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import kendalltau

from geosharp_ref import population as pop
from geosharp_ref.cli import main
from geosharp_ref.distributed import shard

ROOT = Path(__file__).resolve().parents[2]
N_MODELS = 4
TRAIN = dict(n_models=N_MODELS, epochs_max=2, train_size_max=160, workers=1, progress=False)
# evaluation settings small enough for CI; --rho sweep of two values
EVAL = dict(rhos=(0.01, 0.05), n_batches=2, batch_size=16, n_iter=3, progress=False)
EVAL_ARGS = ["--rho", "0.01", "0.05", "--batches", "2", "--batch-size", "16", "--iters", "3", "--no-progress"]



def _env():
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    env.pop("WORLD_SIZE", None)
    return env


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("pop") / "vit"
    torch.set_num_threads(1)
    pop.train_population(out, **TRAIN)
    return out


@pytest.fixture(scope="module")
def reference(trained, tmp_path_factory):
    """An uninterrupted single-process evaluation (in a copy of the population)."""
    out = tmp_path_factory.mktemp("ref") / "vit"
    shutil.copytree(trained, out)
    torch.set_num_threads(1)
    pop.evaluate_population(out, **EVAL)
    return out


def _copy(src, tmp_path, results=False):
    dst = tmp_path / "vit"
    shutil.copytree(src, dst, ignore=None if results else shutil.ignore_patterns("results*", "evaluation.json",
                                                                                "correlation*"))
    return dst


def _lines(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines()]


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------

def test_hyperparameters_vary_and_are_deterministic():
    hs = [pop.sample_hparams(i, seed=0) for i in range(32)]
    assert hs == [pop.sample_hparams(i, seed=0) for i in range(32)]
    varied = [k for k in hs[0] if len({json.dumps(h[k]) for h in hs}) > 1]
    assert {"lr", "weight_decay", "epochs", "batch_size", "train_size", "label_noise", "augment",
            "warmup"} <= set(varied)
    assert pop.sample_hparams(0, seed=1) != hs[0]


def test_population_layout(trained):
    man = json.loads((trained / "population.json").read_text())
    assert man["complete"] and len(man["models"]) == N_MODELS
    assert man["plan"]["data"]["dataset"] == "sklearn.load_digits"
    for m in man["models"]:
        d = trained / m["dir"]
        assert (d / "config.json").is_file() and (d / "model.safetensors").is_file()
        rec = json.loads((d / "geosharp_model.json").read_text())
        assert rec["hparams"] == m["hparams"] and rec["metrics"] == m["metrics"]
        assert rec["split_seed"] == 0
        met = rec["metrics"]
        assert met["gap"] == pytest.approx(met["test_error"] - met["train_error"])
        assert 0 <= met["train_error"] <= 1 and 0 <= met["test_error"] <= 1
        assert met["train_examples"] == min(m["hparams"]["train_size"], 160)
    cfg = json.loads((trained / "models/model_000/config.json").read_text())
    assert cfg["architectures"] == ["ViTForImageClassification"] and cfg["image_size"] == 8
    assert not list((trained / "models").glob(".tmp-*"))


def test_train_resumes_only_missing_models(trained, tmp_path):
    out = _copy(trained, tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in (out / "models").iterdir()}
    weights = (out / "models/model_002/model.safetensors").read_bytes()
    shutil.rmtree(out / "models/model_002")
    (out / "models/.tmp-model_002-999").mkdir()  # debris of a killed run
    (out / "models/.tmp-model_002-999/config.json").write_text("{")
    man = pop.train_population(out, **TRAIN)
    assert man["complete"]
    after = {p.name: p.stat().st_mtime_ns for p in (out / "models").iterdir()}
    assert sorted(after) == [f"model_{i:03d}" for i in range(N_MODELS)]
    for n in before:
        if n != "model_002":
            assert after[n] == before[n]  # untouched
    # retraining is deterministic: the same weights again
    assert (out / "models/model_002/model.safetensors").read_bytes() == weights
    with pytest.raises(ValueError, match="different settings"):
        pop.train_population(out, **dict(TRAIN, epochs_max=3))


def test_two_worker_processes_match_in_process(trained, tmp_path):
    out = tmp_path / "vit2"
    pop.train_population(out, **dict(TRAIN, n_models=2, workers=2))
    for i in range(2):
        a = json.loads((trained / f"models/model_{i:03d}/geosharp_model.json").read_text())
        b = json.loads((out / f"models/model_{i:03d}/geosharp_model.json").read_text())
        assert a["metrics"] == b["metrics"]


# ------------------------------------------------------------------------------------------------
# Evaluation: resumable, kill-safe, distributed
# ------------------------------------------------------------------------------------------------

def test_reference_results(reference):
    lines = _lines(reference / "results.jsonl")
    assert [r["model"] for r in lines] == [f"model_{i:03d}" for i in range(N_MODELS)]
    for r in lines:
        assert set(r["values"]) == set(pop.MEASURES)
        for vals in r["values"].values():
            assert set(vals) == {"0.01", "0.05"}
            assert all(np.isfinite(v) and v >= 0 for v in vals.values())
        assert r["heads"] == 16  # 2 layers × 4 heads × (Q/K, V/O)
    # a second call skips everything and leaves the file byte-identical
    text = (reference / "results.jsonl").read_text()
    pop.evaluate_population(reference, **EVAL)
    assert (reference / "results.jsonl").read_text() == text
    with pytest.raises(ValueError, match="other evaluation settings"):
        pop.evaluate_population(reference, **dict(EVAL, n_iter=4))


def test_torn_last_line_is_repaired(reference, tmp_path):
    out = _copy(reference, tmp_path, results=True)
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    (out / "results.jsonl").write_text(lines[0] + lines[1] + lines[2][: len(lines[2]) // 2])  # killed mid-write
    pop.evaluate_population(out, **EVAL)
    assert (out / "results.jsonl").read_text() == (reference / "results.jsonl").read_text()


def test_sigkill_and_resume(reference, tmp_path):
    out = _copy(reference, tmp_path)
    cmd = [sys.executable, "-m", "geosharp_ref.cli", "population", "evaluate", "--out", str(out)] + EVAL_ARGS
    results = out / "results.jsonl"
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if results.is_file() and results.read_bytes().count(b"\n") >= 1:
                break
            time.sleep(0.01)
        assert proc.poll() is None, "evaluation ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    done = results.read_bytes().count(b"\n")
    assert 1 <= done < N_MODELS
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    names = [x["model"] for x in _lines(results)]
    assert sorted(names) == [f"model_{i:03d}" for i in range(N_MODELS)]  # each exactly once
    assert results.read_text() == (reference / "results.jsonl").read_text()  # same values, same order


def test_torchrun_two_gloo_ranks_match_single_process(reference, tmp_path):
    out = _copy(reference, tmp_path)
    # one model already done by an earlier run: the ranks share the three others
    ref_lines = (reference / "results.jsonl").read_text().splitlines(keepends=True)
    (out / "results.jsonl").write_text(ref_lines[1])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "geosharp_ref.cli", "population", "evaluate", "--out", str(out)] + EVAL_ARGS
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (out / "results.jsonl").read_text() == (reference / "results.jsonl").read_text()
    assert not (out / "results.parts").exists()


def test_shard_is_a_disjoint_cover():
    items = list(range(11))
    shards = [x for r in range(3) for x in shard(items, r, 3)]
    assert sorted(shards) == items and len(shards) == len(items)


# ------------------------------------------------------------------------------------------------
# Correlation and CLI
# ------------------------------------------------------------------------------------------------

def test_correlate_outputs(reference, tmp_path, capsys):
    out = _copy(reference, tmp_path, results=True)
    assert main(["population", "correlate", "--out", str(out), "--bootstrap", "200"]) == 0
    printed = capsys.readouterr().out
    assert "Kendall τ" in printed and "geodesic-mix" in printed
    res = json.loads((out / "correlation.json").read_text())
    man = json.loads((out / "population.json").read_text())
    recs = {r["model"]: r for r in _lines(out / "results.jsonl")}
    gap = [m["metrics"]["gap"] for m in man["models"]]
    for rho in ("0.01", "0.05"):
        for meas in pop.MEASURES:
            x = [recs[m["name"]]["values"][meas][rho] for m in man["models"]]
            t = res["tau"][rho][meas]
            expect = kendalltau(x, gap).statistic
            assert (np.isnan(t["tau"]) and np.isnan(expect)) or t["tau"] == pytest.approx(expect)
            assert len(t["ci"]) == 2 and t["n"] == N_MODELS
    assert (out / "correlation.png").stat().st_size > 1000
    assert (out / "correlation_rho.png").stat().st_size > 1000  # τ(ρ), two ρ values
    assert (out / "correlation_tau.csv").read_text().count("\n") == 1 + 2 * 3
    assert (out / "correlation.csv").read_text().count("\n") == 1 + N_MODELS


def test_correlate_where_restricts_to_a_hyperparameter_stratum(reference, tmp_path, capsys):
    out = _copy(reference, tmp_path, results=True)
    man = json.loads((out / "population.json").read_text())
    for i, m in enumerate(man["models"]):  # a stratum of three models, one outside it
        m["hparams"]["label_noise"] = 0.1 if i == 2 else 0.0
    (out / "population.json").write_text(json.dumps(man))
    assert pop.parse_where(["label_noise=0", "augment=false", "name=x"]) == {
        "label_noise": 0, "augment": False, "name": "x"}
    whole = pop.correlate_population(out, n_boot=50, plot=False)
    assert main(["population", "correlate", "--out", str(out), "--bootstrap", "50", "--no-plot",
                 "--where", "label_noise=0"]) == 0
    assert "with {'label_noise': 0}" in capsys.readouterr().out
    res = json.loads((out / "correlation-label_noise=0.json").read_text())
    recs = {r["model"]: r for r in _lines(out / "results.jsonl")}
    kept = [m for i, m in enumerate(man["models"]) if i != 2]
    assert res["models"] == 3 and res["where"] == {"label_noise": 0}
    gap = [m["metrics"]["gap"] for m in kept]
    for rho in ("0.01", "0.05"):
        for meas in pop.MEASURES:
            expect = kendalltau([recs[m["name"]]["values"][meas][rho] for m in kept], gap).statistic
            t = res["tau"][rho][meas]["tau"]
            assert (np.isnan(t) and np.isnan(expect)) or t == pytest.approx(expect)
    rows = (out / "correlation-label_noise=0.csv").read_text().splitlines()
    assert len(rows) == 4 and "label_noise" in rows[0].split(",") and "model_002" not in "".join(rows)
    # the stratum's outputs sit beside the whole population's, which stay as they were
    assert json.loads((out / "correlation.json").read_text())["models"] == whole["models"] == N_MODELS
    with pytest.raises(ValueError, match="unknown hyper-parameters \\['dropout'\\]; .*label_noise"):
        pop.correlate_population(out, where={"dropout": 0.1}, plot=False)
    with pytest.raises(ValueError, match="only 1 evaluated models .* at least 3"):
        pop.correlate_population(out, where={"label_noise": 0.1}, plot=False)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        pop.parse_where(["label_noise"])
    assert main(["population", "correlate", "--out", str(out), "--where", "nope=1"]) == 2


def test_cli_help_and_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["population", "--help"])
    text = capsys.readouterr().out
    for word in ("train", "evaluate", "correlate", "torchrun"):
        assert word in text
    assert main(["population", "evaluate", "--out", str(tmp_path / "nothing")]) == 2
    assert "population train" in capsys.readouterr().err


def test_cli_train_small(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["population", "train", "--out", str(out), "--models", "2", "--epochs-max", "1",
                 "--train-size-max", "64", "--workers", "1", "--no-progress"]) == 0
    assert "2 models" in capsys.readouterr().out
    assert len(json.loads((out / "population.json").read_text())["models"]) == 2


def test_study_runs_end_to_end_and_resumes(tmp_path, capsys):
    out = tmp_path / "study"
    args = ["population", "study", "--out", str(out), "--models", "3", "--epochs-max", "1", "--train-size-max",
            "64", "--workers", "1", "--rho", "0.02", "--batches", "2", "--batch-size", "16", "--iters", "2",
            "--bootstrap", "50", "--no-progress"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    res = json.loads((out / "correlation.json").read_text())
    assert res["models"] == 3 and set(res["tau"]["0.02"]) == set(pop.MEASURES)
    for meas, t in res["tau"]["0.02"].items():  # the printed table is the stored one
        if np.isfinite(t["tau"]):
            assert f"{t['tau']:+.2f} [{t['ci'][0]:+.2f}, {t['ci'][1]:+.2f}]" in printed
    assert str(out / "correlation.png") in printed
    stamps = {p: p.stat().st_mtime_ns for p in (out / "models").rglob("model.safetensors")}
    results = (out / "results.jsonl").read_text()
    assert main(args) == 0  # a rerun trains and evaluates nothing again
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert (out / "results.jsonl").read_text() == results


def test_tagged_ablation_evaluation_is_separate(reference, tmp_path):
    """Ablations go to their own files (--tag) and equal direct geodesic_sharpness calls with the flags."""
    from geosharp_ref.commands import load_model
    from geosharp_ref.sharpness import geodesic_sharpness

    out = _copy(reference, tmp_path, results=True)
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
