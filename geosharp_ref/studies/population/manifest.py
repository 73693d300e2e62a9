"""The on-disk layout of a population directory, and its manifest.

Layout of ``DIR``::

    population.json            manifest: data split, architecture, per model hparams (+ metrics when trained)
    models/model_000/          save_pretrained output + geosharp_model.json (hparams, metrics, split seed)
    evaluation.json            evaluation settings (a resumed evaluate must use the same ones)
    results.jsonl              one line per model, append-only, fsync'd; canonical order once complete
    results.parts/rank*.jsonl  per-rank files of a distributed (torchrun) evaluation, merged at the end
    results.units/rank*.jsonl  each finished (model, measure, radius) of models not finished yet: a killed
                               evaluation resumes inside a model; removed when the evaluation is complete
    correlation.json / .csv, correlation_tau.csv, correlation.png
    results-TAG.jsonl, evaluation-TAG.json, correlation-TAG.*   another evaluation (``--tag TAG``), e.g. ablations
    excluded.json              models left out of every evaluation, each with its reason (:mod:`.exclusion`)
"""
from __future__ import annotations

import json
import math
import numbers
from pathlib import Path

__all__ = ["MANIFEST", "MANIFEST_FORMAT", "population_files", "read_manifest", "read_json_object",
           "check_manifest_entries"]

MANIFEST = "population.json"
MANIFEST_FORMAT = "geosharp-population/1"


def population_files(tag: str = "") -> dict:
    """File names of one evaluation of a population (``tag`` separates several evaluations)."""
    sfx = f"-{tag}" if tag else ""
    return dict(results=f"results{sfx}.jsonl", parts=f"results{sfx}.parts", units=f"results{sfx}.units",
                config=f"evaluation{sfx}.json",
                correlation=f"correlation{sfx}")


def read_json_object(path, what: str, keys=(), fix: str = "delete it and run the command that writes it again",
                     missing: str | None = None) -> dict:
    """The JSON object in ``path`` (``what`` it should hold, for messages), with every key of ``keys``; a missing
    file (``missing``: what to run first), invalid JSON, another type or a missing key is refused in one line
    that ends with ``fix``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist" + (f"; {missing}" if missing else ""))
    try:
        obj = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); {fix}") from None
    if not isinstance(obj, dict):
        kind = {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number",
                type(None): "null"}.get(type(obj), type(obj).__name__)
        raise ValueError(f"{path} should hold the {what} as a JSON object, but holds {kind}; {fix}")
    absent = [k for k in keys if k not in obj]
    if absent:
        raise ValueError(f"{path} should hold the {what}, but lacks {absent}; {fix}")
    return obj


def _finite(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, numbers.Real) and math.isfinite(x)


def check_manifest_entries(path, man: dict, fix: str) -> None:
    """Every model entry of a manifest is an object with a unique ``name``, where to load it from (``dir``, or
    ``loader`` and ``path`` for an imported model) and, once trained, ``metrics`` with a finite ``gap``."""
    plan = man.get("plan")
    if not (isinstance(plan, dict) and isinstance(plan.get("data"), dict) and "dataset" in plan["data"]):
        raise ValueError(f"{path} is not a valid population manifest ('plan' must hold the data spec "
                         f"{{'dataset': …}}); {fix}")
    seen = set()
    for i, m in enumerate(man["models"]):
        where = f"{path}: models[{i}]"
        if not (isinstance(m, dict) and isinstance(m.get("name"), str) and m["name"]):
            raise ValueError(f"{where} is not a model entry (a JSON object with a 'name'); {fix}")
        if m["name"] in seen:
            raise ValueError(f"{where}: model {m['name']!r} is listed twice; {fix}")
        seen.add(m["name"])
        if "loader" in m:
            if not (isinstance(m.get("path"), str) and m["path"]):
                raise ValueError(f"{where} ({m['name']!r}) is an imported model without a 'path'; {fix}")
        elif not (isinstance(m.get("dir"), str) and m["dir"]):
            raise ValueError(f"{where} ({m['name']!r}) names no model directory ('dir'); {fix}")
        if man.get("complete"):
            metrics = m.get("metrics")
            if not (isinstance(metrics, dict) and _finite(metrics.get("gap"))):
                raise ValueError(f"{where} ({m['name']!r}) has no finite metrics.gap; {fix}")


def read_manifest(out, trained: bool = True) -> dict:
    """The population manifest of ``out``, checked; a population whose training has not finished is refused
    unless ``trained`` is false (the per-model pipeline and the calibration need only the models they use)."""
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; run `geosharp population train --out {out}` first")
    try:
        man = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not a valid population manifest (corrupt JSON: {exc}); restore it, or delete "
                         f"{out} and train again") from None
    if not isinstance(man, dict) or not isinstance(man.get("models"), list) or "plan" not in man:
        raise ValueError(f"{path} is not a valid population manifest (expected 'plan' and a 'models' list); "
                         f"restore it, or delete {out} and train again")
    if not man["models"]:
        raise ValueError(f"the population in {out} has no models; train one with `geosharp population train "
                         f"--out {out} --models N` (N ≥ 3 for a correlation)")
    check_manifest_entries(path, man, f"restore it, or delete {out} and train (or import) again")
    if trained and not man.get("complete"):
        raise ValueError(f"population in {out} is not completely trained; rerun `geosharp population train "
                         f"--out {out}` (it resumes), or `geosharp population pipeline --out {out}`, which trains "
                         f"the models left")
    return man
