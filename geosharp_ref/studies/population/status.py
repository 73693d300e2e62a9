"""Where a population stands, blind to its results: ``geosharp population status --out DIR``.

A pre-registered study runs for weeks in resumable sittings, and nobody should look at a gap, a test error or a
sharpness value before the analysis. :func:`population_status` reports progress from file names, line counts and
timings only, and returns no value of any result, so it can be run at every sitting:

* **training**: models planned in the manifest, trained (a model directory exists: directories are written
  atomically), ``.tmp-*`` directories (a model in progress, or one left by a killed run), and the median
  training time of a trained model (its record's ``seconds``: the wall time of the worker that trained it), and
  how many trained models are packed (``geosharp population pack``: their weights are rebuilt when loaded), and
  how many were retrained by ``population pipeline`` on a machine that did not rebuild them (``retrained.jsonl``);
* **reliability**: models whose test predictions are written (``test_predictions.jsonl``), and whether
  ``reliability.json`` is written;
* **calibration**: whether ``calibration.json`` is written, else the finished probe runs of a calibration in
  progress (``calibration.units.jsonl``) and their mean time;
* **each evaluation** (``evaluation.json``, ``evaluation-TAG.json``): models finished, units (measure × radius
  of one model) finished of the models in progress (models with some of their units written: one per worker),
  units left, and, from the finished units' times, the time left for one worker (an estimate: units of one
  evaluation take about the same time); whether
  ``correlate`` has run (``correlation[-TAG].json``); a model left out of the evaluations (``excluded.json``,
  :mod:`.exclusion`) is named and not counted in them;
* **every stage** (where an evaluation has begun; ``population pipeline`` takes a whole model at a time): models
  with their test predictions and a record in every evaluation on disk (an excluded model: its predictions).

Times are wall times of one worker, as measured (a worker that shared its core ran longer). Nothing is written.
The manifest must exist; everything else may be absent.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from ...io.durable import read_jsonl
from .calibration import CALIBRATION, CALIBRATION_UNITS
from .evaluation import evaluation_grid, read_evaluation_settings, read_results, read_units, settings_digest
from .exclusion import read_excluded
from .manifest import MANIFEST, population_files, read_json_object
from .pack import RETRAINED, is_packed
from .reliability import PREDICTIONS, RELIABILITY

__all__ = ["population_status", "format_status"]


def _median(xs):
    return float(statistics.median(xs)) if xs else None


def _mean(xs):
    return float(statistics.fmean(xs)) if xs else None


def _training(out: Path, manifest: dict) -> dict:
    models = manifest["models"]
    trained, packed, seconds = 0, 0, []
    for m in models:
        if "loader" in m:  # an imported model: nothing to train
            trained += 1
            continue
        d = out / m.get("dir", f"models/{m['name']}")
        if d.is_dir():
            trained += 1
            packed += is_packed(d)
            try:
                sec = json.loads((d / "geosharp_model.json").read_text()).get("seconds")
            except (OSError, ValueError):
                sec = None
            if isinstance(sec, (int, float)):
                seconds.append(float(sec))
    tmp = len(list((out / "models").glob(".tmp-*"))) if (out / "models").is_dir() else 0
    med = _median(seconds)
    retrained = {r.get("model") for r in read_jsonl(out / RETRAINED) if isinstance(r, dict)} - {None}
    return dict(planned=len(models), trained=trained, packed=packed, retrained=len(retrained),
                complete=bool(manifest.get("complete")), in_progress_dirs=tmp,
                median_seconds_per_model=med,
                remaining_worker_hours=None if med is None else (len(models) - trained) * med / 3600)


def _reliability(out: Path, predicted: set) -> dict:
    return dict(models_predicted=len(predicted), written=(out / RELIABILITY).is_file())


def _calibration(out: Path) -> dict:
    if (out / CALIBRATION).is_file():
        return dict(written=True)
    runs = [u for u in read_jsonl(out / CALIBRATION_UNITS) if isinstance(u, dict)]
    return dict(written=False, probe_runs_finished=len(runs),
                mean_seconds_per_run=_mean([float(u["seconds"]) for u in runs
                                            if isinstance(u.get("seconds"), (int, float))]))


def _evaluation(out: Path, tag: str, names: list, excluded: set, done: set) -> dict:
    """The progress of evaluation ``tag``; ``done``: its models with a record, the excluded ones removed."""
    files = population_files(tag)
    cfg = read_evaluation_settings(out, tag)
    _, grid = evaluation_grid(cfg)
    per_model = sum(len(v) for v in grid.values())
    n_models = sum(n not in excluded for n in names)  # an excluded model is not evaluated (exclusion.py)
    units = read_units(out, files, settings_digest(cfg), repair=False)  # beside a running evaluation: read only
    in_progress = [model for (model, _, _) in units if model not in done and model not in excluded]
    partial = len(in_progress)
    left = (n_models - len(done)) * per_model - partial
    mean = _mean([float(u["seconds"]) for u in units.values() if isinstance(u.get("seconds"), (int, float))])
    return dict(models_finished=len(done), models=n_models, units_per_model=per_model,
                models_in_progress=len(set(in_progress)), units_finished_in_models_in_progress=partial, units_left=left,
                mean_seconds_per_unit=mean,
                remaining_worker_hours=None if mean is None else left * mean / 3600,
                correlated=(out / f"{files['correlation']}.json").is_file())


def population_status(out) -> dict:
    """The progress of the population in ``out`` (see the module doc), with no result value in it:
    ``{"out", "task", "training", "reliability", "calibration", "evaluations": {tag or "main": …}}``."""
    out = Path(out)
    manifest = read_json_object(out / MANIFEST, "population manifest", ("plan", "models"),
                                missing=f"no population here; train one with `geosharp population train --out {out}`")
    if not isinstance(manifest["models"], list) or not all(isinstance(m, dict) and isinstance(m.get("name"), str)
                                                           for m in manifest["models"]):
        raise ValueError(f"{out / MANIFEST}: 'models' must be a list of model entries with a 'name'; restore it")
    evaluations, finished, excluded = {}, [], set(read_excluded(out))
    names = [m["name"] for m in manifest["models"]]
    for path in sorted(out.glob("evaluation*.json")):
        tag = path.stem[len("evaluation-"):] if path.stem.startswith("evaluation-") else ""
        if path.name == population_files(tag)["config"]:
            finished.append(set(read_results(out, tag)) - excluded)
            evaluations[tag or "main"] = _evaluation(out, tag, names, excluded, finished[-1])
    predicted = {r.get("model") for r in read_jsonl(out / PREDICTIONS) if isinstance(r, dict)} - {None}
    # every stage: the test predictions and a record of every evaluation (an excluded model: its predictions)
    every_stage = None if not finished else sum(n in predicted and (n in excluded or all(n in d for d in finished))
                                                for n in names)
    plan = manifest["plan"] if isinstance(manifest["plan"], dict) else {}
    return dict(out=str(out), task=plan.get("task"), training=_training(out, manifest),
                reliability=_reliability(out, predicted), calibration=_calibration(out), evaluations=evaluations,
                excluded=sorted(excluded), every_stage=every_stage)


def _hours(h) -> str:
    return "" if h is None else f"; ≈ {h:.1f} hours left for one worker"


def format_status(status: dict) -> str:
    """The status as a few lines of text (what ``geosharp population status`` prints)."""
    t = status["training"]
    med = t["median_seconds_per_model"]
    lines = [f"{status['out']} ({status['task']}): {t['trained']} of {t['planned']} models trained"
             + (f" ({t['packed']} packed: rebuilt from their recipes when loaded)" if t["packed"] else "")
             + (f" ({t['retrained']} retrained on a machine that did not rebuild them)" if t["retrained"] else "")
             + ("" if t["complete"] else ", training not finished")
             + (f"; {t['in_progress_dirs']} in progress or left by a killed run" if t["in_progress_dirs"] else "")
             + ("" if med is None else f"; median {med / 60:.1f} minutes per model (a worker's wall time)")
             + ("" if t["trained"] == t["planned"] else _hours(t["remaining_worker_hours"]))]
    r = status["reliability"]
    lines.append("  reliability: " + ("written" if r["written"] else "not started" if not r["models_predicted"] else
                                       f"test predictions of {r['models_predicted']} of {t['planned']} models"))
    c = status["calibration"]
    lines.append("  calibration: " + ("written" if c["written"] else "not started" if not c["probe_runs_finished"]
                                       else f"{c['probe_runs_finished']} probe runs finished" + (
                                           "" if c["mean_seconds_per_run"] is None
                                           else f" ({c['mean_seconds_per_run']:.0f} s each)")))
    if status.get("excluded"):
        lines.append(f"  left out of every evaluation: {', '.join(status['excluded'])} (excluded.json)")
    if not status["evaluations"]:
        lines.append("  evaluations: none started")
    else:
        lines.append(f"  every stage (test predictions and every evaluation): {status['every_stage']} of "
                     f"{t['planned']} models")
    for tag, e in status["evaluations"].items():
        lines.append(f"  evaluation {tag}: {e['models_finished']} of {e['models']} models finished"
                     + (f" (+{e['units_finished_in_models_in_progress']} of "
                        f"{e['models_in_progress'] * e['units_per_model']} units of the {e['models_in_progress']} "
                        f"model{'s' if e['models_in_progress'] > 1 else ''} in progress)"
                        if e["units_finished_in_models_in_progress"] else "")
                     + f", {e['units_left']} units left" + _hours(e["remaining_worker_hours"])
                     + ("; correlated" if e["correlated"] else ""))
    return "\n".join(lines)
