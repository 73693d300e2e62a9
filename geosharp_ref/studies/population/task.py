"""What a population study needs to know about one learning task (data, model, augmentation).

:mod:`geosharp_ref.studies.population` trains, evaluates and correlates populations generically; a task
supplies the pieces that depend on the data and the architecture. The built-in tasks
are listed in :mod:`geosharp_ref.studies.population.tasks`.

Data contract. ``load_split`` returns a :class:`Split`: model inputs as a dict of tensors whose dim 0
indexes examples (``{"pixel_values": (N, 1, 8, 8)}``, ``{"input_ids": (N, L), "attention_mask": (N, L)}``),
integer labels ``(N,)``. The *pool* is the training pool, models train on ``pool[:train_size]``
(nested subsets), sharpness is measured on ``pool[:batches · batch_size]`` (clean labels); the test set
is disjoint. Everything must be a deterministic function of ``data_spec`` (and of files ``prepare``
wrote into the population directory).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["Split", "PopulationTask"]


@dataclass
class Split:
    """A fixed train-pool / test split; inputs are dicts of tensors with examples on dim 0."""

    pool: dict
    y_pool: torch.Tensor
    test: dict
    y_test: torch.Tensor


class PopulationTask:
    """Base class; subclasses set the class attributes and implement the methods.

    Attributes
    ----------
    name : str            short name used on the command line (``--task vision``)
    kind : str            stored as ``plan.kind`` in the manifest
    arch : dict           default Hugging Face config kwargs of the model
    hparam_choices : dict hyper-parameter name -> tuple of choices; must include ``lr``,
                          ``weight_decay``, ``batch_size``, ``train_size``, ``label_noise``,
                          ``augment``, ``warmup`` (epochs are drawn separately)
    epochs_max : int      default largest number of epochs
    lr_schedule : str     ``constant`` after the warm-up (default) or ``linear`` decay to 0 at the end
    n_test : int          default test-set size
    num_labels : int
    """

    name = "base"
    kind = "base"
    arch: dict = {}
    hparam_choices: dict = {}
    epochs_max = 30
    n_test = 0
    num_labels = 0
    lr_schedule = "constant"
    #: the task's evaluation protocol for ``geosharp population study`` (any of ``rhos``, ``measures``,
    #: ``batches``, ``batch_size``, ``iters``, ``sizes``, ``calibration_models``, ``probe_rhos``; see
    #: :func:`geosharp_ref.studies.population.study.study_protocol`); empty: the study defaults
    evaluation: dict = {}

    def sample_hparams(self, index: int, seed: int = 0, epochs_max: int | None = None,
                       train_size_max: int | None = None) -> dict:
        """Hyper-parameters of model ``index`` (deterministic in ``seed``, ``index``): one draw from each
        of :attr:`hparam_choices`, epochs uniform in [epochs_max // 4, epochs_max], and the model seed."""
        epochs_max = self.epochs_max if epochs_max is None else epochs_max
        rng = random.Random(seed * 1000 + index)
        h = {k: rng.choice(v) for k, v in self.hparam_choices.items()}
        h["epochs"] = rng.randint(max(1, epochs_max // 4), epochs_max)
        if train_size_max is not None:
            h["train_size"] = min(h["train_size"], train_size_max)
        h["seed"] = rng.randrange(2 ** 31)
        return h

    def data_spec(self, split_seed: int, n_test: int | None = None) -> dict:
        """JSON-able description of the data split stored in the manifest (``plan.data``)."""
        raise NotImplementedError

    def prepare(self, root: Path, data_spec: dict) -> None:
        """Build shared artefacts once, in the parent process, before training (e.g. a tokenizer
        trained on the pool, saved under ``root``). Must be idempotent (skip when present)."""

    def load_split(self, data_spec: dict, root: Path | None = None) -> Split:
        """The split described by ``data_spec`` (``root``: the population directory)."""
        raise NotImplementedError

    def build_model(self, arch: dict):
        """A freshly initialised Hugging Face model (seeded by the caller with ``torch.manual_seed``)."""
        raise NotImplementedError

    def augment(self, inputs: dict, gen: torch.Generator) -> dict:
        """A randomly augmented copy of a training batch (default: unchanged)."""
        return inputs

    def save_extras(self, model_dir: Path, root: Path) -> None:
        """Write what a user needs beside the weights into a model directory (e.g. the tokenizer)."""
