"""Training a population (geosharp_ref.studies.population.training): hyper-parameters drawn
deterministically, the directory layout, resuming only missing models, worker processes."""
import json
import shutil
import types

import pytest
import torch

from geosharp_ref.studies import population as pop
from geosharp_ref.studies.population import training
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


class _Linear(torch.nn.Module):
    """A stand-in classifier with the Hugging Face call convention: ``model(x=…).logits``."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(5, 3)

    def forward(self, x):
        return types.SimpleNamespace(logits=self.lin(x))


@pytest.mark.parametrize("n, bs", [(10, 4), (8, 8), (3, 256)])
def test_error_and_loss_in_batches_equal_one_pass(n, bs):
    torch.manual_seed(n)
    model, x, y = _Linear(), torch.randn(n, 5), torch.randint(0, 3, (n,))
    with torch.no_grad():  # the one-pass reference
        logits = model.lin(x)
    error, loss = training.error_and_loss(model, dict(x=x), y, bs=bs)
    assert error == int((logits.argmax(-1) != y).sum()) / n
    assert loss == pytest.approx(float(torch.nn.functional.cross_entropy(logits, y)), rel=1e-6)
    batches = list(training.batched_logits(model, dict(x=x), n, bs))
    assert [s.start for s, _ in batches] == list(range(0, n, bs))
    assert torch.allclose(torch.cat([lg for _, lg in batches]), logits, atol=1e-6)
    assert not any(lg.requires_grad for _, lg in batches)


def test_batched_logits_leave_gradients_on_when_stopped_early():
    gen = training.batched_logits(_Linear(), dict(x=torch.randn(10, 5)), 10, 4)
    next(gen)
    assert torch.is_grad_enabled()
