"""What a population study needs to know about one learning task (data, model, augmentation).

:mod:`geosharp_ref.population` trains, evaluates and correlates populations generically; a task
supplies the pieces that depend on the data and the architecture. Built-in tasks:
``vision`` (:mod:`geosharp_ref.population_vision`, tiny ViTs on sklearn digits) and ``text``
(:mod:`geosharp_ref.population_text`, tiny BERTs on the BBC News corpus).

Data contract. ``load_split`` returns a :class:`Split`: model inputs as a dict of tensors whose dim 0
indexes examples (``{"pixel_values": (N, 1, 8, 8)}``, ``{"input_ids": (N, L), "attention_mask": (N, L)}``),
integer labels ``(N,)``. The *pool* is the training pool, models train on ``pool[:train_size]``
(nested subsets), sharpness is measured on ``pool[:batches · batch_size]`` (clean labels); the test set
is disjoint. Everything must be a deterministic function of ``data_spec`` (and of files ``prepare``
wrote into the population directory).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["Split", "PopulationTask", "slice_inputs", "get_task", "TASKS"]


@dataclass
class Split:
    """A fixed train-pool / test split; inputs are dicts of tensors with examples on dim 0."""

    pool: dict
    y_pool: torch.Tensor
    test: dict
    y_test: torch.Tensor


def slice_inputs(inputs: dict, index) -> dict:
    """``{k: v[index]}`` for every tensor of an inputs dict."""
    return {k: v[index] for k, v in inputs.items()}


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


def get_task(name: str) -> PopulationTask:
    """The built-in task called ``name`` (``vision`` or ``text``)."""
    if name == "vision":
        from .population_vision import VisionDigitsTask

        return VisionDigitsTask()
    if name == "text":
        from .population_text import TextBBCTask

        return TextBBCTask()
    raise ValueError(f"unknown population task {name!r}; choose one of {list(TASKS)}")


TASKS = ("vision", "text")
