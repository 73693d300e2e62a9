"""Data files and batches for sharpness evaluation.

Data file format (``--data``)::

    torch.save({"inputs": tensor_or_dict_of_tensors, "targets": tensor}, "data.pt")

Every tensor has the examples on its leading dimension. ``inputs`` is passed to the model as the first
positional argument (a tensor) or as keyword arguments (a dict, e.g. ``{"input_ids": ...,
"attention_mask": ...}`` or ``{"pixel_values": ...}``; non-tensor values are passed unchanged to every
batch). ``targets`` are integer class indices for the model's logits: shape (examples,) for a
classifier, (examples, L) for per-token logits. The loss is the mean cross-entropy.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from ..forward import call_model, model_logits

__all__ = ["load_data", "slice_examples", "split_batches", "random_batch", "slice_inputs", "check_inputs_fit",
           "library_reason"]


def library_reason(exc, limit: int = 200) -> str:
    """``TypeName: the first line`` of a library's exception (torch's and transformers' messages run over many
    lines of advice that is not ours to give), cut at ``limit`` characters."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # no terminal colour codes (torch bolds its advice)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0].rstrip(":").rstrip() if lines else ""
    if len(first) > limit:
        first = first[: limit - 1].rstrip() + "…"
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def load_data(path):
    """``(inputs, targets, n_examples)`` from a file written by ``torch.save({"inputs", "targets"})``."""
    p = Path(path)
    fmt = 'torch.save({"inputs": tensor or dict of tensors, "targets": tensor}, FILE)'
    if not p.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist (expected a file written with {fmt})")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"could not read data file {str(p)!r} ({library_reason(exc)}); expected a file of tensors "
                         f"written with {fmt}") from exc
    if not (isinstance(obj, dict) and "inputs" in obj and "targets" in obj):
        keys = sorted(map(str, obj)) if isinstance(obj, dict) else []
        got = (f"{keys[:4]}" + (f" and {len(keys) - 4} more keys" if len(keys) > 4 else "")
               if isinstance(obj, dict) else type(obj).__name__)
        raise ValueError(f"data file {str(p)!r} must hold a dict with keys 'inputs' and 'targets' "
                         f"(written with {fmt}); got {got}")
    inputs, targets = obj["inputs"], obj["targets"]
    if not torch.is_tensor(targets) or targets.dim() == 0:
        raise ValueError(f"data file {str(p)!r}: 'targets' must be a tensor with the examples on dim 0")
    n = targets.shape[0]
    if isinstance(inputs, dict):
        tensors = {k: v for k, v in inputs.items() if torch.is_tensor(v)}
        if not tensors:
            raise ValueError(f"data file {str(p)!r}: 'inputs' is a dict without tensors")
    elif torch.is_tensor(inputs):
        tensors = {"inputs": inputs}
    else:
        raise ValueError(f"data file {str(p)!r}: 'inputs' must be a tensor or a dict of tensors, "
                         f"got {type(inputs).__name__}")
    for k, v in tensors.items():
        if v.dim() == 0 or v.shape[0] != n:
            raise ValueError(f"data file {str(p)!r}: inputs {k!r} has shape {tuple(v.shape)} but targets have "
                             f"{n} examples; every tensor needs the examples on its leading dimension")
    return inputs, targets, n


def _position_limit(model):
    """The longest sequence the model's absolute position embeddings take (None: no such table, e.g. rotary)."""
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, torch.nn.Embedding) and leaf in ("position_embeddings", "wpe", "embed_positions"):
            offset = 0 if module.padding_idx is None else module.padding_idx + 1  # RoBERTa counts from pad + 1
            return module.num_embeddings - offset
    return None


def check_inputs_fit(model, inputs, source: str = "the data") -> None:
    """Refuse inputs the model cannot take, before anything is computed: token ids (``input_ids``, or a tensor
    for a model whose main input is ``input_ids``) must be integers in ``[0, vocabulary size)``, sequences no
    longer than the model's absolute position embeddings, ``token_type_ids`` below ``config.type_vocab_size``;
    floating-point ``pixel_values`` must be floating point."""
    main = getattr(model, "main_input_name", None)  # a plain module (no main input name): a tensor is not named
    named = dict(inputs) if isinstance(inputs, dict) else ({main: inputs} if main else {})
    ids = named.get("input_ids")
    if torch.is_tensor(ids):
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(f"{source}: input_ids have dtype {ids.dtype}; token ids are integers (torch.long): "
                             f"build the data with `geosharp data`, or convert them with .long()")
        emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        vocab = getattr(emb, "num_embeddings", None) or getattr(getattr(model, "config", None), "vocab_size", None)
        if vocab and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            bad = int(ids.max()) if int(ids.max()) >= vocab else int(ids.min())
            raise ValueError(f"{source}: input_ids hold token id {bad}, outside the model's vocabulary [0, {vocab}); "
                             f"the data was tokenized for another model: rebuild it with `geosharp data MODEL_DIR "
                             f"…` (this model's own tokenizer)")
        limit = _position_limit(model)
        if limit is not None and ids.dim() >= 2 and ids.shape[-1] > limit:
            raise ValueError(f"{source}: sequences of {ids.shape[-1]} tokens, but the model's position embeddings "
                             f"take at most {limit}; rebuild the data with `geosharp data … --max-length {limit}` "
                             f"(or shorter)")
    types = named.get("token_type_ids")
    n_types = getattr(getattr(model, "config", None), "type_vocab_size", None)
    if torch.is_tensor(types) and n_types and types.numel() and (types.is_floating_point()
                                                                or int(types.min()) < 0 or int(types.max()) >= n_types):
        raise ValueError(f"{source}: token_type_ids must be integers in [0, {n_types}) for this model; rebuild the "
                         f"data with `geosharp data` (this model's own tokenizer)")
    pixels = named.get("pixel_values")
    if torch.is_tensor(pixels) and not pixels.is_floating_point():
        raise ValueError(f"{source}: pixel_values have dtype {pixels.dtype}; images are floating point (as the "
                         f"model's image processor gives them): build the data with `geosharp data --images`")


def slice_examples(x, a, b):
    """Examples ``a:b`` of inputs: a tensor, or a dict of tensors (other values passed unchanged)."""
    if isinstance(x, dict):
        return {k: (v[a:b] if torch.is_tensor(v) else v) for k, v in x.items()}
    return x[a:b]


def split_batches(inputs, targets, n_batches, batch_size, source="data file"):
    """The first ``n_batches · batch_size`` examples, in order, as ``n_batches`` (inputs, targets) pairs."""
    n = targets.shape[0]
    need = n_batches * batch_size
    if n < need:
        raise ValueError(f"{source} has only {n} examples; {n_batches} batches × {batch_size} = {need} needed "
                         f"(lower --batches or --batch-size)")
    return [(slice_examples(inputs, i * batch_size, (i + 1) * batch_size), targets[i * batch_size:(i + 1) * batch_size])
            for i in range(n_batches)]


def random_batch(model, batch_size=4, seq_len=8, seed=0):
    """A random (inputs, targets) batch that fits ``model``: ``input_ids`` over ``config.vocab_size``
    for text models, ``pixel_values`` of ``config.image_size``/``num_channels`` for vision models;
    targets uniform over the logits' last dimension (``config.num_labels`` for a classifier)."""
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    name = getattr(model, "main_input_name", "input_ids")
    if name == "input_ids":
        vocab = getattr(cfg, "vocab_size", None)
        if not vocab:
            raise ValueError(f"{type(model).__name__}: config has no vocab_size; pass --data")
        max_pos = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        L = seq_len if not max_pos else max(1, min(seq_len, max_pos - 2))  # RoBERTa offsets positions by 2
        inputs = {"input_ids": torch.randint(vocab, (batch_size, L), generator=gen)}
    elif name == "pixel_values":
        size = getattr(cfg, "image_size", None)
        if size is None:
            raise ValueError(f"{type(model).__name__}: config has no image_size; pass --data")
        hw = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
        c = getattr(cfg, "num_channels", 3)
        dtype = next(model.parameters()).dtype
        inputs = {"pixel_values": torch.randn((batch_size, c) + hw, generator=gen, dtype=dtype)}
    else:
        raise ValueError(f"cannot build a random batch for a model whose main input is {name!r}; pass --data")
    device = next(model.parameters()).device  # drawn on the CPU (seeded), used on the model's device
    inputs = {k: v.to(device) for k, v in inputs.items()}
    with torch.no_grad():
        logits = model_logits(call_model(model, dict(model.named_parameters()), inputs))
    num_labels = logits.shape[-1]
    targets = torch.randint(num_labels, tuple(logits.shape[:-1]), generator=gen).to(device)
    return inputs, targets


def slice_inputs(inputs: dict, index) -> dict:
    """``{k: v[index]}`` for every tensor of an inputs dict."""
    return {k: v[index] for k, v in inputs.items()}
