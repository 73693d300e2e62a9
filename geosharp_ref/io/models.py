"""Load a model from a local Hugging Face-format directory (``save_pretrained`` output), never a hub name.

The loader follows ``config.architectures``: ``…ForSequenceClassification`` →
``AutoModelForSequenceClassification``, ``…ForImageClassification`` → ``AutoModelForImageClassification``,
another class the config names (e.g. ``GPT2LMHeadModel``) → that class, else ``AutoModel``; attention
is loaded eager, ``local_files_only=True``. ``transformers`` is imported lazily.

A peft adapter directory (``adapter_config.json`` and the adapter weights, as ``PeftModel.save_pretrained``
writes them) is loaded onto its base model, which ``base_model_name_or_path`` must name as a local
directory (absolute, or relative to the adapter directory): ``PeftModel.from_pretrained(base, dir)``, adapters
kept unmerged so that their own symmetries (LoRA's GL(r)) can be quotiented.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

__all__ = ["load_model", "refuse_incomplete_weights", "has_logits_head", "require_logits_head", "load_hf_classifier", "load_adapter", "check_model_dir", "loader_for", "quiet_transformers", "HF_WEIGHTS"]


@contextlib.contextmanager
def quiet_transformers():
    """No weight-loading progress bars while loading (restored afterwards)."""
    from transformers.utils import logging as hf_logging

    enabled = getattr(hf_logging, "is_progress_bar_enabled", lambda: False)()
    if enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def loader_for(config):
    """The transformers class to load with, from ``config.architectures``."""
    import transformers

    archs = list(getattr(config, "architectures", None) or [])
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return transformers.AutoModelForSequenceClassification
    if any("ForImageClassification" in a for a in archs):
        return transformers.AutoModelForImageClassification
    for a in archs:  # another head the config names (e.g. GPT2LMHeadModel): load exactly that class
        cls = getattr(transformers, a, None)
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
            return cls
    if not archs:
        seq = transformers.AutoModelForSequenceClassification
        if type(config) in getattr(seq, "_model_mapping", {}):
            return seq
    return transformers.AutoModel


def check_model_dir(model_dir) -> Path:
    path = Path(model_dir)
    hint = ("MODEL_DIR must be a local Hugging Face-format directory (config.json and weights, as "
            "written by save_pretrained, or a peft adapter directory); hub names are never downloaded")
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {str(model_dir)!r} does not exist; {hint}")
    if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
        raise FileNotFoundError(f"model directory {str(path)!r} has no config.json; {hint}")
    return path


def load_model(model_dir, num_labels: int | None = None, seed: int = 0):
    """Load a model from a local Hugging Face-format directory (eager attention, no downloads).

    ``num_labels=K`` loads the architecture with a fresh K-class classification head instead
    (``…ForSequenceClassification``, or ``…ForImageClassification`` for a config with ``image_size``),
    initialised under ``torch.manual_seed(seed)``: for a checkpoint without a head, before
    :func:`geosharp_ref.probe.fit_linear_probe`."""
    path = check_model_dir(model_dir)
    if not (path / "config.json").is_file():
        return load_adapter(path, num_labels, seed)
    if not any((path / f).is_file() for f in HF_WEIGHTS):
        others = sorted(p.name for p in path.iterdir() if p.suffix in (".h5", ".msgpack", ".ckpt", ".index"))
        hint = (f" (found {others}: convert TensorFlow/Flax weights to PyTorch first, e.g. load them with "
                f"from_tf=True / from_flax=True where those frameworks are installed and save_pretrained)"
                if others else "")
        raise FileNotFoundError(f"{str(path)!r} has config.json but no PyTorch weights (one of "
                                f"{list(HF_WEIGHTS)}){hint}")
    import transformers

    if num_labels is not None and (isinstance(num_labels, bool) or int(num_labels) != num_labels
                                   or num_labels < 2):
        raise ValueError(f"--num-labels must be an integer of at least 2, got {num_labels!r}")
    try:
        with quiet_transformers():
            config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
            if num_labels is None:
                cls = loader_for(config)
                model, info = cls.from_pretrained(path, attn_implementation="eager", local_files_only=True,
                                                  output_loading_info=True)
            else:
                cls = (transformers.AutoModelForImageClassification if getattr(config, "image_size", None)
                       else transformers.AutoModelForSequenceClassification)
                verbosity = transformers.logging.get_verbosity()
                transformers.logging.set_verbosity_error()  # the new head's "newly initialised" notice
                try:
                    torch.manual_seed(seed)
                    model = cls.from_pretrained(path, num_labels=int(num_labels), ignore_mismatched_sizes=True,
                                                attn_implementation="eager", local_files_only=True)
                finally:
                    transformers.logging.set_verbosity(verbosity)
    except Exception as exc:  # unreadable or corrupt weights, unknown model type, no head class: one clear line
        if "ignore_mismatched_sizes" in str(exc):
            raise ValueError(f"{str(path)!r}: the checkpoint's weights do not match the shapes config.json "
                             f"describes (mismatched sizes); check config.json (num_labels, sizes) against the "
                             f"weights, or the conversion that wrote them") from exc
        what = f"with a {num_labels}-class head " if num_labels is not None else ""
        raise ValueError(f"could not load a model {what}from {str(path)!r}: {type(exc).__name__}: {exc}") from exc
    if num_labels is None:
        refuse_incomplete_weights(path, type(model), info)
    return model.eval()


def load_adapter(path, num_labels=None, seed: int = 0):
    """A peft adapter directory on its local base model (see the module doc)."""
    try:
        cfg = json.loads((path / "adapter_config.json").read_text())
    except ValueError as exc:
        raise ValueError(f"{str(path)!r}: adapter_config.json is not valid JSON ({exc})") from None
    base = cfg.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{str(path)!r}: adapter_config.json names no base_model_name_or_path; set it to the local "
                         f"directory of the base model")
    base_dir = Path(base) if Path(base).is_absolute() else path / base
    if not (base_dir / "config.json").is_file():
        raise FileNotFoundError(f"{str(path)!r} is a peft adapter whose base model {base!r} is not a local model "
                                f"directory (looked in {str(base_dir)!r}); hub names are never downloaded: set "
                                f"base_model_name_or_path in adapter_config.json to the base model's directory")
    model = load_model(base_dir, num_labels=num_labels, seed=seed)
    import peft

    try:
        adapted = peft.PeftModel.from_pretrained(model, path, is_trainable=False)
    except Exception as exc:
        raise ValueError(f"could not load the peft adapter {str(path)!r} onto {str(base_dir)!r}: "
                         f"{type(exc).__name__}: {exc}") from exc
    return adapted.eval()


def refuse_incomplete_weights(path, cls, info) -> None:
    """Refuse a checkpoint whose weights leave parameters of ``cls`` uninitialised or mis-shaped
    (transformers would initialise them at random and only warn)."""
    missing = sorted(info.get("missing_keys") or [])
    mismatched = list(info.get("mismatched_keys") or [])
    if missing or mismatched:
        raise ValueError(
            f"{str(path)!r}: the checkpoint does not cover {cls.__name__}"
            + (f"; missing {len(missing)} weights {missing[:6]}" if missing else "")
            + (f"; mismatched shapes {mismatched[:3]}" if mismatched else "")
            + " (transformers would initialise them at random). Check the conversion: parameter names "
              "must carry the model's prefixes (e.g. 'bert.' and 'classifier.') and config.json must have "
              "the right num_labels / architectures")


def has_logits_head(model) -> bool:
    """Whether the model's output has logits: a task head (``…For…``, ``…LMHeadModel``), not a bare
    backbone (``BertModel``, ``ViTModel``, …) that returns hidden states."""
    if hasattr(model, "get_base_model") and type(model).__name__.startswith("Peft"):
        model = model.get_base_model()
    name = type(model).__name__
    return not (name.endswith("Model") and "For" not in name and "LMHead" not in name)


def require_logits_head(model, model_dir) -> None:
    """Refuse a backbone without a task head in one line that names the options."""
    if not has_logits_head(model):
        raise ValueError(f"{type(model).__name__} in {str(model_dir)!r} has no classification head: its output "
                         f"is hidden states, not logits, so there is no loss to measure sharpness on. Pass "
                         f"--num-labels K to attach a seeded K-class head and fit it as a linear probe on the "
                         f"data (backbone frozen), or use a checkpoint with a task head "
                         f"(…ForSequenceClassification, …ForImageClassification, …LMHeadModel)")


HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
               "pytorch_model.bin.index.json")


def load_hf_classifier(model_dir):
    """Load a local Hugging Face checkpoint directory (``model.safetensors`` or legacy
    ``pytorch_model.bin``, sharded or not) with :func:`load_model`'s class
    choice (sequence classification for BERT MNLI fine-tunes: the label count comes from config.json),
    refusing one whose weights leave model parameters uninitialised."""
    return load_model(model_dir)
