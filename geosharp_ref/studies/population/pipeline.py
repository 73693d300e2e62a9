"""Every stage after training, per model on one machine (``geosharp population pipeline``; amendment 13 of
docs/tweets/PROTOCOL.md).

A model's training does not reproduce bit for bit on a machine with another CPU (amendment 12), so a population
continued on a new machine (from its pack) cannot rebuild a packed model and keep its recorded errors. The
pipeline makes the unit of work the *model*: for each model, on one machine and in one worker process,

1. its weights (:func:`~.pack.ensure_weights`): trained now where the model is not trained yet (amendment 14:
   the training need not have finished), as they are, rebuilt from the recipe where they reproduce, else
   *retrained* with its errors measured again on the new weights (the old record kept in ``superseded/``), the
   manifest's entry synced to the record (:func:`sync_manifest_entry`);
2. every line of an earlier model of that name is discarded (:func:`discard_stale`): each line the pipeline
   writes of a model carries the SHA-256 of its weights (``weights_sha256``), and one with another digest (or none)
   belongs to other weights;
3. its test predictions (``test_predictions.jsonl``, for the gap's split-half reliability), checked against its
   recorded test error (:func:`~.reliability.predict_model`);
4. each evaluation in turn (main, ablations, curvature: ``results[-TAG].jsonl``), the model loaded afresh for each,
   resumable per unit (measure, radius) as ``geosharp population evaluate`` is (:func:`~.evaluation.evaluate_entry`).

A model whose predictions and records all carry the digest of its weights (read from ``SHA256SUMS`` where it is
packed) is complete and is not loaded again, on any machine. A model left out of the evaluations
(``excluded.json``) gets its weights and predictions only.

:func:`run_pipeline` runs the calibration first (on the first models, their weights ensured first), writes or
checks each evaluation's settings, then the models in ``workers`` spawned one-thread processes (a whole model
each), then marks the population trained (where it trained the last models), the canonical results of each
evaluation (manifest order) and, once every model is complete, the split-half reliability. It holds the
population's ``.train.lock`` throughout (``population train`` is refused meanwhile). Every append of every worker
happens under one lock (``.pipeline-append.lock``), so :func:`discard_stale` never races an append. Resumable at
every point: rerun it.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import warnings
from pathlib import Path

import torch

from ...distributed import die_with_parent
from ...io.durable import append_line, exclusive_lock, read_jsonl, write_json_atomic, write_text_atomic
from .calibration import (CALIBRATION, CALIBRATION_UNITS, calibrate_population, evaluation_radii,
                          read_probe_units)
from .evaluation import (MEASURES, check_bucketable, check_settings_file, evaluate_entry, finalize_results,
                         plan_evaluation, read_results, read_units, settings_digest, sharpness_batches)
from .exclusion import read_excluded
from .manifest import MANIFEST, population_files, read_json_object, read_manifest
from .pack import (RECORD, RETRAINED, STAMP, check_packed_models, ensure_weights, restore_swapped, run_in_workers,
                   weights_digest)
from .reliability import (PREDICTIONS, gap_reliability, predict_model, prediction_record, read_prediction_records,
                          test_split)
from .training import TRAIN_LOCK

__all__ = ["STAMP", "sync_manifest_entry", "discard_stale", "model_complete", "pipeline_model", "run_pipeline"]

_APPEND_LOCK = ".pipeline-append.lock"
_MANIFEST_LOCK = ".manifest.lock"


def sync_manifest_entry(out, name: str) -> bool:
    """Copy the metrics of model ``name``'s record (``geosharp_model.json``) into its manifest entry, under
    ``.manifest.lock`` (two workers lose no edit); True where the entry changed (a retrained model)."""
    out = Path(out)
    with exclusive_lock(out / _MANIFEST_LOCK, wait=True):
        man = json.loads((out / MANIFEST).read_text())
        entry = next(m for m in man["models"] if m["name"] == name)
        metrics = _record_metrics(out, entry)
        if entry.get("metrics") == metrics:
            return False
        entry["metrics"] = metrics
        write_json_atomic(out / MANIFEST, man)
    return True


def _record_metrics(out: Path, entry: dict) -> dict:
    """The metrics of a trained model's record (``geosharp_model.json``)."""
    return read_json_object(out / entry["dir"] / RECORD, "model's training record", keys=("metrics",))["metrics"]


def _owned_files(out: Path, tags) -> list:
    """The files whose lines of a model the pipeline writes: predictions, probe runs, and the results, parts and
    units of its evaluations ``tags``."""
    paths = [out / PREDICTIONS, out / CALIBRATION_UNITS]
    for tag in tags:
        f = population_files(tag)
        paths += [out / f["results"], *sorted((out / f["parts"]).glob("rank*.jsonl")),
                  *sorted((out / f["units"]).glob("rank*.jsonl"))]
    return paths


def _other_files(out: Path, tags) -> list:
    """The results, parts and units of every other evaluation on disk (``results-TAG*``, run by hand or by another
    plan)."""
    owned = set(_owned_files(out, tags))
    paths = [*sorted(out.glob("results*.jsonl")), *sorted(out.glob("results*.parts/rank*.jsonl")),
             *sorted(out.glob("results*.units/rank*.jsonl"))]
    return [p for p in paths if p not in owned]


def _other_tags(out: Path, tags) -> list:
    """The tags of the other evaluations on disk (their settings, results, parts or units)."""
    found = {p.name.split(".")[0] for p in [*out.glob("results*"), *out.glob("evaluation*.json")]}
    names = {n.removeprefix("results").removeprefix("evaluation") for n in found}
    return sorted({n[1:] if n.startswith("-") else n for n in names} - set(tags))


def discard_stale(out, name: str, digest: str, tags=(), retrained: bool = False) -> int:
    """Remove the lines of model ``name`` that belong to other weights (each file rewritten atomically, under the
    append lock); returns the number of lines removed. In the pipeline's own files (predictions, probe runs, the
    evaluations ``tags``) that is every line whose ``weights_sha256`` is not ``digest`` (other weights, or none
    recorded). In every other evaluation on disk it is a line with another ``weights_sha256`` and, where the model
    was just ``retrained``, also a line with none (measured by hand on the weights before): a record of the
    weights it has now, or of unknown weights it may have now, is left alone."""
    out, dropped = Path(out), 0
    with exclusive_lock(out / _APPEND_LOCK, wait=True):
        for path, strict in [*((p, True) for p in _owned_files(out, tags)),
                             *((p, retrained) for p in _other_files(out, tags))]:
            lines = read_jsonl(path, repair=True)
            keep = [r for r in lines if not (isinstance(r, dict) and r.get("model") == name and r.get(STAMP) != digest
                                             and (strict or STAMP in r))]
            if len(keep) < len(lines):
                write_text_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))
                dropped += len(lines) - len(keep)
    return dropped


def _ensure(out: Path, entry: dict, tags, progress: bool) -> str:
    """:func:`~.pack.ensure_weights`, then :func:`sync_manifest_entry` and :func:`discard_stale`; the digest."""
    before = weights_digest(out, entry) if (out / entry["dir"]).is_dir() else None
    digest = ensure_weights(out, entry, progress)
    sync_manifest_entry(out, entry["name"])
    discard_stale(out, entry["name"], digest, tags, retrained=digest != before)
    return digest


def _ensure_named(out: Path, entry: dict, tags, progress: bool) -> tuple[str, str]:
    """``(name, digest)`` of :func:`_ensure` (a worker's job: results come back in the order they finish)."""
    return entry["name"], _ensure(out, entry, tags, progress)


def _append(out: Path, path: Path, record: dict) -> None:
    with exclusive_lock(out / _APPEND_LOCK, wait=True):
        path.parent.mkdir(exist_ok=True)
        append_line(path, record)


def _predicted(out: Path, name: str, digest: str) -> bool:
    return any(r.get("model") == name and r.get(STAMP) == digest for r in read_jsonl(out / PREDICTIONS))


def _evaluated(out: Path, name: str, digest: str, tag: str) -> bool:
    rec = read_results(out, tag).get(name)
    return rec is not None and rec.get(STAMP) == digest


def model_complete(out, entry: dict, tags, excluded) -> bool:
    """True where model ``entry`` has its test predictions and (unless ``excluded``) a record of every evaluation
    ``tags``, each carrying the digest of its weights (:func:`~.pack.weights_digest`: no weight is loaded); False
    where it is not trained yet."""
    out = Path(out)
    if not (out / entry["dir"]).is_dir():
        return False
    digest = weights_digest(out, entry)
    return _predicted(out, entry["name"], digest) and (
        entry["name"] in excluded or all(_evaluated(out, entry["name"], digest, t) for t in tags))


_CACHE: dict = {}  # per process: the test split and the sharpness batches, read once


def _cached(key, make):
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def pipeline_model(out, name: str, plans: list, progress: bool = False) -> str:
    """Every stage of model ``name`` after training (see the module doc), under the evaluation ``plans``
    (:func:`~.evaluation.plan_evaluation`'s, in order); returns ``name``. Nothing is done where it is complete."""
    out = Path(out)
    manifest = read_manifest(out, trained=False)
    entry = next(m for m in manifest["models"] if m["name"] == name)
    tags, excluded = [p["tag"] for p in plans], read_excluded(out)
    if model_complete(out, entry, tags, excluded):
        return name
    digest = _ensure(out, entry, tags, progress)
    metrics = _record_metrics(out, entry)
    if not _predicted(out, name, digest):
        split = _cached(("split", str(out)), lambda: test_split(out, manifest))
        pred = predict_model(out, entry, split, metrics["test_error"], 256, progress)
        _append(out, out / PREDICTIONS, prediction_record(name, pred, digest))
    if name in excluded:
        return name
    for plan in plans:
        files = population_files(plan["tag"])
        if _evaluated(out, name, digest, plan["tag"]):
            continue
        config = plan["config"]
        batches = _cached(("batches", str(out), config["batches"], config["batch_size"]),
                          lambda: sharpness_batches(manifest, config["batches"], config["batch_size"], out))
        digest_settings = settings_digest(config)
        done = {(ms, r): u for (n, ms, r), u in read_units(out, files, digest_settings, repair=False).items()
                if n == name}
        units_path = out / files["units"] / "rank0.jsonl"

        def finished(measure, key, unit, done=done, units_path=units_path, settings=digest_settings):
            _append(out, units_path, dict(model=name, measure=measure, rho=key, settings=settings, **unit,
                                          **{STAMP: digest}))
            done[measure, key] = unit

        record = evaluate_entry(out, entry, batches, plan, metrics["gap"], None, done, finished, progress)
        _append(out, out / files["results"], dict(record, **{STAMP: digest}))
    return name


def _pipeline_worker() -> None:
    """A pipeline process: one thread (as every model was trained), Ctrl-C left to its parent, dies with it."""
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warnings.filterwarnings("ignore")
    die_with_parent()


def _in_this_process(out: Path, todo: list, plans: list, progress: bool, bar) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for m in todo:
            pipeline_model(out, m["name"], plans, progress)
            bar.update(1)
    finally:
        torch.set_num_threads(threads)
        _CACHE.clear()


def _check_consistent(out: Path, manifest: dict, tags, excluded) -> None:
    """Every model's predictions and records carry the digest of its weights now (else the pipeline has not
    finished it: rerun)."""
    stale = [m["name"] for m in manifest["models"] if not model_complete(out, m, tags, excluded)]
    if stale:
        raise ValueError(f"{len(stale)} models of {out} are not complete with the digest of their weights (e.g. "
                         f"{stale[0]}); rerun `geosharp population pipeline --out {out}`")


def run_pipeline(out, calibrate: dict | None, evaluations: list, reliability: dict | None = None, workers: int = 2,
                 progress: bool = True, log=None) -> dict:
    """Run every stage after training on the population in ``out`` (see the module doc); resumable.

    ``calibrate``: the keyword arguments of :func:`~.calibration.calibrate_population` (None: no calibration);
    ``evaluations``: one dict per evaluation, in order, with the keyword arguments of
    :func:`~.evaluation.plan_evaluation` (``rhos`` … ``curvature_options``, ``tag``) and, with ``calibration:
    True``, its radii from the calibration (:func:`~.calibration.evaluation_radii`, ``sizes`` its columns);
    ``reliability``: ``{"splits", "seed"}`` of :func:`~.reliability.gap_reliability`, computed again from the stored
    predictions whenever every model is complete (its summary goes to ``log``, a text stream; default
    ``reliability.log`` beside it, appended). ``workers`` one-thread processes (1: in this process). Everything is
    checked before anything is written: the manifest (its training may be unfinished), every ``SHA256SUMS``, the
    predictions, an existing calibration against ``calibrate`` (else its probe runs and batch), and every
    evaluation's options, radii and existing settings. Returns ``{"models", "retrained"}`` (counts: every model is
    complete; retrained: those whose weights now are a retrain's, ``retrained.jsonl``)."""
    out = Path(out)
    manifest = read_manifest(out, trained=False)  # the models not trained yet are trained in turn
    tags = [e.get("tag", "") for e in evaluations]
    if len(set(tags)) != len(tags):
        raise ValueError(f"two evaluations of the pipeline have the same tag ({tags}); give each its own --tag")
    n_cal = None if calibrate is None else calibrate.get("models", 3)
    if n_cal is not None and not n_cal <= len(manifest["models"]):
        raise ValueError(f"the calibration's --models {n_cal} exceeds the {len(manifest['models'])} models of {out}")
    check_packed_models(out, manifest)
    read_prediction_records(out / PREDICTIONS, len(test_split(out, manifest).y_test), repair=False)
    if calibrate is not None and (out / CALIBRATION).is_file():
        calibrate_population(out, **calibrate, progress=False)  # the same settings, else refused (nothing written)
    elif calibrate is not None:  # what the calibration reads, checked before the weights of its models are ensured
        read_probe_units(out, "")
        check_bucketable(sharpness_batches(manifest, 1, calibrate.get("batch_size", 32), out),
                         calibrate.get("length_buckets"))
    for e in evaluations:
        _plan(out, manifest, e, calibrate)  # every option and radius checked before anything is written
    with contextlib.ExitStack() as stack:
        busy = f"another `geosharp population pipeline` or `evaluate` is running on {out}; wait for it to finish"
        stack.enter_context(exclusive_lock(out / ".pipeline.lock", busy=busy))
        stack.enter_context(exclusive_lock(out / TRAIN_LOCK, busy=f"`geosharp population train` is training the "
                                                                  f"population in {out}; stop it (the pipeline "
                                                                  f"trains the models left) or wait for it"))
        for tag in tags + _other_tags(out, tags):  # the other evaluations' files are rewritten too (discard_stale)
            stack.enter_context(exclusive_lock(out / f".evaluate{'-' + tag if tag else ''}.lock", busy=busy))
        for entry in manifest["models"]:
            if "dir" in entry:
                restore_swapped(out, entry)  # a retrain killed between its two renames
        for stale in (out / "models").glob(".tmp-*"):  # left by a killed training, rebuild or retrain
            if not _writer_alive(stale):
                shutil.rmtree(stale, ignore_errors=True)
        for path in _owned_files(out, tags) + _other_files(out, tags):  # a torn last line, left by a killed run
            read_jsonl(path, repair=True)
        excluded = read_excluded(out)
        if calibrate is not None and not (out / CALIBRATION).is_file():
            first = manifest["models"][:n_cal]
            if workers > 1 and len(first) > 1:  # trained, rebuilt or retrained side by side
                named = run_in_workers(_ensure_named, [(out, e, tags, progress) for e in first], workers,
                                       lambda _: None,
                                       f"a pipeline process on {out} died (killed, or out of memory?); run "
                                       f"`geosharp population pipeline --out {out}` again", _pipeline_worker)
            else:
                named = [_ensure_named(out, e, tags, progress) for e in first]
            stamps = {name: {STAMP: digest} for name, digest in named}
            calibrate_population(out, **calibrate, progress=progress, stamps=stamps)
        plans = [_plan(out, manifest, e, calibrate) for e in evaluations]
        for plan in plans:
            path = out / population_files(plan["tag"])["config"]
            if not path.is_file():
                write_json_atomic(path, plan["config"])
        todo = [m for m in manifest["models"] if not model_complete(out, m, tags, excluded)]
        from tqdm.auto import tqdm

        bar = tqdm(total=len(manifest["models"]), initial=len(manifest["models"]) - len(todo), desc="pipeline",
                   unit="model", disable=not progress)
        try:
            if workers > 1 and len(todo) > 1:
                run_in_workers(pipeline_model, [(out, m["name"], plans, False) for m in todo], workers,
                               lambda _: bar.update(1),
                               f"a pipeline process on {out} died (killed, or out of memory?); the units it finished "
                               f"are kept: run `geosharp population pipeline --out {out}` again", _pipeline_worker)
            else:
                _in_this_process(out, todo, plans, progress, bar)
        finally:
            bar.close()
        _mark_trained(out)  # where the pipeline trained the last models
        manifest = read_manifest(out)  # the metrics of retrained models
        _check_consistent(out, manifest, tags, excluded)
        _canonical_predictions(out, manifest)
        for tag in tags:
            if finalize_results(out, manifest, tag=tag):
                shutil.rmtree(out / population_files(tag)["units"], ignore_errors=True)
        if reliability is not None:  # from the stored predictions (seconds): always those of the weights now
            with contextlib.ExitStack() as logs:
                stream = log or logs.enter_context(open(out / "reliability.log", "a"))
                gap_reliability(out, **reliability, progress=False, stream=stream, threads=1)
    lines = {(r.get("model"), r.get(STAMP)) for r in read_jsonl(out / RETRAINED) if isinstance(r, dict)}
    retrained = [m for m in manifest["models"] if "dir" in m and (m["name"], weights_digest(out, m)) in lines]
    return dict(models=len(manifest["models"]), retrained=len(retrained))


def _writer_alive(tmp: Path) -> bool:
    """True where the process whose id ends the temporary directory's name (``.tmp-…-PID``) still runs: a
    training not under ``.train.lock`` (an older ``population train``) may be writing it."""
    pid = tmp.name.rsplit("-", 1)[-1]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mark_trained(out: Path) -> None:
    """Once every model of the manifest has its directory, the manifest as ``population train`` ends it: each
    entry's metrics from its record, ``complete`` true (under ``.manifest.lock``; nothing where it is already)."""
    with exclusive_lock(out / _MANIFEST_LOCK, wait=True):
        man = json.loads((out / MANIFEST).read_text())
        if man.get("complete") or not all((out / m["dir"] / RECORD).is_file() for m in man["models"]):
            return
        for m in man["models"]:
            m["metrics"] = _record_metrics(out, m)
        man["complete"] = True
        write_json_atomic(out / MANIFEST, man)


def _canonical_predictions(out: Path, manifest: dict) -> None:
    """``test_predictions.jsonl`` in manifest order (the workers append in the order they finish), as
    ``geosharp population reliability`` writes it: the same bytes however the models were scheduled."""
    lines = {r["model"]: r for r in read_jsonl(out / PREDICTIONS)}
    text = "".join(json.dumps(lines[m["name"]], sort_keys=True) + "\n" for m in manifest["models"])
    if (out / PREDICTIONS).read_text() != text:
        write_text_atomic(out / PREDICTIONS, text)


def _plan(out: Path, manifest: dict, request: dict, calibrate: dict | None) -> dict:
    """The plan of one evaluation (:func:`~.evaluation.plan_evaluation`), checked against its settings file
    ``evaluation[-TAG].json`` where there is one (nothing written). Before the calibration exists, a calibrated
    evaluation is checked on a stand-in grid of the calibration to come (its measures and sizes, each radius 1)."""
    request = dict(request)
    calibration, sizes = request.pop("calibration", False), request.pop("sizes", None)
    cal = None
    if calibration and not (out / CALIBRATION).is_file() and calibrate is not None:
        measures = [m for m in calibrate.get("measures", MEASURES) if not m.endswith("-linearised")]  # as calibrated
        cal = dict(settings=dict(sizes=[float(x) for x in calibrate["sizes"]]),
                   grid={m: [1.0] * len(calibrate["sizes"]) for m in measures})
    rhos, sizes = evaluation_radii(out, request.get("measures"), request.pop("rhos", None), calibration, sizes, cal)
    plan, _ = plan_evaluation(out, manifest, rhos=rhos, sizes=sizes, **request)
    files = population_files(plan["tag"])
    if cal is None:
        check_settings_file(out / files["config"], plan["config"], out, files)
    elif (out / files["config"]).is_file():  # the radii are not known yet: every other setting must agree
        old = read_json_object(out / files["config"], "evaluation settings")
        if {k: v for k, v in old.items() if k != "rho_grid"} != {k: v for k, v in plan["config"].items()
                                                                 if k != "rho_grid"}:
            check_settings_file(out / files["config"], plan["config"], out, files)  # refused, naming both
    return plan
