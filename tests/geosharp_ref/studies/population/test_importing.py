"""Importing a real population from local paths (geosharp_ref.studies.population.importing): the manifest
the population evaluator reads, for model-soups CLIP checkpoints and Hugging Face directories (tests/cases's
models, saved by the conftest fixtures `soup` and `berts`), metrics from CSV columns, and clear errors."""
from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import pytest
import torch

from geosharp_ref.io.clip_soups import CLIPSoupClassifier, load_clip_soup
from geosharp_ref.studies import population
from geosharp_ref.studies.population.importing import import_population, load_imported_model
from tests import cases
from tests.cases import bert_inputs as _batch, clip_images as _images

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)
transformers.logging.set_verbosity_error()


def _write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def _image_data(path, n=8, res=32, classes=10):
    gen = torch.Generator().manual_seed(11)
    torch.save({"inputs": {"pixel_values": torch.randn(n, 3, res, res, generator=gen)},
                "targets": torch.randint(0, classes, (n,), generator=gen)}, path)
    return path


def test_import_clip_population(tmp_path, monkeypatch):
    (tmp_path / "ckpt" / "sub").mkdir(parents=True)
    files = [tmp_path / "ckpt" / "model_0.pt", tmp_path / "ckpt" / "model_1.pt",
             tmp_path / "ckpt" / "sub" / "model_2.pt"]
    for i, f in enumerate(files):
        cases.save_clip_soup(f, seed=10 + i, width=128)  # OpenAI's rule: heads = 128 // 64 = 2
    # name, file name and a path relative to the CSV; accuracies; one extra model not imported
    csv_path = _write_csv(tmp_path / "ckpt" / "metrics.csv",
                          ["model", "train_accuracy", "test_accuracy", "train_examples"],
                          [["model_0", "0.9", "0.75", "1281167"], ["model_1.pt", "0.8", "0.78", ""],
                           ["sub/model_2.pt", "0.95", "0.7", "1281167"], ["model_9", "0.5", "0.5", ""]])
    data = _image_data(tmp_path / "data.pt")
    monkeypatch.chdir(tmp_path)
    man = import_population(tmp_path / "pop", [Path("ckpt/model_0.pt"), str(files[1]), files[2]], csv_path,
                            "data.pt")
    on_disk = json.loads((tmp_path / "pop" / "population.json").read_text())
    assert on_disk == man
    assert not [p for p in (tmp_path / "pop").iterdir() if p.name != "population.json"]  # no tmp files left

    def metrics(tr_acc, te_acc, n):
        return {"gap": pytest.approx((1 - te_acc) - (1 - tr_acc), abs=1e-12),
                "train_error": pytest.approx(1 - tr_acc), "test_error": pytest.approx(1 - te_acc),
                "train_examples": n}

    assert on_disk == {
        "format": "geosharp-population/1", "complete": True,
        "plan": {"kind": "imported", "loader": "clip-soups",
                 "data": {"dataset": "file", "path": str(data.resolve())}},
        "models": [
            {"name": "model_0", "path": str(files[0].resolve()), "loader": "clip-soups", "hparams": {},
             "metrics": metrics(0.9, 0.75, 1281167)},
            {"name": "model_1", "path": str(files[1].resolve()), "loader": "clip-soups", "hparams": {},
             "metrics": metrics(0.8, 0.78, None)},
            {"name": "model_2", "path": str(files[2].resolve()), "loader": "clip-soups", "hparams": {},
             "metrics": metrics(0.95, 0.7, 1281167)},
        ]}
    assert all(Path(m["path"]).is_absolute() for m in on_disk["models"])
    images = _images(seed=2)
    for entry, f in zip(on_disk["models"], files):
        m = load_imported_model(entry)
        assert isinstance(m, CLIPSoupClassifier) and m.config.heads == 2 and not m.training
        assert torch.equal(m(images), load_clip_soup(f)(images))
    # the population evaluator reads it: its batches come from the data file, its loader dispatches here
    man2 = population.read_manifest(tmp_path / "pop")
    batches = population.sharpness_batches(man2, 2, 4)
    assert len(batches) == 2 and batches[0][0]["pixel_values"].shape == (4, 3, 32, 32)
    m = population.load_population_model(tmp_path / "pop", man2["models"][0])
    assert m(**batches[0][0]).shape == (4, 10)
    # re-importing the same population is idempotent, even with results present
    (tmp_path / "pop" / "results.jsonl").write_text("")
    assert import_population(tmp_path / "pop", [Path("ckpt/model_0.pt"), str(files[1]), files[2]], csv_path,
                             "data.pt") == man
    with pytest.raises(ValueError, match="already describes another population"):
        import_population(tmp_path / "pop", files[:2], csv_path, "data.pt")


def test_import_gap_column_and_heads_override(soup, tmp_path):
    path, _ = soup  # width 64, 2 heads: not OpenAI's rule
    csv_path = _write_csv(tmp_path / "m.csv", ["model", "gap"], [[str(path), "0.125"]])
    data = _image_data(tmp_path / "d.pt")
    man = import_population(tmp_path / "pop", [path], csv_path, data, loader="clip-soups", heads=2)
    (entry,) = man["models"]
    assert entry["metrics"] == {"gap": 0.125, "train_error": None, "test_error": None, "train_examples": None}
    assert entry["heads"] == 2
    assert load_imported_model(entry).config.heads == 2


def test_import_hf_population(berts, tmp_path):
    m, root = berts
    csv_path = _write_csv(tmp_path / "m.csv", ["model", "train_error", "test_error"],
                          [["st", "0.1", "0.3"], ["bin", "0.05", "0.2"]])
    gen = torch.Generator().manual_seed(0)
    torch.save({"inputs": {"input_ids": torch.randint(3, 60, (8, 9), generator=gen)},
                "targets": torch.randint(0, 3, (8,), generator=gen)}, tmp_path / "text.pt")
    man = import_population(tmp_path / "pop", [root / "st", root / "bin"], csv_path, tmp_path / "text.pt")
    assert man["plan"]["loader"] == "hf"
    assert [(e["name"], e["loader"], e["path"]) for e in man["models"]] == [
        ("st", "hf", str((root / "st").resolve())), ("bin", "hf", str((root / "bin").resolve()))]
    assert man["models"][0]["metrics"] == {"gap": pytest.approx(0.2), "train_error": 0.1, "test_error": 0.3,
                                           "train_examples": None}
    batch = _batch(1)
    with torch.no_grad():
        ref = m(**batch).logits
        for e in man["models"]:
            assert torch.equal(load_imported_model(e)(**batch).logits, ref)


def test_import_errors(soup, berts, tmp_path):
    path, _ = soup
    _, root = berts
    data = _image_data(tmp_path / "d.pt")
    good = _write_csv(tmp_path / "good.csv", ["model", "gap"], [["model_0", "0.1"]])
    with pytest.raises(ValueError, match=r"model 'model_0' .* is not in the metrics CSV"):
        import_population(tmp_path / "p", [path], _write_csv(tmp_path / "a.csv", ["model", "gap"],
                                                             [["model_7", "0.1"]]), data)
    with pytest.raises(ValueError, match="no `model` column"):
        import_population(tmp_path / "p", [path], _write_csv(tmp_path / "b.csv", ["name", "gap"],
                                                             [["model_0", "0.1"]]), data)
    with pytest.raises(ValueError, match="needs a `gap` column"):
        import_population(tmp_path / "p", [path], _write_csv(tmp_path / "c.csv", ["model", "train_error"],
                                                             [["model_0", "0.1"]]), data)
    with pytest.raises(ValueError, match="matches 2 rows"):
        import_population(tmp_path / "p", [path], _write_csv(tmp_path / "e.csv", ["model", "gap"],
                                                             [["model_0", "0.1"], ["model_0.pt", "0.2"]]), data)
    with pytest.raises(ValueError, match=r"outside \[0, 1\].*percentages"):
        import_population(tmp_path / "p", [path], _write_csv(tmp_path / "f.csv", ["model", "train_accuracy",
                                                                                  "test_accuracy"],
                                                             [["model_0", "95", "80"]]), data)
    with pytest.raises(ValueError, match="disagrees with test_error"):
        import_population(tmp_path / "p", [path], _write_csv(tmp_path / "g.csv", ["model", "gap", "train_error",
                                                                                  "test_error"],
                                                             [["model_0", "0.5", "0.1", "0.2"]]), data)
    with pytest.raises(ValueError, match="has no gap"):
        import_population(tmp_path / "p", [path], _write_csv(tmp_path / "h.csv", ["model", "gap"],
                                                             [["model_0", ""]]), data)
    with pytest.raises(ValueError, match="different formats"):
        import_population(tmp_path / "p", [path, root / "st"], good, data)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="cannot tell the format"):
        import_population(tmp_path / "p", [tmp_path / "notes.txt"], good, data)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        import_population(tmp_path / "p", [tmp_path / "model_5.pt"], good, data)
    with pytest.raises(ValueError, match="loader 'hf' needs a directory"):
        import_population(tmp_path / "p", [path], good, data, loader="hf")
    with pytest.raises(FileNotFoundError, match="data file"):
        import_population(tmp_path / "p", [path], good, tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="more than once"):
        import_population(tmp_path / "p", [path, path], good, data)
    assert not (tmp_path / "p" / "population.json").exists()
    with pytest.raises(ValueError, match="unknown loader 'onnx'"):
        load_imported_model({"name": "x", "path": str(path), "loader": "onnx"})


def test_unique_names_for_colliding_dirs(berts, tmp_path):
    m, _ = berts
    for run in ("run_a", "run_b"):
        m.save_pretrained(tmp_path / run / "final")
    csv_path = _write_csv(tmp_path / "m.csv", ["model", "gap"], [["run_a/final", "0.1"], ["run_b/final", "0.2"]])
    gen = torch.Generator().manual_seed(0)
    torch.save({"inputs": {"input_ids": torch.randint(3, 60, (4, 5), generator=gen)},
                "targets": torch.randint(0, 3, (4,), generator=gen)}, tmp_path / "text.pt")
    man = import_population(tmp_path / "pop", [tmp_path / "run_a" / "final", tmp_path / "run_b" / "final"],
                            csv_path, tmp_path / "text.pt")
    assert [(e["name"], e["metrics"]["gap"]) for e in man["models"]] == [("run_a/final", 0.1),
                                                                         ("run_b/final", 0.2)]
