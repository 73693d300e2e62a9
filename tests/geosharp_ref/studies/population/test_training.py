"""Training a population (geosharp_ref.studies.population.training): hyper-parameters drawn
deterministically, the directory layout, resuming only missing models, worker processes."""
import json
import shutil

import pytest

from geosharp_ref.studies import population as pop
from tests import cases

N_MODELS = cases.POPULATION_MODELS
TRAIN = cases.POPULATION_TRAIN


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
    out = cases.copy_population(trained, tmp_path)
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
