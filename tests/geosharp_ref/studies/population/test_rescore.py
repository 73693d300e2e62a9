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
from geosharp_ref.studies.population.reanalysis import partial_tau
from geosharp_ref.studies.population.minilm import MiniLMRecipesTask, checkpoint_dir
from geosharp_ref.studies.population.rescore import RESCORE, extended_test_set, rescore_population
from geosharp_ref.studies.population.task import Split
from geosharp_ref.studies.population.training import train_population
from tests.cases import ROOT


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
    train = [m["metrics"]["train_error"] for m in man["models"]]
    partial = res["partial_contrast"]["0.1"]["geodesic-inv - adaptive"]["difference"]  # NaN where a τ is undefined
    expected = partial_tau([v[1] for v in vals.values()], gap, train) - partial_tau([v[0] for v in vals.values()], gap, train)
    assert partial == pytest.approx(expected, nan_ok=True)
    assert json.loads((out / RESCORE).read_text())["models"] == 3
    # resumes from the stored predictions; a different reference is refused
    assert rescore_population(out, splits=20, n_boot=50, progress=False)["per_model"] == res["per_model"]
    _stale_predictions_are_predicted_again(out, res["per_model"])
    assert res["reference_agreement"]["max_relative_loss_difference"] == {"train_loss": 0.0, "test_loss": 0.0}
    # losses retrained with another summation order (≤ LOSS_RTOL) are the same models; other errors or losses are not
    for k, change, refused in (("train_loss", 1 + 1e-7, False), ("test_error", None, True),
                               ("test_loss", 1 + 1e-3, True)):
        changed = json.loads(json.dumps(man))
        m = changed["models"][1]["metrics"]
        m[k] = m[k] + 1 / 600 if change is None else m[k] * change
        ref.write_text(json.dumps(changed))
        if refused:
            with pytest.raises(ValueError, match="not the committed model"):
                rescore_population(out, reference=ref, progress=False)
        else:
            agreement = rescore_population(out, reference=ref, progress=False, splits=20, n_boot=50)["reference_agreement"]
            assert agreement["max_relative_loss_difference"]["train_loss"] == pytest.approx(1e-7, rel=1e-3)


def _stale_predictions_are_predicted_again(out, per_model):
    """Each stored line carries the digest of the weights that predicted; a line of other weights (all its
    predictions 0 here) is predicted again, one line appended, and an unstamped line (written before the stamp) is
    read as before."""
    from geosharp_ref.studies.population.pack import STAMP, weights_digest
    from geosharp_ref.studies.population.rescore import EXTENDED_PREDICTIONS

    path = out / EXTENDED_PREDICTIONS
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    digests = {m["name"]: weights_digest(out, m) for m in read_manifest(out)["models"]}
    assert len(lines) == 3 and all(r[STAMP] == digests[r["model"]] for r in lines)
    stale = dict(lines[1], predictions=[0] * len(lines[1]["predictions"]), **{STAMP: "0" * 64})
    path.write_text("".join(json.dumps(r) + "\n" for r in (lines[0], stale, lines[2])))
    assert rescore_population(out, splits=20, n_boot=50, progress=False)["per_model"] == per_model
    assert [json.loads(line)["model"] for line in path.read_text().splitlines()][-1] == lines[1]["model"]
    unstamped = [{k: v for k, v in r.items() if k != STAMP} for r in lines]
    path.write_text("".join(json.dumps(r) + "\n" for r in unstamped))
    assert rescore_population(out, splits=20, n_boot=50, progress=False)["per_model"] == per_model
    assert len(path.read_text().splitlines()) == 3


COMMITTED = sorted(p.parent for p in (ROOT / "docs" / "minilm").glob("*/rescore.json"))


@pytest.mark.parametrize("pop", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_rescore_recomputed_from_its_predictions(pop, tmp_path):
    """A committed MiniLM re-scoring (docs/minilm/<population>/rescore.json) follows from its committed files:
    the extended test set's labels (rebuilt from the task's split), the committed predictions, the committed
    manifest's train errors and the committed sharpness results give its test errors, gaps, split-half
    reliability and every τ."""
    from geosharp_ref.studies.population.evaluation import evaluation_grid, read_results
    from geosharp_ref.studies.population.reliability import split_half_reliability
    from geosharp_ref.studies.population.tasks import get_task
    man, res = read_manifest(pop), json.loads((pop / RESCORE).read_text())
    split = get_task(man["plan"]["task"]).load_split(man["plan"]["data"], tmp_path)
    _, y, n_orig = extended_test_set(split, res["n_train"])
    assert (len(y), n_orig) == (res["n_test_extended"], res["n_test_original"]) == (1743, 600)
    preds = {r["model"]: r["predictions"] for r in map(json.loads, (pop / "test_predictions_extended.jsonl").open())}
    names = [m["name"] for m in man["models"]]
    wrong = np.array([np.asarray(preds[n]) != y.numpy() for n in names])
    train_error = np.array([m["metrics"]["train_error"] for m in man["models"]])
    for i, (n, m) in enumerate(zip(names, man["models"])):
        got = res["per_model"][n]
        assert got["test_error"] == pytest.approx(wrong[i].mean(), abs=1e-12)
        assert got["gap"] == pytest.approx(wrong[i].mean() - train_error[i], abs=1e-12)
        assert wrong[i, :n_orig].mean() == pytest.approx(m["metrics"]["test_error"], abs=1.5 / n_orig)
    assert split_half_reliability(wrong, train_error, 200, 0)[2] == pytest.approx(
        res["reliability"]["pearson_full_spearman_brown"], rel=1e-12)
    cfg = json.loads((pop / "evaluation.json").read_text())
    recs, (rows, grid) = read_results(pop), evaluation_grid(cfg)
    gap = wrong.mean(1) - train_error
    for i, row in enumerate(rows):
        for measure, cell in res["tau"][row].items():
            values = [recs[n]["values"][measure][grid[measure][i]] for n in names]
            assert cell["tau"] == pytest.approx(kendall_with_ci(values, gap, n_boot=10)["tau"], abs=1e-12)
        for pair, cell in res["partial_contrast"][row].items():  # τ(geo, gap | train) − τ(ada, gap | train)
            geo, ada = ([recs[n]["values"][m][grid[m][i]] for n in names] for m in pair.split(" - "))
            assert cell["difference"] == pytest.approx(partial_tau(geo, gap, train_error) - partial_tau(ada, gap, train_error),
                                                       abs=1e-12)
