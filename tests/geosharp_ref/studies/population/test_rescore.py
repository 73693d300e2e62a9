"""Re-scoring a population on the pool documents no model trained on (issue 29, item 2), on a tiny checkpoint:
the extended test set, the check against a reference manifest, the predictions' consistency with the recorded
test error, and τ against the new gap."""
import json

import numpy as np
import pytest
import torch
import transformers

from geosharp_ref.stats import kendall_with_ci
from geosharp_ref.studies.population.manifest import read_manifest
from geosharp_ref.studies.population.minilm import MiniLMRecipesTask, checkpoint_dir
from geosharp_ref.studies.population.rescore import RESCORE, extended_test_set, rescore_population
from geosharp_ref.studies.population.task import Split
from geosharp_ref.studies.population.training import train_population


@pytest.fixture(scope="module")
def population(tmp_path_factory, monkeypatch_module):
    ckpt = tmp_path_factory.mktemp("tiny-ckpt")
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.BertModel(cfg).save_pretrained(ckpt)
    transformers.AutoTokenizer.from_pretrained(str(checkpoint_dir()), local_files_only=True).save_pretrained(ckpt)
    task = MiniLMRecipesTask(ckpt)
    import geosharp_ref.studies.population.training as training
    from geosharp_ref.studies.population import rescore, tasks

    get = tasks.get_task
    for mod in (training, rescore):
        monkeypatch_module.setattr(mod, "get_task", lambda name: task if name == task.name else get(name))
    out = tmp_path_factory.mktemp("pop")
    train_population(out, n_models=3, workers=1, train_size_max=16, epochs_max=2, progress=False, task=task)
    return out


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_extended_test_set_appends_the_unused_pool():
    split = Split(pool={"x": torch.arange(10)}, y_pool=torch.arange(10) % 3, test={"x": torch.arange(100, 104)},
                  y_test=torch.tensor([0, 1, 2, 0]))
    inputs, y, n = extended_test_set(split, 6)
    assert n == 4 and inputs["x"].tolist() == [100, 101, 102, 103, 6, 7, 8, 9]
    assert y.tolist() == [0, 1, 2, 0, 0, 1, 2, 0]
    with pytest.raises(ValueError):
        extended_test_set(split, 11)


def test_rescore_on_a_tiny_population(population, tmp_path):
    out = population
    man = read_manifest(out)
    # fake sharpness results of the same models
    rdir = tmp_path / "results"
    rdir.mkdir()
    (rdir / "evaluation.json").write_text(json.dumps(dict(measures=["adaptive", "geodesic-inv"], rhos=["0.1"])))
    vals = {"model_000": (3.0, 1.0), "model_001": (1.0, 2.0), "model_002": (2.0, 3.0)}
    (rdir / "results.jsonl").write_text("".join(json.dumps(dict(model=k, values={"adaptive": {"0.1": a},
                                                                                  "geodesic-inv": {"0.1": b}})) + "\n"
                                                for k, (a, b) in vals.items()))
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps(man))
    res = rescore_population(out, reference=ref, results=rdir, splits=20, n_boot=50, progress=False)
    assert res["n_train"] == 16 and res["n_test_original"] == 600 and res["n_test_extended"] == 600 + 1527 - 16
    for m in man["models"]:
        got = res["per_model"][m["name"]]
        assert got["test_error_original"] == pytest.approx(m["metrics"]["test_error"], abs=1.5 / 600)
        assert got["gap"] == pytest.approx(got["test_error"] - m["metrics"]["train_error"])
    gap = [res["per_model"][n]["gap"] for n in vals]
    assert res["tau"]["0.1"]["adaptive"]["tau"] == pytest.approx(
        kendall_with_ci([v[0] for v in vals.values()], gap, n_boot=50)["tau"], nan_ok=True)
    assert "geodesic-inv - adaptive" in res["signed_contrast"]["0.1"]
    assert json.loads((out / RESCORE).read_text())["models"] == 3
    # resumes from the stored predictions; a different reference is refused
    assert rescore_population(out, splits=20, n_boot=50, progress=False)["per_model"] == res["per_model"]
    man["models"][1]["metrics"]["test_error"] += 0.01
    ref.write_text(json.dumps(man))
    with pytest.raises(ValueError, match="not the committed model"):
        rescore_population(out, reference=ref, progress=False)
