"""The fine-tune populations of a pretrained checkpoint (``minilm-seeds``, ``minilm-recipes``), end to end on a
tiny checkpoint of the same format as the packaged all-MiniLM-L6-v2 (a ``BertModel`` directory with the
checkpoint's own tokenizer): train → calibrate → evaluate → correlate, and every piece against an
independent computation."""
import csv
import io
import json
import math

import numpy as np
import pytest
import torch
import transformers
from scipy.stats import kendalltau

from geosharp_ref.io.models import load_model
from geosharp_ref.sharpness import MEASURES, linearised_sharpness, relative_perturbation
from geosharp_ref.stats import kendall_with_ci, paired_abs_tau_difference
from geosharp_ref.studies.population.calibration import calibrated_grid, read_calibration
from geosharp_ref.studies.population.correlation import correlate_population
from geosharp_ref.studies.population.evaluation import evaluate_population, read_results, sharpness_batches
from geosharp_ref.studies.population.manifest import read_manifest
from geosharp_ref.studies.population.minilm import (RECIPE_SPACE, SEEDS_RECIPE, MiniLMRecipesTask, MiniLMSeedsTask,
                                                    checkpoint_dir)
from geosharp_ref.studies.population.study import run_study
from geosharp_ref.studies.population.tasks import get_task
from geosharp_ref.symmetry import symmetry_map
from tests import cases
from tests.cases import save_bert_backbone

PROTOCOL = dict(n_batches=2, batch_size=8, n_iter=3, sizes=(1e-4, 1e-3),
                measures=("adaptive", "geodesic-mix", "adaptive-linearised", "geodesic-mix-linearised"))


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A 2-layer BERT encoder (no head), saved with the packaged checkpoint's tokenizer."""
    return save_bert_backbone(tmp_path_factory.mktemp("tiny-minilm"), vocab_size=30522, max_position_embeddings=64,
                              tokenizer_from=checkpoint_dir())


@pytest.fixture(scope="module")
def recipes(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("recipes")
    result = run_study(out, task=MiniLMRecipesTask(tiny_checkpoint), n_models=4, workers=1, n_boot=200,
                       progress=False, **PROTOCOL)
    return out, result


def test_packaged_checkpoint_is_minilm():
    cfg = json.loads((checkpoint_dir() / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["hidden_size"]) == (6, 12, 384)
    assert cfg["architectures"] == ["BertModel"]


def test_tasks_are_registered():
    assert isinstance(get_task("minilm-seeds"), MiniLMSeedsTask)
    assert isinstance(get_task("minilm-recipes"), MiniLMRecipesTask)


def test_seeds_population_differs_only_in_seed():
    task = MiniLMSeedsTask()
    draws = [task.sample_hparams(i) for i in range(24)]
    for h in draws:
        assert {k: v for k, v in h.items() if k != "seed"} == SEEDS_RECIPE
    assert len({h["seed"] for h in draws}) == 24


def test_building_a_model_prints_no_loading_bar(tiny_checkpoint, capsys):
    """Each model starts from the checkpoint with a fresh seeded head, and a population's log gets no
    transformers "Loading weights" bar per model (the bar's setting is restored afterwards)."""
    transformers.utils.logging.enable_progress_bar()
    task = MiniLMRecipesTask(tiny_checkpoint)
    torch.manual_seed(0)
    a = task.build_model(task.arch)
    torch.manual_seed(0)
    b = task.build_model(task.arch)
    assert "Loading weights" not in capsys.readouterr().err
    assert transformers.utils.logging.is_progress_bar_enabled()
    assert torch.equal(a.classifier.weight, b.classifier.weight) and a.config.num_labels == 5
    base = transformers.BertModel.from_pretrained(str(tiny_checkpoint), local_files_only=True)
    assert "Loading weights" in capsys.readouterr().err  # the bar this test would have seen
    assert torch.equal(a.bert.embeddings.word_embeddings.weight, base.embeddings.word_embeddings.weight)


def test_recipes_are_drawn_from_the_declared_space():
    task = MiniLMRecipesTask()
    draws = cases.recipes_in_space(task, 40, RECIPE_SPACE, task.train_size)
    # the draws do vary (log-uniform lr spreads over the decade)
    lrs = np.log10([h["lr"] for h in draws])
    assert lrs.max() - lrs.min() > 0.7


def test_models_reload_with_their_tokenizer(recipes, tiny_checkpoint):
    out, _ = recipes
    man = read_manifest(out)
    assert man["plan"]["data"]["checkpoint"] == str(tiny_checkpoint.resolve())
    assert len(man["plan"]["data"]["checkpoint_sha256"]) == 64
    model = load_model(out / "models" / "model_000")
    tok = transformers.AutoTokenizer.from_pretrained(str(out / "models" / "model_000"), local_files_only=True)
    assert type(model).__name__ == "BertForSequenceClassification" and model.config.num_labels == 5
    enc = tok(["Ink helps drive democracy in Asia"], return_tensors="pt")
    assert model(**enc).logits.shape == (1, 5)
    # the encoder started from the checkpoint: its weights moved by training, but not far from it
    base = transformers.BertModel.from_pretrained(str(tiny_checkpoint), local_files_only=True)
    w0 = base.embeddings.word_embeddings.weight
    w = model.bert.embeddings.word_embeddings.weight
    assert 0 < float((w - w0).norm() / w0.norm()) < 0.5


def test_calibration_matches_sizes(recipes):
    out, _ = recipes
    cal = read_calibration(out)
    assert set(cal["grid"]) == {"adaptive", "geodesic-mix"}
    for m, fit in cal["fit"].items():
        s1, s2 = fit["median_sizes"]
        r1, r2 = cal["settings"]["probe_rhos"]
        assert fit["slope"] == pytest.approx(math.log(s2 / s1) / math.log(r2 / r1))
        for rho, size in zip(cal["grid"][m], cal["settings"]["sizes"]):  # the fitted line passes through
            assert math.log(size / s1) == pytest.approx(fit["slope"] * math.log(rho / r1), rel=1e-3, abs=1e-3)


def test_evaluation_records_every_measure_on_its_grid(recipes):
    out, _ = recipes
    cfg = json.loads((out / "evaluation.json").read_text())
    cal = read_calibration(out)
    assert cfg["sizes"] == list(PROTOCOL["sizes"])
    assert cfg["rho_grid"]["adaptive-linearised"] == cfg["rho_grid"]["adaptive"] == \
        [f"{r:g}" for r in cal["grid"]["adaptive"]]
    recs = read_results(out)
    assert sorted(recs) == [f"model_{i:03d}" for i in range(4)]
    for rec in recs.values():
        for m in PROTOCOL["measures"]:
            assert set(rec["values"][m]) == set(cfg["rho_grid"][m])
        assert set(rec["relative_size"]) == {"adaptive", "geodesic-mix"}


def test_linearised_value_is_rho_times_the_gradient_dual_norm(recipes):
    """Adaptive first-order sharpness against autograd: ρ‖|θ| ⊙ ∇L‖₂ (no geometry code involved)."""
    out, _ = recipes
    man = read_manifest(out)
    model = load_model(out / "models" / "model_001")
    (batch,) = sharpness_batches(man, 1, 8, out)
    rho = 0.05
    got = linearised_sharpness(model, [batch], rho).mean
    loss = torch.nn.functional.cross_entropy(model(**batch[0]).logits, batch[1])
    grads = torch.autograd.grad(loss, list(model.parameters()))
    ref = rho * math.sqrt(sum(float((p.detach().abs() * g).square().sum()) for p, g in zip(model.parameters(), grads)))
    assert got == pytest.approx(ref, rel=1e-4)


def test_relative_perturbation_against_a_direct_norm():
    g = torch.Generator().manual_seed(0)
    params = {"a": torch.randn(3, 4, generator=g), "b": torch.randn(5, generator=g), "i": torch.arange(3)}
    delta = {"a": torch.randn(3, 4, generator=g), "b": torch.zeros(5), "i": torch.zeros(3, dtype=torch.long)}
    moved = {k: params[k] + delta[k] for k in params}
    got = relative_perturbation(params, moved, pair_params={"a"})
    whole = math.sqrt(float(params["a"].square().sum() + params["b"].square().sum()))
    assert got["overall"] == pytest.approx(float(delta["a"].norm()) / whole)
    assert got["gl_pairs"] == pytest.approx(float(delta["a"].norm() / params["a"].norm()))
    assert got["rest"] == 0.0


def test_relative_size_of_an_adaptive_maximiser_is_inside_its_ball(recipes):
    """ξ = |θ| ⊙ δ with ‖δ‖ = ρ on the sphere: ‖Δθ‖ ≤ ρ · max|θ|, and the maximiser does move the weights."""
    out, _ = recipes
    man = read_manifest(out)
    model = load_model(out / "models" / "model_002")
    (batch,) = sharpness_batches(man, 1, 8, out)
    rho = 0.05
    res = MEASURES["adaptive"].evaluate(model, [batch], rho, n_iter=3)
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert res.per_batch[0] > 0 and res.perturbation_norms[0] == pytest.approx(rho, rel=1e-4)
    assert 0 < res.relative_size[0] <= rho * float(theta.abs().max()) / float(theta.norm()) * (1 + 1e-5)
    assert res.relative_size_groups[0] == {"rest": pytest.approx(res.relative_size[0])}


def test_correlation_reports_tau_paired_differences_and_sizes(recipes):
    out, result = recipes
    recs = read_results(out)
    man = read_manifest(out)
    names = [m["name"] for m in man["models"]]
    gap = [m["metrics"]["gap"] for m in man["models"]]
    cfg = json.loads((out / "evaluation.json").read_text())
    for i, row in enumerate(["size=0.0001", "size=0.001"]):
        for m in PROTOCOL["measures"]:
            x = [recs[n]["values"][m][cfg["rho_grid"][m][i]] for n in names]
            assert result["tau"][row][m]["tau"] == pytest.approx(kendall_with_ci(x, gap, n_boot=200)["tau"],
                                                                  nan_ok=True)
        xa = [recs[n]["values"]["adaptive"][cfg["rho_grid"]["adaptive"][i]] for n in names]
        xm = [recs[n]["values"]["geodesic-mix"][cfg["rho_grid"]["geodesic-mix"][i]] for n in names]
        want = paired_abs_tau_difference(xm, xa, gap, n_boot=200)
        got = result["paired_abs_tau_difference"][row]["geodesic-mix"]
        assert got["vs"] == "adaptive"
        assert got["difference"] == pytest.approx(want["difference"], nan_ok=True)
        assert result["paired_abs_tau_difference"][row]["geodesic-mix-linearised"]["vs"] == "adaptive-linearised"
        assert "adaptive" not in result["paired_abs_tau_difference"][row]
        sizes = [recs[n]["relative_size"]["adaptive"][cfg["rho_grid"]["adaptive"][i]] for n in names]
        assert result["median_relative_size"][row]["adaptive"] == pytest.approx(float(np.median(sizes)))
    assert (out / "correlation_paired.csv").is_file() and (out / "correlation_rho.png").is_file()


def test_study_resumes_without_recomputing(recipes, tiny_checkpoint, capsys):
    out, first = recipes
    before = (out / "results.jsonl").read_bytes()
    again = run_study(out, task=MiniLMRecipesTask(tiny_checkpoint), n_models=4, workers=1, n_boot=200,
                      progress=False, **PROTOCOL)
    printed = capsys.readouterr().out
    assert "all 4 minilm-recipes models were trained already" in printed
    assert "all 4 models were evaluated already" in printed
    assert (out / "results.jsonl").read_bytes() == before
    assert json.dumps(again["tau"], sort_keys=True) == json.dumps(first["tau"], sort_keys=True)


def test_paired_difference_against_a_direct_bootstrap():
    rng = np.random.default_rng(3)
    y = rng.normal(size=30)
    x1 = y + rng.normal(size=30)
    x2 = rng.normal(size=30)
    d = paired_abs_tau_difference(x1, x2, y, n_boot=300, seed=1)
    from scipy.stats import kendalltau

    assert d["difference"] == pytest.approx(abs(kendalltau(x1, y).statistic) - abs(kendalltau(x2, y).statistic))
    idx = np.random.default_rng(1).integers(0, 30, size=(300, 30))
    direct = [abs(kendalltau(x1[i], y[i]).statistic) - abs(kendalltau(x2[i], y[i]).statistic) for i in idx]
    lo, hi = np.quantile(direct, [0.025, 0.975])
    assert d["ci"] == pytest.approx([lo, hi], abs=1e-12)


def test_calibrated_grid_gives_derived_measures_their_base_radii_and_picks_columns(recipes):
    out, _ = recipes
    cal = read_calibration(out)
    mix = cal["grid"]["geodesic-mix"]
    grid = calibrated_grid(cal, ["geodesic-mix-frobenius", "geodesic-mix-first-order", "adaptive-linearised"])
    assert grid == {"geodesic-mix-frobenius": mix, "geodesic-mix-first-order": mix,
                    "adaptive-linearised": cal["grid"]["adaptive"]}
    assert calibrated_grid(cal, ["geodesic-mix"], sizes=[PROTOCOL["sizes"][1]]) == {"geodesic-mix": [mix[1]]}
    assert calibrated_grid(cal, ["geodesic-mix"], sizes=PROTOCOL["sizes"][::-1]) == {"geodesic-mix": mix[::-1]}
    with pytest.raises(ValueError, match="size 0.5 was not calibrated; choose from 0.0001, 0.001"):
        calibrated_grid(cal, ["geodesic-mix"], sizes=[0.5])
    with pytest.raises(ValueError, match=r"no radii for \['geodesic-inv'\]"):
        calibrated_grid(cal, ["geodesic-inv-frobenius"])


def test_ablations_run_at_the_radius_of_their_full_measure(recipes):
    """The App. G ablations at the larger size under a tag: the evaluation's grid is the full measure's larger
    radius, and a record equals the measure evaluated directly on the model at that radius."""
    out, _ = recipes
    cal = read_calibration(out)
    ablations = ("geodesic-mix-first-order", "geodesic-mix-frobenius")
    size = PROTOCOL["sizes"][1]
    evaluate_population(out, rhos=calibrated_grid(cal, ablations, sizes=[size]), sizes=[size], measures=ablations,
                        n_batches=PROTOCOL["n_batches"], batch_size=PROTOCOL["batch_size"],
                        n_iter=PROTOCOL["n_iter"], progress=False, tag="ablations")
    rho = f"{cal['grid']['geodesic-mix'][1]:g}"
    cfg = json.loads((out / "evaluation-ablations.json").read_text())
    assert cfg["sizes"] == [size] and cfg["rho_grid"] == {m: [rho] for m in ablations}
    man = read_manifest(out)
    rec = read_results(out, "ablations")["model_003"]
    model = load_model(out / "models" / "model_003")
    batches = sharpness_batches(man, PROTOCOL["n_batches"], PROTOCOL["batch_size"], out)
    for m in ablations:
        direct = MEASURES[m].evaluate(model, batches, float(rho), n_iter=PROTOCOL["n_iter"], seed=0,
                                      symmetry_map=symmetry_map(model))
        assert rec["values"][m][rho] == pytest.approx(direct.mean, rel=1e-6, abs=1e-12)
        assert rec["relative_size"][m][rho] == pytest.approx(direct.median_relative_size, rel=1e-6)


def test_ablations_are_paired_with_their_full_measure(recipes, tmp_path):
    """correlate --tag pairs each ablation with its full measure of the untagged evaluation at the same ρ
    (and leaves out a full measure evaluated at other radii), against a direct paired bootstrap."""
    out = tmp_path / "pop"
    out.mkdir()
    (out / "population.json").write_text((recipes[0] / "population.json").read_text())
    man = read_manifest(out)
    names = [m["name"] for m in man["models"]]
    gap = [m["metrics"]["gap"] for m in man["models"]]
    rng = np.random.default_rng(5)
    full = {"geodesic-mix": rng.normal(size=4), "geodesic-inv": rng.normal(size=4),
            "geodesic-mix-linearised": rng.normal(size=4)}
    abl = {m: rng.normal(size=4) for m in ("geodesic-mix-frobenius", "geodesic-inv-first-order")}

    def write(tag, cols, grid):
        files = {"": ("evaluation.json", "results.jsonl")}.get(tag, (f"evaluation-{tag}.json",
                                                                    f"results-{tag}.jsonl"))
        (out / files[0]).write_text(json.dumps(dict(measures=list(cols), rho_grid=grid, sizes=[2e-4])))
        (out / files[1]).write_text("".join(json.dumps(dict(model=n, gap=g, values={
            m: {grid[m][0]: float(cols[m][i])} for m in cols})) + "\n" for i, (n, g) in enumerate(zip(names, gap))))

    write("", full, {"geodesic-mix": ["0.05"], "geodesic-inv": ["0.03"], "geodesic-mix-linearised": ["0.05"]})
    write("ablations", abl, {"geodesic-mix-frobenius": ["0.05"], "geodesic-inv-first-order": ["0.04"]})
    result = correlate_population(out, n_boot=200, plot=False, tag="ablations", stream=io.StringIO())
    got = result["paired_abs_tau_difference"]["size=0.0002"]
    assert list(got) == ["geodesic-mix-frobenius"]  # inv's full measure was evaluated at another radius
    want = paired_abs_tau_difference(abl["geodesic-mix-frobenius"], full["geodesic-mix"], gap, n_boot=200)
    assert got["geodesic-mix-frobenius"]["vs"] == "geodesic-mix"
    assert got["geodesic-mix-frobenius"]["difference"] == pytest.approx(want["difference"])
    assert got["geodesic-mix-frobenius"]["ci"] == pytest.approx(want["ci"])
    rows = list(csv.DictReader(open(out / "correlation-ablations_paired.csv")))
    assert [(r["measure"], r["vs"]) for r in rows] == [("geodesic-mix-frobenius", "geodesic-mix")]
    # how the ablation ranks the models against its full measure, with no gap involved
    agree = result["measure_agreement"]["size=0.0002"]
    assert list(agree) == ["geodesic-mix-frobenius"] and agree["geodesic-mix-frobenius"]["vs"] == "geodesic-mix"
    assert agree["geodesic-mix-frobenius"]["tau"] == pytest.approx(
        kendalltau(abl["geodesic-mix-frobenius"], full["geodesic-mix"]).statistic)
    assert agree["geodesic-mix-frobenius"]["median_ratio"] == pytest.approx(
        np.median(abl["geodesic-mix-frobenius"] / full["geodesic-mix"]))
    # the untagged correlation does not pair anything with the ablations; its first-order measure is
    # compared with the Auto-PGD measure it linearises (adaptive was not evaluated: no geodesic pair)
    untagged = correlate_population(out, n_boot=50, plot=False, stream=io.StringIO())
    assert "paired_abs_tau_difference" not in untagged
    agree = untagged["measure_agreement"]["size=0.0002"]
    assert list(agree) == ["geodesic-mix-linearised"] and agree["geodesic-mix-linearised"]["vs"] == "geodesic-mix"
    assert agree["geodesic-mix-linearised"]["tau"] == pytest.approx(
        kendalltau(full["geodesic-mix-linearised"], full["geodesic-mix"]).statistic)


def test_cli_evaluates_one_calibrated_column(recipes, capsys):
    """``evaluate --calibration --sizes S`` (the ablation command of docs/guides/populations.md) runs the column of S only."""
    from geosharp_ref.cli import main

    out, _ = recipes
    cal = read_calibration(out)
    argv = ["population", "evaluate", "--out", str(out), "--calibration", "--sizes", str(PROTOCOL["sizes"][1]),
            "--tag", "cli-column", "--measures", "geodesic-mix-frobenius", "--batches", str(PROTOCOL["n_batches"]),
            "--batch-size", str(PROTOCOL["batch_size"]), "--iters", str(PROTOCOL["n_iter"]), "--no-progress"]
    assert main(argv) == 0
    cfg = json.loads((out / "evaluation-cli-column.json").read_text())
    assert cfg["rho_grid"] == {"geodesic-mix-frobenius": [f"{cal['grid']['geodesic-mix'][1]:g}"]}
    assert cfg["sizes"] == [PROTOCOL["sizes"][1]]
    assert sorted(read_results(out, "cli-column")) == [f"model_{i:03d}" for i in range(4)]
    assert main(argv[:5] + ["--sizes", "0.5"] + argv[7:]) == 2
    assert "size 0.5 was not calibrated" in capsys.readouterr().err
