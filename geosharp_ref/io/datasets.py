"""Data files from real inputs, with the model directory's own preprocessing (``geosharp data``).

* :func:`text_dataset` — rows of a ``.csv`` / ``.tsv`` / ``.jsonl`` file, tokenized with the tokenizer saved in
  the model directory (sentence pairs through ``text_pair``), truncated and padded to ``max_length``:
  ``input_ids``, ``attention_mask`` (and ``token_type_ids`` for pairs when the tokenizer gives them);
* :func:`image_dataset` — ``DIR/<class>/<image>`` folders (sorted class names are the class indices, sorted
  files inside), preprocessed by the image processor saved in the model directory: ``pixel_values``.

Both return ``(data, summary)``: ``data`` is what :func:`~geosharp_ref.io.data.load_data` reads,
``{"inputs": dict of tensors, "targets": LongTensor}``, plus ``"labels"`` (the class names, index order)
when the labels are names; ``summary`` describes what was built (nothing is printed here). Labels: integers
are used as they are; names are mapped to class indices in sorted order, or in the order of ``labels``.
Bad input raises ``FileNotFoundError`` / ``ValueError`` with a one-line message. ``transformers`` and PIL
are imported when a function runs.
"""
from __future__ import annotations

import csv
import json
import re
from collections import Counter
from pathlib import Path

import torch

from .data import library_reason
from .models import quiet_transformers

__all__ = ["text_dataset", "image_dataset", "read_table", "encode_labels", "parse_label_names", "existing_model_dir",
           "read_model_config", "config_value", "table_column", "load_tokenizer", "load_image_processor", "image_files", "TEXT_FORMATS", "IMAGE_SUFFIXES",
           "DEFAULT_MAX_LENGTH"]

#: suffix -> csv delimiter (None: JSON lines)
TEXT_FORMATS = {".csv": ",", ".tsv": "\t", ".jsonl": None}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
DEFAULT_MAX_LENGTH = 128
# files that may carry a tokenizer (checked before loading: transformers builds an empty-vocabulary
# tokenizer from a bare config.json instead of failing)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt",
                   "spiece.model", "tokenizer.model", "sentencepiece.bpe.model")
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
TOKENIZER_HINT = ("the directory must hold the model's tokenizer files (tokenizer.json, or tokenizer_config.json "
                  "with its vocabulary, as written by tokenizer.save_pretrained(MODEL_DIR))")
PROCESSOR_HINT = ("the directory must hold the model's image processor files (preprocessor_config.json, as "
                  "written by image_processor.save_pretrained(MODEL_DIR))")
_INT = re.compile(r"[+-]?\d+")


def _one_line(exc) -> str:
    """The first line of a library's message (:func:`geosharp_ref.io.data.library_reason` without the type)."""
    reason = library_reason(exc)
    return reason.split(": ", 1)[1] if ": " in reason else reason


def existing_model_dir(model_dir) -> Path:
    path = Path(model_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {str(model_dir)!r} does not exist (MODEL_DIR must be a local "
                                f"Hugging Face-format directory; hub names are never downloaded)")
    return path


def read_model_config(path: Path) -> dict:
    """``config.json`` of a model directory as a dict ({} when absent or unreadable)."""
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def config_value(cfg: dict, key: str, sub: str):
    value = cfg.get(key)
    if value is None and isinstance(cfg.get(sub), dict):
        value = cfg[sub].get(key)
    return value


# --------------------------------------------------------------------------------------------------
# Tables and labels
# --------------------------------------------------------------------------------------------------

def read_table(path) -> tuple[list[str], list[tuple[int, dict]]]:
    """``(columns, rows)`` of a ``.csv`` / ``.tsv`` (header line) or ``.jsonl`` (one object per line) file;
    each row is ``(line number, {column: value})``. Missing cells are ``None``."""
    p = Path(path)
    if p.suffix.lower() not in TEXT_FORMATS:
        raise ValueError(f"text file {str(path)!r} must end in {', '.join(TEXT_FORMATS)} (got {p.suffix or 'no suffix'!r})")
    if not p.is_file():
        raise FileNotFoundError(f"text file {str(path)!r} does not exist")
    delimiter = TEXT_FORMATS[p.suffix.lower()]
    try:
        with open(p, newline="", encoding="utf-8-sig") as f:
            if delimiter is None:
                columns, rows = _read_jsonl(f, p)
            else:
                reader = csv.DictReader(f, delimiter=delimiter)
                columns = [c for c in (reader.fieldnames or []) if c is not None]
                rows = []
                for row in reader:
                    if row.get(None):  # more cells than the header: every later column would shift
                        sep = "a tab" if delimiter == "\t" else repr(delimiter)
                        raise ValueError(f"text file {str(p)!r} line {reader.line_num} has "
                                         f"{len(columns) + len(row[None])} cells but the header has {len(columns)} "
                                         f"columns; quote the cells that hold {sep} (\"…\") or remove the extra "
                                         f"cells")
                    rows.append((reader.line_num, {k: v for k, v in row.items() if k is not None}))
    except UnicodeDecodeError as exc:
        raise ValueError(f"text file {str(p)!r} is not UTF-8 text ({_one_line(exc)})") from exc
    except csv.Error as exc:
        raise ValueError(f"text file {str(p)!r} is not valid {p.suffix[1:].upper()} ({_one_line(exc)})") from exc
    if not columns or not rows:
        what = "is empty" if not columns else "has a header line but no rows"
        raise ValueError(f"text file {str(p)!r} {what}")
    return columns, rows


def _read_jsonl(f, p: Path):
    columns, rows = {}, []
    for number, line in enumerate(f, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{p} line {number}: not valid JSON ({_one_line(exc)})") from exc
        if not isinstance(obj, dict):
            raise ValueError(f"{p} line {number}: expected a JSON object per line, got {type(obj).__name__}")
        columns.update(dict.fromkeys(obj))
        rows.append((number, obj))
    return list(columns), rows


def table_column(columns, name, path, option):
    if name not in columns:
        raise ValueError(f"{option} {name!r} is not a column of {path}; its columns are "
                         f"{', '.join(map(repr, columns))}")
    return name


def parse_label_names(labels) -> list[str]:
    """``"a,b,c"`` (or a list of names) -> ``["a", "b", "c"]`` (stripped; empty or repeated names are an
    error)."""
    names = [str(s).strip() for s in (labels.split(",") if isinstance(labels, str) else labels)]
    if not names or any(not s for s in names):
        raise ValueError(f"--labels must be comma-separated non-empty names, got {labels!r}")
    repeated = sorted(n for n, k in Counter(names).items() if k > 1)
    if repeated:
        raise ValueError(f"--labels names {', '.join(map(repr, repeated))} more than once")
    return names


def encode_labels(values, names=None, where=None) -> tuple[torch.Tensor, list[str] | None]:
    """``(targets, names)``: integer labels (ints or integer strings, all of them) as they are with
    ``names`` None; otherwise names mapped to indices in ``names`` order (default: sorted). ``where[i]``
    says where value ``i`` comes from in error messages."""
    where = where or [f"example {i}" for i in range(len(values))]
    cleaned = []
    for v, w in zip(values, where):
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            if v is None:
                raise ValueError(f"{w}: no label")
            raise ValueError(f"{w}: label {v!r} is neither a name nor an integer")
        v = v.strip() if isinstance(v, str) else v
        if v == "":
            raise ValueError(f"{w}: empty label")
        cleaned.append(v)
    if names is None and all(isinstance(v, int) or _INT.fullmatch(v) for v in cleaned):
        ints = [int(v) for v in cleaned]
        for v, w in zip(ints, where):
            if v < 0:
                raise ValueError(f"{w}: label {v} is negative (integer labels are class indices)")
        return torch.tensor(ints, dtype=torch.long), None
    strings = [str(v) for v in cleaned]
    if names is None:
        names = sorted(set(strings))
    index = {n: i for i, n in enumerate(names)}
    for s, w in zip(strings, where):
        if s not in index:
            raise ValueError(f"{w}: label {s!r} is not one of --labels ({', '.join(names)})")
    return torch.tensor([index[s] for s in strings], dtype=torch.long), list(names)


def _counts(targets: torch.Tensor, names) -> dict:
    counts = Counter(targets.tolist())
    if names is not None:
        return {n: counts.get(i, 0) for i, n in enumerate(names)}
    return {str(k): counts[k] for k in sorted(counts)}


def _label_warnings(cfg: dict, targets: torch.Tensor) -> list[str]:
    archs = cfg.get("architectures") or []
    head = any(str(a).endswith(("ForSequenceClassification", "ForImageClassification")) for a in archs)
    k = cfg.get("num_labels") or (len(cfg["id2label"]) if isinstance(cfg.get("id2label"), dict) else None)
    top = int(targets.max())
    if head and k and top >= k:
        return [f"the largest class index is {top} but the model's classifier has {k} labels (config.json): "
                f"evaluate will refuse these targets"]
    return []


# --------------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------------

def load_tokenizer(model_dir):
    """The tokenizer saved in ``model_dir`` (``AutoTokenizer``, ``local_files_only``); a clear error when
    there is none."""
    import transformers

    path = existing_model_dir(model_dir)
    if not any((path / n).is_file() for n in TOKENIZER_FILES):
        raise FileNotFoundError(f"model directory {str(path)!r} has no tokenizer (none of "
                                f"{', '.join(TOKENIZER_FILES)}); {TOKENIZER_HINT}")
    try:
        with quiet_transformers():
            tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, TypeError, … for broken files
        raise ValueError(f"could not load the tokenizer of {str(path)!r} ({type(exc).__name__}: "
                         f"{_one_line(exc)}); {TOKENIZER_HINT}") from exc
    vocab_files = sorted(set(getattr(tok, "vocab_files_names", {}).values()) | {"tokenizer.json"})
    if not any((path / n).is_file() for n in vocab_files):
        raise FileNotFoundError(f"model directory {str(path)!r} has no vocabulary for its {type(tok).__name__} "
                                f"(none of {', '.join(vocab_files)}); {TOKENIZER_HINT}")
    return tok


def text_dataset(model_dir, path, text_column, label_column, text_pair_column=None,
                 max_length=DEFAULT_MAX_LENGTH, labels=None):
    """Tokenized rows of ``path`` and their class indices: ``(data, summary)`` (see the module doc).

    ``labels``: class names in index order (a list or ``"a,b,c"``); default sorted names, or the integers
    themselves. ``summary`` has ``examples``, ``classes``, ``counts``, ``max_length``, ``truncated`` (examples
    longer than ``max_length`` tokens before truncation), ``truncation_rate``, ``longest``, ``shapes``, …"""
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"--max-length must be an integer of at least 2, got {max_length!r}")
    names = parse_label_names(labels) if labels is not None else None
    mdir = existing_model_dir(model_dir)
    columns, rows = read_table(path)
    table_column(columns, text_column, path, "--text-column")
    table_column(columns, label_column, path, "--label-column")
    if text_pair_column is not None:
        table_column(columns, text_pair_column, path, "--text-pair-column")

    where = [f"{path} line {n}" for n, _ in rows]

    def texts(col):
        out = []
        for (_, row), w in zip(rows, where):
            v = row.get(col)
            if not isinstance(v, str):
                raise ValueError(f"{w}: column {col!r} " + ("is missing" if v is None else f"is not text ({v!r})"))
            out.append(v)
        return out

    first = texts(text_column)
    second = texts(text_pair_column) if text_pair_column is not None else None
    targets, names = encode_labels([row.get(label_column) for _, row in rows], names, where)

    tok = load_tokenizer(mdir)
    cfg = read_model_config(mdir)
    limit = getattr(tok, "model_max_length", None)
    if isinstance(limit, int) and limit < 10**6 and max_length > limit:
        raise ValueError(f"--max-length {max_length} exceeds the tokenizer's model_max_length {limit}")
    positions = config_value(cfg, "max_position_embeddings", "text_config")
    if isinstance(positions, int) and max_length > positions:
        raise ValueError(f"--max-length {max_length} exceeds the model's max_position_embeddings {positions} "
                         f"(config.json)")
    if tok.pad_token is None:
        raise ValueError(f"the tokenizer of {str(mdir)!r} ({type(tok).__name__}) has no padding token; "
                         f"examples cannot be padded to --max-length")

    full = tok(first, second, truncation=False, padding=False, verbose=False)["input_ids"]
    lengths = [len(ids) for ids in full]
    enc = tok(first, second, truncation=True, padding="max_length", max_length=max_length,
              return_attention_mask=True, return_tensors="pt")
    inputs = {"input_ids": enc["input_ids"].long(), "attention_mask": enc["attention_mask"].long()}
    if second is not None and "token_type_ids" in enc:
        inputs["token_type_ids"] = enc["token_type_ids"].long()

    vocab = config_value(cfg, "vocab_size", "text_config")
    top = int(inputs["input_ids"].max())
    if isinstance(vocab, int) and top >= vocab:
        raise ValueError(f"the tokenizer of {str(mdir)!r} gives token id {top} but the model's vocab_size is "
                         f"{vocab} (config.json): the tokenizer is not this model's")

    truncated = sum(n > max_length for n in lengths)
    data = {"inputs": inputs, "targets": targets}
    if names is not None:
        data["labels"] = names
    summary = {
        "kind": "text", "source": str(path), "model_dir": str(model_dir), "examples": len(rows),
        "text_column": text_column, "text_pair_column": text_pair_column, "label_column": label_column,
        "tokenizer": type(tok).__name__, "max_length": max_length, "truncated": truncated,
        "truncation_rate": truncated / len(rows), "longest": max(lengths),
        "classes": names, "counts": _counts(targets, names),
        "shapes": {k: tuple(v.shape) for k, v in inputs.items()},
        "warnings": _label_warnings(cfg, targets),
    }
    return data, summary


# --------------------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------------------

def image_files(images_dir) -> tuple[list[str], list[list[Path]]]:
    """``(class names, files per class)`` of ``DIR/<class>/<image>``: sorted sub-folders (hidden ones
    skipped), sorted image files with a suffix in :data:`IMAGE_SUFFIXES` inside each."""
    root = Path(images_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"image directory {str(images_dir)!r} does not exist")
    folders = sorted((d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")),
                     key=lambda d: d.name)
    if not folders:
        raise ValueError(f"image directory {str(root)!r} has no class sub-folders (expected DIR/<class>/<image>, "
                         f"one sub-folder per class)")
    files = []
    for d in folders:
        found = sorted((f for f in d.iterdir() if f.is_file() and not f.name.startswith(".")
                        and f.suffix.lower() in IMAGE_SUFFIXES), key=lambda f: f.name)
        if not found:
            raise ValueError(f"class folder {str(d)!r} has no images (files ending in "
                             f"{', '.join(IMAGE_SUFFIXES)})")
        files.append(found)
    return [d.name for d in folders], files


def load_image_processor(model_dir):
    """The image processor saved in ``model_dir`` (``AutoImageProcessor``, ``local_files_only``); a clear
    error when there is none."""
    import transformers

    path = existing_model_dir(model_dir)
    if not any((path / n).is_file() for n in PROCESSOR_FILES):
        raise FileNotFoundError(f"model directory {str(path)!r} has no image processor (no "
                                f"{' or '.join(PROCESSOR_FILES)}); {PROCESSOR_HINT}")
    try:
        with quiet_transformers():
            return transformers.AutoImageProcessor.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, … for broken files
        raise ValueError(f"could not load the image processor of {str(path)!r} ({type(exc).__name__}: "
                         f"{_one_line(exc)}); {PROCESSOR_HINT}") from exc


def _open_image(path: Path, mode: str):
    import PIL.Image

    try:
        with PIL.Image.open(path) as im:
            return im.convert(mode)  # loads the (first) frame
    except (OSError, ValueError, PIL.Image.DecompressionBombError) as exc:
        raise ValueError(f"could not read image {str(path)!r} ({_one_line(exc)})") from exc


def image_dataset(model_dir, images_dir, chunk=64):
    """Preprocessed images of ``DIR/<class>/<image>`` and their class indices: ``(data, summary)`` (see
    the module doc). Images are converted to RGB (grey ``L`` when the model has one channel), as
    transformers' own ``load_image`` does, and processed ``chunk`` at a time."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1, got {chunk}")
    mdir = existing_model_dir(model_dir)
    names, files = image_files(images_dir)
    processor = load_image_processor(mdir)
    cfg = read_model_config(mdir)
    channels = config_value(cfg, "num_channels", "vision_config")
    if channels is None:
        mean = getattr(processor, "image_mean", None)
        channels = len(mean) if isinstance(mean, (list, tuple)) else 3
    mode = "L" if channels == 1 else "RGB"
    paths = [f for fs in files for f in fs]
    targets = torch.tensor([i for i, fs in enumerate(files) for _ in fs], dtype=torch.long)
    parts = []
    for a in range(0, len(paths), chunk):
        images = [_open_image(f, mode) for f in paths[a:a + chunk]]
        try:
            out = processor(images=images, return_tensors="pt")
        except Exception as exc:  # a processor that cannot handle these images
            raise ValueError(f"the image processor of {str(mdir)!r} ({type(processor).__name__}) failed on "
                             f"{paths[a]} … ({type(exc).__name__}: {_one_line(exc)})") from exc
        parts.append(out["pixel_values"])
    pixels = torch.cat(parts)
    warnings = _label_warnings(cfg, targets)
    size = config_value(cfg, "image_size", "vision_config")
    if isinstance(channels, int) and pixels.shape[1] != channels:
        warnings.append(f"the processor gives {pixels.shape[1]} channels but the model has num_channels "
                        f"{channels} (config.json)")
    if isinstance(size, int) and tuple(pixels.shape[-2:]) != (size, size):
        warnings.append(f"the processor gives {pixels.shape[-2]}×{pixels.shape[-1]} images but the model's "
                        f"image_size is {size} (config.json)")
    data = {"inputs": {"pixel_values": pixels}, "targets": targets, "labels": names}
    summary = {
        "kind": "images", "source": str(images_dir), "model_dir": str(model_dir), "examples": len(paths),
        "processor": type(processor).__name__, "mode": mode, "classes": names, "counts": _counts(targets, names),
        "shapes": {"pixel_values": tuple(pixels.shape)}, "warnings": warnings,
    }
    return data, summary
