"""Models left out of a population's evaluations, each with the reason (``DIR/excluded.json``).

An evaluation stops at a model whose sharpness value is not finite, naming the model, the measure and the radius
and no value (:class:`~geosharp_ref.studies.population.evaluation.NonFiniteUnitError`); a study's protocol then
says how that model is treated. Leaving it out is one command, written before the evaluation resumes::

    geosharp population exclude --out DIR --model model_017 --reason "tweets protocol amendment 11: ..."

From then on every evaluation of ``DIR`` (each ``--tag``) skips the model and is complete without it, ``correlate``
leaves it out of every τ (``correlation.json`` lists it under ``excluded``), ``population status`` counts it, and
the tweets analysis names it with its reason. A record measured before the exclusion stays in the results files;
it is only not used (``evaluate_population`` returns none of it). Nothing else changes: the trained model, its gap,
the reliability of the gaps (measured on every model before any sharpness) and a calibration (on the first models,
before any evaluation) stay as they are. File format::

    {"models": {"model_017": "the reason"}}
"""
from __future__ import annotations

from pathlib import Path

from ...io.durable import write_json_atomic
from .manifest import read_json_object, read_manifest

__all__ = ["EXCLUDED", "read_excluded", "exclude_model"]

EXCLUDED = "excluded.json"


def read_excluded(out) -> dict:
    """``{model name: reason}`` of the models left out of ``out``'s evaluations (``{}`` where none is)."""
    path = Path(out) / EXCLUDED
    if not path.is_file():
        return {}
    fix = "restore it, or write it again with `geosharp population exclude`"
    obj = read_json_object(path, "models left out of the evaluations", ("models",), fix)
    models = obj["models"]
    if not (isinstance(models, dict) and all(isinstance(k, str) and isinstance(v, str) and v.strip()
                                             for k, v in models.items())):
        raise ValueError(f"{path}: 'models' must map each model's name to the reason it is left out; {fix}")
    return dict(models)


def exclude_model(out, name: str, reason: str) -> dict:
    """Leave model ``name`` of the population in ``out`` out of every evaluation, for ``reason`` (recorded; the
    analysis names it). Checked before anything is written: the population exists, the model is one of it and not
    excluded yet, and the reason is not empty; ``excluded.json`` is written atomically. Returns every exclusion."""
    out = Path(out)
    names = [m["name"] for m in read_manifest(out, trained=False)["models"]]  # the pipeline may still train some
    excluded = read_excluded(out)
    if not reason.strip():
        raise ValueError("--reason is empty; say why the model leaves the population (e.g. the protocol's "
                         "amendment that decides it), the analysis reports it")
    if name not in names:
        raise ValueError(f"{out} has no model {name!r} (its models: {names[0]} … {names[-1]}); give a model's "
                         f"name as `population status` and the evaluation's error name it")
    if name in excluded:
        raise ValueError(f"{name} is already left out of {out}'s evaluations ({excluded[name]!r}); nothing to do")
    excluded[name] = reason.strip()
    write_json_atomic(out / EXCLUDED, dict(models=excluded))
    return excluded
