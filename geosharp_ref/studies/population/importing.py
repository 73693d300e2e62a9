"""Real populations from local paths: register models you have on disk as a population.

:func:`import_population` writes ``population.json`` for model-soups CLIP ViT-B/32 state dicts
(:mod:`geosharp_ref.io.clip_soups`) or Hugging Face checkpoints (:func:`geosharp_ref.io.models.load_hf_classifier`,
which refuses a checkpoint whose weights do not cover the model) with their generalisation gaps, so that
``geosharp population evaluate|correlate`` run on them unchanged; :func:`load_imported_model` loads one
entry.
"""
from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Optional

from torch import nn

from ...io.clip_soups import load_clip_soup
from ...io.data import load_data
from ...io.durable import write_json_atomic
from ...io.models import load_hf_classifier
from .manifest import MANIFEST_FORMAT

__all__ = ["import_population", "load_imported_model", "MANIFEST_FORMAT", "LOADERS"]

LOADERS = ("clip-soups", "hf")


def _detect_loader(path: Path, loader: str) -> str:
    if loader not in ("auto",) + LOADERS:
        raise ValueError(f"unknown loader {loader!r}; choose 'auto', 'clip-soups' or 'hf'")
    if not path.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist")
    if loader == "auto":
        if path.is_file() and path.suffix.lower() in (".pt", ".pth"):
            return "clip-soups"
        if path.is_dir() and (path / "config.json").is_file():
            return "hf"
        raise ValueError(f"cannot tell the format of {str(path)!r}: expected a .pt/.pth file (model-soups "
                         f"state dict) or a directory with config.json (Hugging Face); pass loader=")
    if loader == "clip-soups" and not path.is_file():
        raise ValueError(f"loader 'clip-soups' needs a state-dict file, but {str(path)!r} is a directory")
    if loader == "hf" and not (path.is_dir() and (path / "config.json").is_file()):
        raise ValueError(f"loader 'hf' needs a directory with config.json, got {str(path)!r}")
    return loader


def _unique_names(paths: list[Path]) -> list[str]:
    """File stem / directory name; where two collide, prefix parent folders until they differ."""
    def name(p, depth):
        base = p.stem if p.is_file() else p.name
        parents = [q.name for q in p.parents][: depth][::-1]
        return "/".join(parents + [base])

    depth = [0] * len(paths)
    while True:
        names = [name(p, d) for p, d in zip(paths, depth)]
        clash = {n for n in names if names.count(n) > 1}
        if not clash:
            return names
        grew = False
        for i, n in enumerate(names):
            if n in clash and depth[i] < len(paths[i].parents):
                depth[i] += 1
                grew = True
        if not grew:
            raise ValueError(f"cannot give unique names to models {sorted(clash)}")


def _cell(row, col):
    v = row.get(col)
    if v is None:
        return None
    v = v.strip()
    return None if v == "" or v.lower() in ("nan", "na", "none", "null") else v


def _float(row, col, csv_path, model):
    v = _cell(row, col)
    if v is None:
        return None
    try:
        x = float(v)
    except ValueError:
        raise ValueError(f"{csv_path}: model {model!r}: column {col!r} holds {v!r}, not a number") from None
    if not math.isfinite(x):
        raise ValueError(f"{csv_path}: model {model!r}: column {col!r} is not finite ({v!r})")
    return x


def _fraction(row, col, csv_path, model):
    x = _float(row, col, csv_path, model)
    if x is not None and not (0.0 <= x <= 1.0):
        raise ValueError(f"{csv_path}: model {model!r}: {col}={x} is outside [0, 1]; give errors and "
                         f"accuracies as fractions (divide percentages by 100)")
    return x


_GAP_TOL = 1e-3  # |gap − (test_error − train_error)| allowed when both are given (CSV rounding)


def _metrics(row, csv_path, model) -> dict:
    gap = _float(row, "gap", csv_path, model)
    tr, te = _fraction(row, "train_error", csv_path, model), _fraction(row, "test_error", csv_path, model)
    tra, tea = (_fraction(row, "train_accuracy", csv_path, model),
                _fraction(row, "test_accuracy", csv_path, model))
    if tr is None and tra is not None:
        tr = 1.0 - tra
    if te is None and tea is not None:
        te = 1.0 - tea
    if (tr is None) != (te is None):
        raise ValueError(f"{csv_path}: model {model!r} has only one of train/test error (or accuracy); "
                         f"give both, or a gap column")
    if gap is None:
        if tr is None:
            raise ValueError(f"{csv_path}: model {model!r} has no gap: fill `gap`, or `train_error` and "
                             f"`test_error`, or `train_accuracy` and `test_accuracy`")
        gap = te - tr
    elif tr is not None and abs(gap - (te - tr)) > _GAP_TOL:
        raise ValueError(f"{csv_path}: model {model!r}: gap {gap} disagrees with test_error − train_error "
                         f"= {te - tr:.6g}; fix the CSV (gap = test_error − train_error)")
    n = _cell(row, "train_examples")
    if n is not None:
        try:
            n = int(float(n))
        except ValueError:
            raise ValueError(f"{csv_path}: model {model!r}: train_examples {n!r} is not an integer") from None
    return {"gap": float(gap), "train_error": tr, "test_error": te, "train_examples": n}


def _read_metrics_csv(path: Path):
    if not path.is_file():
        raise FileNotFoundError(f"metrics CSV {str(path)!r} does not exist")
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        cols = [c.strip() for c in (reader.fieldnames or [])]
        reader.fieldnames = cols
        rows = list(reader)
    if "model" not in cols:
        raise ValueError(f"metrics CSV {str(path)!r} has no `model` column (header: {cols}); it needs `model` "
                         f"and `gap`, or `train_error`+`test_error`, or `train_accuracy`+`test_accuracy`")
    if not ({"gap"} <= set(cols) or {"train_error", "test_error"} <= set(cols)
            or {"train_accuracy", "test_accuracy"} <= set(cols)):
        raise ValueError(f"metrics CSV {str(path)!r} (header: {cols}) needs a `gap` column, or "
                         f"`train_error` and `test_error`, or `train_accuracy` and `test_accuracy`")
    return rows


def _row_for(rows, csv_path: Path, name: str, path: Path, given: str):
    keys = {name, path.name, given, str(path)}
    if path.is_file():
        keys.add(path.stem)
    hits = []
    for row in rows:
        v = (row.get("model") or "").strip()
        if not v:
            continue
        ok = v in keys or v.rstrip("/") in keys
        if not ok and ("/" in v or os.sep in v):
            for base in (Path.cwd(), csv_path.parent):
                if (base / v).resolve() == path:
                    ok = True
        if ok:
            hits.append(row)
    if not hits:
        raise ValueError(f"model {name!r} ({path}) is not in the metrics CSV {str(csv_path)!r}; its `model` "
                         f"column must hold the model's name ({name!r}), file name ({path.name!r}) or path")
    if len(hits) > 1:
        raise ValueError(f"model {name!r} ({path}) matches {len(hits)} rows of {str(csv_path)!r} "
                         f"({[h.get('model') for h in hits]}); keep one row per model")
    return hits[0]


def import_population(out, models, metrics_csv, data, loader: str = "auto", heads: Optional[int] = None) -> dict:
    """Register real models from local paths as a population in ``out/population.json``.

    ``models``: model-soups ``.pt``/``.pth`` files and/or Hugging Face directories (one format per
    population); ``metrics_csv``: a CSV with a ``model`` column (name = file stem / directory name,
    file name, or path) and ``gap``, or ``train_error``+``test_error``, or
    ``train_accuracy``+``test_accuracy`` (fractions; gap = test error − train error), optionally
    ``train_examples``; ``data``: the sharpness examples, a file for
    :func:`geosharp_ref.io.data.load_data`.  ``heads``: CLIP head count when the width is not
    OpenAI's 64 per head (stored per entry as ``"heads"``).  Returns the manifest."""
    if isinstance(models, (str, os.PathLike)):
        models = [models]
    models = list(models)
    if not models:
        raise ValueError("no models given")
    given = [str(m) for m in models]
    paths = [Path(m).expanduser().resolve() for m in models]
    dup = sorted({str(p) for p in paths if paths.count(p) > 1})
    if dup:
        raise ValueError(f"models listed more than once: {dup}")
    loaders = [_detect_loader(p, loader) for p in paths]
    kinds = sorted(set(loaders))
    if len(kinds) > 1:
        ex = {k: next(str(p) for p, l in zip(paths, loaders) if l == k) for k in kinds}
        raise ValueError(f"models of different formats in one population ({ex}); a population shares one "
                         f"data file, so import CLIP state dicts and Hugging Face models separately")
    if heads is not None and kinds != ["clip-soups"]:
        raise ValueError("heads= applies to model-soups CLIP checkpoints only")
    data_path = Path(data).expanduser().resolve()
    load_data(data_path)  # clear error now rather than at evaluation time
    csv_path = Path(metrics_csv).expanduser().resolve()
    rows = _read_metrics_csv(csv_path)
    names = _unique_names(paths)
    entries = []
    for name, p, g, ld in zip(names, paths, given, loaders):
        row = _row_for(rows, csv_path, name, p, g)
        entry = {"name": name, "path": str(p), "loader": ld, "hparams": {},
                 "metrics": _metrics(row, csv_path, name)}
        if heads is not None:
            entry["heads"] = int(heads)
        entries.append(entry)
    manifest = {"format": MANIFEST_FORMAT, "complete": True,
                "plan": {"kind": "imported", "loader": kinds[0],
                         "data": {"dataset": "file", "path": str(data_path)}},
                "models": entries}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mpath = out / "population.json"
    if mpath.is_file():
        try:
            old = json.loads(mpath.read_text())
        except ValueError:
            old = None
        if old != manifest and any((out / f).exists() for f in ("results.jsonl", "results.parts", "results.units")):
            raise ValueError(f"{mpath} already describes another population and {out} holds its sharpness "
                             f"results; import into a new directory (or delete {out} to start over)")
    write_json_atomic(mpath, manifest)
    return manifest


def load_imported_model(entry: dict) -> nn.Module:
    """Load one imported manifest entry (``entry["loader"]``: 'clip-soups' or 'hf') in eval mode."""
    ld = entry.get("loader")
    path = entry.get("path")
    if not path:
        raise ValueError(f"manifest entry {entry.get('name')!r} has no path")
    if ld == "clip-soups":
        return load_clip_soup(path, heads=entry.get("heads"))
    if ld == "hf":
        return load_hf_classifier(path)
    raise ValueError(f"manifest entry {entry.get('name')!r}: unknown loader {ld!r}; expected one of {list(LOADERS)}")
