"""Evaluate a population: sharpness of every model, appended durably; resumable and torchrun-aware.

Resumability: ``evaluate`` appends each model's result line with one ``os.write`` + ``os.fsync`` as soon as
it is computed, truncates a torn last line on restart and skips models already present, so a kill at any
moment loses at most the model in progress and never duplicates one. Under ``torchrun`` (``WORLD_SIZE`` >
1) ranks take disjoint shards of the pending models (:mod:`geosharp_ref.distributed`) and rank 0 merges
everything into ``results.jsonl`` in manifest order, byte-identical to a single-process run.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
import warnings
from pathlib import Path

import torch

from ... import distributed as gdist
from ...forward import batch_to_device, model_device, padded_extent
from ...io.data import check_inputs_fit, load_data, split_batches
from ...io.durable import append_line, exclusive_lock, fsync_dir, read_jsonl, write_json_atomic
from ...io.models import load_model
from ...sharpness.measures import ABLATION_MEASURES, HEADLINE_MEASURES, LINEARISED_MEASURES
from ...sharpness.measures import AVERAGE_MEASURES, CURVATURE_MEASURES, EXACT_GEODESIC_MEASURES
from ...sharpness import at_theta
from ...sharpness.measures import MEASURES as NAMED_MEASURES
from ...sharpness.pipeline import linearised_at
from ...symmetry import symmetry_map as build_symmetry_map
from .exclusion import read_excluded
from .importing import load_imported_model
from .manifest import population_files, read_json_object, read_manifest
from .options import check_curvature_options, check_evaluation
from .pack import check_packed_models, is_packed, rebuild_model
from .tasks import get_task

__all__ = ["measure_grid", "evaluation_grid", "sharpness_batches", "LINEARISED", "load_population_model",
           "evaluate_model", "evaluate_population", "plan_evaluation", "evaluate_entry", "check_settings_file",
           "finalize_results", "read_results", "NonFiniteUnitError", "rho_key", "MEASURES",
           "ABLATIONS", "ALL_MEASURES", "DEFAULT_RHOS"]

#: the paper's three measures, the default of an evaluation
MEASURES = tuple(m.name for m in HEADLINE_MEASURES)
#: the ablations (paper App. G): no second-order correction, or the Frobenius norm on the pairs
ABLATIONS = tuple(m.name for m in ABLATION_MEASURES)
#: ρ times the dual norm of the gradient in each geometry (one gradient per batch)
LINEARISED = tuple(m.name for m in LINEARISED_MEASURES)
#: exact-geodesic and average-case measures (issue 27: sharpness/exact_geodesic.py, average_case.py)
EXACT_AND_AVERAGE = tuple(m.name for m in EXACT_GEODESIC_MEASURES + AVERAGE_MEASURES)
#: Hessian trace and top eigenvalue, quotient and Euclidean (issue 27: sharpness/curvature.py; ρ unused)
CURVATURE = tuple(m.name for m in CURVATURE_MEASURES)
ALL_MEASURES = MEASURES + ABLATIONS + LINEARISED + EXACT_AND_AVERAGE + CURVATURE
DEFAULT_RHOS = (0.003, 0.01, 0.03, 0.1)


def rho_key(rho) -> str:
    """The key of a radius in result files (``f"{rho:g}"``)."""
    return f"{float(rho):g}"


def evaluation_grid(config: dict) -> tuple[list, dict]:
    """``(rows, {measure: [rho_key per row]})`` of an evaluation's settings: the rows are the radii of a
    uniform sweep (``config["rhos"]``), or the columns of a per-measure grid (``config["rho_grid"]``),
    labelled by their target relative size where ``config["sizes"]`` names it."""
    if "rho_grid" in config:
        grid = config["rho_grid"]
        k = len(next(iter(grid.values())))
        sizes = config.get("sizes")
        rows = [f"size={sizes[i]:g}" if sizes else f"grid[{i}]" for i in range(k)]
        return rows, grid
    return list(config["rhos"]), {m: list(config["rhos"]) for m in config["measures"]}


def sharpness_batches(manifest, n_batches: int, batch_size: int, root=None):
    """The fixed sharpness batches: ``pool[:n_batches · batch_size]`` with clean labels, in order.

    For an imported population (``plan.data.dataset == "file"``) the examples are the first
    ``n_batches · batch_size`` of the local data file (:func:`geosharp_ref.io.data.load_data`)."""
    spec = manifest["plan"]["data"]
    if spec["dataset"] == "file":
        inputs, targets, _ = load_data(spec["path"])
        source = f"data file {spec['path']!r}"
    else:
        split = get_task(manifest["plan"]["task"]).load_split(spec, root)
        inputs, targets, source = split.pool, split.y_pool, "the training pool"
    return split_batches(inputs, targets, n_batches, batch_size, source)


def settings_digest(config: dict) -> str:
    """A short digest of an evaluation's settings (``evaluation.json``): units measured under others are not
    reused."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def read_units(out: Path, files: dict, digest: str, repair: bool = True) -> dict:
    """``{(model, measure, rho_key): unit}`` of every ``results.units/rank*.jsonl`` line measured under the settings
    ``digest`` (first wins); a line that is not a unit is refused, naming it. ``repair``: truncate a torn last line
    on disk (an evaluation starting); a reader beside a running evaluation (``population status``) passes False and
    only skips it."""
    units = {}
    for path in sorted((out / files["units"]).glob("rank*.jsonl")):
        for i, u in enumerate(read_jsonl(path, repair=repair), start=1):
            if not (isinstance(u, dict) and all(isinstance(u.get(k), str) for k in ("model", "measure", "rho",
                                                                                     "settings"))
                    and isinstance(u.get("per_batch"), list) and "value" in u and "loss" in u):
                raise ValueError(f"{path}: line {i} is not a finished measure of a model (a JSON object with 'model', "
                                 f"'measure', 'rho', 'settings', 'value', 'per_batch', 'loss'); delete that line (the "
                                 f"measure is evaluated again) or the file")
            if u["settings"] == digest:
                unit = {k: u[k] for k in ("value", "per_batch", "loss", "relative_size", "errors", "seconds")
                        if k in u}  # seconds: for `population status` only, never in a record
                units.setdefault((u["model"], u["measure"], u["rho"]), unit)
    return units


def check_bucketable(batches, length_buckets) -> None:
    """With ``length_buckets``, every sharpness batch is padded text with its mask (else refused, before any
    settings are written)."""
    if length_buckets is not None:
        for inputs, targets in batches:
            padded_extent(inputs, targets)


def load_population_model(out, entry: dict, progress: bool = True):
    """Load one manifest entry: a trained model directory (a packed one rebuilt first,
    :func:`geosharp_ref.studies.population.pack.rebuild_model`, which says so on stderr where ``progress``), or an
    imported model (``entry["loader"]``)."""
    if "loader" in entry:
        return load_imported_model(entry)
    if is_packed(Path(out) / entry["dir"]):
        rebuild_model(out, entry, progress)
    return load_model(Path(out) / entry["dir"])


def measure_grid(measures, rhos) -> dict:
    """``{measure: [ρ, …]}``: ``rhos`` is one list for every measure, or already a dict per measure."""
    if isinstance(rhos, dict):
        missing = [m for m in measures if m not in rhos]
        if missing:
            raise ValueError(f"the ρ grid has no radii for {missing}; give every measure its radii")
        return {m: [float(r) for r in rhos[m]] for m in measures}
    return {m: [float(r) for r in rhos] for m in measures}


def evaluate_model(model, batches, rhos, measures=MEASURES, n_iter: int = 20, seed: int = 0,
                   length_buckets: int | None = None, done: dict | None = None, on_unit=None,
                   curvature_options: dict | None = None) -> dict:
    """``{"values": {measure: {rho_key: mean sharpness}}, "per_batch": {measure: {rho_key: [sharpness of each
    batch]}}, "relative_size": {measure: {rho_key: median ‖Δθ‖/‖θ‖ over the batches}}, "loss", "heads"}``
    (deterministic; the mean in ``values`` is the mean of ``per_batch``).

    ``rhos``: one list of radii for every measure, or ``{measure: [radii]}`` (a grid per measure, e.g.
    matched in perturbation size). ``measures`` from :data:`ALL_MEASURES`: ``adaptive``,
    ``geodesic-{inv,mix}``, the ablations ``geodesic-{inv,mix}-first-order`` (no γ̈ correction) and
    ``geodesic-{inv,mix}-frobenius`` (Frobenius norm on the pair components), and the first-order measures
    ``*-linearised`` (ρ times the dual norm of the gradient, one gradient per batch for all its radii:
    :func:`~geosharp_ref.sharpness.pipeline.linearised_at`; no relative size), and the curvature measures
    ``hessian-*`` (ρ unused; their per-batch Hutchinson standard errors or Lanczos residual bounds in
    ``"errors": {measure: {rho_key: [...]}}``). ``length_buckets`` K: each
    padded text batch evaluated in K groups of similar length (:func:`geosharp_ref.forward.length_buckets`).
    ``curvature_options`` (``probes``, ``steps``, ``trace_method``) go to the curvature measures alone (their
    defaults: 16 Hutchinson probes, 20 Lanczos steps).

    Resuming inside a model: ``done`` holds units already measured, ``{(measure, rho_key): unit}`` with unit
    ``{"value", "per_batch", "loss"[, "relative_size"]}``; they are not measured again (every unit is measured
    on its own, seeded by ``seed``, so the record equals the uninterrupted one). ``on_unit(measure, rho_key,
    unit)`` is called after each unit measured (the unit with its ``seconds``). A unit whose value, per-batch
    value or loss is not finite is refused (:class:`NonFiniteUnitError`, before ``on_unit``): the evaluation
    stops at that model, not at the correlation after all of them.

    The units run inside :func:`geosharp_ref.sharpness.at_theta.keeping` (nothing here changes the model between
    them), on the batches moved to the model's device once: what each unit computes at θ alone (the buckets,
    their check, the Auto-PGD and first-order units' losses and gradients at θ) is computed once per model, with
    the same values."""
    device = model_device(model)
    batches = [batch_to_device(b, device) for b in batches]  # once: every unit then sees the same tensors
    with at_theta.keeping(model):
        return _evaluate_units(model, batches, rhos, measures, n_iter, seed, length_buckets, done, on_unit,
                               curvature_options)


class NonFiniteUnitError(ValueError):
    """A unit (measure, radius) whose value, a per-batch value or the loss at θ is not finite: nothing of it is
    written, and the evaluation stops at its model rather than after every model. The message names the model
    (where the population evaluation adds it), the measure and the radius, and no value (a blind study reads
    none); :mod:`~geosharp_ref.studies.population.exclusion` leaves the model out where the study decides so."""

    def __init__(self, measure: str, rho_key: str, model: str | None = None, fix: str = ""):
        self.measure, self.rho_key, self.model, self.fix = measure, rho_key, model, fix
        where = f"{model}: " if model else ""
        super().__init__(f"{where}{measure} at ρ = {rho_key} is not finite on this model; nothing of it was written"
                         + (f"; {fix}" if fix else " (a rerun measures it again)"))

    def __reduce__(self):  # pickled (e.g. from a worker process) with its fields, not its message
        return type(self), (self.measure, self.rho_key, self.model, self.fix)


def _evaluate_units(model, batches, rhos, measures, n_iter, seed, length_buckets, done, on_unit,
                    curvature_options) -> dict:
    grid = measure_grid(measures, rhos)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        smap = build_symmetry_map(model)
    values, per_batch, sizes, errors, loss = {}, {}, {}, {}, None
    first_order = {}  # measure → its first-order result at the first radius measured here
    for measure in measures:
        values[measure], per_batch[measure], sizes[measure] = {}, {}, {}
        m = NAMED_MEASURES[measure]
        for rho in grid[measure]:
            key = rho_key(rho)
            unit = (done or {}).get((measure, key))
            if unit is None:
                if measure in first_order:  # ρ‖∇L‖_* is linear in ρ: the gradients of its first radius serve all
                    r = linearised_at(first_order[measure], rho)
                else:
                    r = m.evaluate(model, batches, rho, n_iter=n_iter, seed=seed, length_buckets=length_buckets,
                                   **({} if m.metric is None else {"symmetry_map": smap}),
                                   **((curvature_options or {}) if m.curvature is not None else {}))
                    if m.linearised:
                        first_order[measure] = r
                if not all(math.isfinite(v) for v in [r.mean, *r.per_batch, *r.loss_before]):
                    raise NonFiniteUnitError(measure, key)
                unit = dict(value=r.mean, per_batch=[float(v) for v in r.per_batch],
                            loss=sum(r.loss_before) / len(r.loss_before))
                if r.relative_size:
                    unit["relative_size"] = r.median_relative_size
                if (r.config or {}).get("errors"):  # curvature: Hutchinson standard errors / Lanczos bounds
                    unit["errors"] = [float(e) for e in r.config["errors"]]
                if on_unit is not None:  # the unit's time goes to the units file only (population status), not
                    on_unit(measure, key, dict(unit, seconds=round(float(r.seconds), 3)))  # into the record
            values[measure][key] = unit["value"]
            per_batch[measure][key] = unit["per_batch"]
            if "relative_size" in unit:
                sizes[measure][key] = unit["relative_size"]
            if "errors" in unit:
                errors.setdefault(measure, {})[key] = unit["errors"]
            loss = unit["loss"]
    out = dict(values=values, per_batch=per_batch, loss=loss, heads=sum(g.num_heads for g in smap.groups))
    if any(sizes.values()):
        out["relative_size"] = {k: v for k, v in sizes.items() if v}
    if errors:
        out["errors"] = errors
    return out


def read_results(out, tag: str = "") -> dict:
    """``{model name: record}`` from ``results.jsonl`` and any per-rank part files (first wins); a line that is
    not a result record (a JSON object with a ``model`` name and its ``values``) is refused, naming it."""
    out, f = Path(out), population_files(tag)
    files = [out / f["results"]] + sorted((out / f["parts"]).glob("rank*.jsonl"))
    recs = {}
    for f in files:
        for i, r in enumerate(read_jsonl(f), start=1):
            if not (isinstance(r, dict) and isinstance(r.get("model"), str) and isinstance(r.get("values"), dict)):
                got = sorted(r) if isinstance(r, dict) else type(r).__name__
                raise ValueError(f"{f}: record {i} is not a result line (expected a JSON object with 'model' and "
                                 f"'values', got {got}); delete that line (its model is evaluated again) or the "
                                 f"file")
            recs.setdefault(r["model"], r)
    return recs


def read_evaluation_settings(out, tag: str = "") -> dict:
    """The settings of an evaluation (``evaluation.json``), checked: measures and their radii."""
    out = Path(out)
    path = out / population_files(tag)["config"]
    fix = (f"delete it and {out / population_files(tag)['results']} and run `geosharp population evaluate --out "
           f"{out}{f' --tag {tag}' if tag else ''}` again")
    cfg = read_json_object(path, "evaluation settings", ("measures",), fix)
    grid_ok = (isinstance(cfg.get("rho_grid"), dict) and all(isinstance(cfg["rho_grid"].get(m), list)
                                                             for m in cfg["measures"])
               and len({len(v) for v in cfg["rho_grid"].values()}) == 1)
    if not (isinstance(cfg["measures"], list) and cfg["measures"]
            and (grid_ok or (isinstance(cfg.get("rhos"), list) and cfg["rhos"]))):
        raise ValueError(f"{path} does not hold evaluation settings (a 'measures' list and 'rhos', or a 'rho_grid' "
                         f"with the same number of radii per measure); {fix}")
    return cfg


def finalize_results(out: Path, manifest, extra=(), tag: str = "") -> bool:
    """Rank 0: canonical ``results.jsonl`` (manifest order, one line per model) once every model not excluded has
    its record (a record of an excluded model measured before its exclusion is kept); parts removed."""
    recs, files = read_results(out, tag), population_files(tag)
    for r in extra:
        recs.setdefault(r["model"], r)
    names, excluded = [m["name"] for m in manifest["models"]], read_excluded(out)
    if not all(n in recs for n in names if n not in excluded):
        return False
    text = "".join(json.dumps(recs[n], sort_keys=True) + "\n" for n in names if n in recs)
    path = out / files["results"]
    if not path.is_file() or path.read_text() != text:
        tmp = out / f".{files['results']}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(out)
    if (out / files["parts"]).is_dir():
        shutil.rmtree(out / files["parts"], ignore_errors=True)
    return True


def evaluate_population(out, rhos=DEFAULT_RHOS, measures=MEASURES, n_batches: int = 4, batch_size: int = 32,
                        n_iter: int = 20, seed: int = 0, threads: int | None = 1, progress: bool = True,
                        device=None, tag: str = "", sizes=None, length_buckets: int | None = None,
                        curvature_options: dict | None = None) -> dict:
    """Sharpness of every model of the population in ``out`` (resumable; torch.distributed-aware).

    ``rhos`` is one list of radii for every measure, or a grid ``{measure: [radii]}``; with a grid,
    ``sizes`` may name what its columns are matched to (the target relative perturbation sizes of
    :func:`geosharp_ref.studies.population.calibration.calibrate_population`), stored with the settings.
    ``length_buckets`` K (stored with the settings): padded text evaluated in K groups of similar length.
    ``curvature_options`` (``{"probes", "steps", "trace_method"}``; stored with the settings where given): the
    curvature measures' matvecs, Lanczos steps and trace estimator (:func:`.options.check_curvature_options`).
    Returns ``{model name: record}`` (on every rank, read back from disk after the merge), without the models left
    out of the evaluations (:mod:`.exclusion`)."""
    out, files = Path(out), population_files(tag)
    rank, world = gdist.rank_world()
    # everything is read and checked before anything is written: the batches, the results so far, the settings
    plan, batches = plan_evaluation(out, None, rhos, measures, n_batches, batch_size, n_iter, seed, threads, tag,
                                    sizes, length_buckets, curvature_options)
    measures, grid, config, curvature_options = plan["measures"], plan["grid"], plan["config"], plan["curvature"]
    manifest = read_manifest(out)
    if world == 1:
        check_settings_file(out / files["config"], config, out, files)
    # one evaluation of a tag at a time; under torchrun rank 0 holds the lock (a rank that fails ends the others)
    with exclusive_lock(out / f".evaluate{'-' + tag if tag else ''}.lock", enabled=(rank == 0),
                        busy=f"another `geosharp population evaluate` is running on {out}"
                             f"{f' (tag {tag!r})' if tag else ''}; wait for it to finish (its results are kept "
                             f"and this one would only repeat them), or use another --tag"):
        return _evaluate_population(out, files, manifest, rank, world, grid, config, batches, measures, n_batches,
                                    batch_size, n_iter, seed, threads, progress, device, tag, length_buckets,
                                    curvature_options)


def plan_evaluation(out, manifest, rhos=DEFAULT_RHOS, measures=MEASURES, n_batches: int = 4, batch_size: int = 32,
                    n_iter: int = 20, seed: int = 0, threads: int | None = 1, tag: str = "", sizes=None,
                    length_buckets: int | None = None, curvature_options: dict | None = None) -> tuple[dict, list]:
    """``(plan, batches)`` of one evaluation of the population in ``out`` (the options of
    :func:`evaluate_population`, checked, and nothing written): ``plan`` holds ``measures``, ``grid`` (radii per
    measure), ``config`` (the settings ``evaluation.json`` records), ``curvature`` (the curvature options, None for
    the defaults), ``iters``, ``seed``, ``length_buckets``, ``tag``; ``batches`` the fixed sharpness batches. The
    options are checked first, then the ``manifest`` (read here where None), its packed models' sums, the results
    and units so far and ``excluded.json``."""
    check_evaluation(rhos, measures, n_batches, batch_size, n_iter, seed, threads, sizes,
                     known_measures=ALL_MEASURES, length_buckets=length_buckets)
    curvature_options = check_curvature_options(measures, curvature_options)
    manifest = read_manifest(out) if manifest is None else manifest
    measures = tuple(measures)
    grid, config = _settings(rhos, measures, n_batches, batch_size, n_iter, seed, sizes, length_buckets)
    if curvature_options:  # only where given: an evaluation with the defaults keeps its settings (and digest)
        config["curvature"] = dict(curvature_options)
    batches = sharpness_batches(manifest, n_batches, batch_size, out)
    check_bucketable(batches, length_buckets)
    check_packed_models(out, manifest)
    files = population_files(tag)
    read_results(out, tag)
    read_units(out, files, settings_digest(config), repair=False)  # repaired inside the lock (a run may be appending)
    read_excluded(out)  # a damaged excluded.json is refused before evaluation.json is written
    plan = dict(measures=measures, grid=grid, config=config, curvature=curvature_options or None, iters=n_iter,
                seed=seed, length_buckets=length_buckets, tag=tag)
    return plan, batches


def evaluate_entry(out, entry: dict, batches, plan: dict, gap: float, device=None, done: dict | None = None,
                   on_unit=None, progress: bool = True) -> dict:
    """The result record of one manifest ``entry`` under an evaluation ``plan`` (:func:`plan_evaluation`):
    ``{"model", "gap", **evaluate_model(...)}``, the model loaded (:func:`load_population_model`) onto ``device``
    and checked to fit the sharpness inputs; ``done`` and ``on_unit`` as for :func:`evaluate_model`. A unit that is
    not finite stops here, naming the model (:class:`NonFiniteUnitError`)."""
    model = load_population_model(out, entry, progress)
    if device is not None:
        model = model.to(device)
    for inputs, _ in batches[:1]:  # an imported model and the data file must fit (token ids, lengths)
        check_inputs_fit(model, inputs, f"the sharpness examples of {out} for {entry['name']}")
    try:
        res = evaluate_model(model, batches, plan["grid"], plan["measures"], n_iter=plan["iters"], seed=plan["seed"],
                             length_buckets=plan["length_buckets"], done=done, on_unit=on_unit,
                             curvature_options=plan["curvature"])
    except NonFiniteUnitError as exc:
        raise NonFiniteUnitError(exc.measure, exc.rho_key, entry["name"], fix=(
            f"the study decides how it is treated; to leave it out of every evaluation, `geosharp population "
            f"exclude --out {out} --model {entry['name']} --reason TEXT`, then run this evaluation again (it "
            f"resumes)")) from None
    return dict(model=entry["name"], gap=gap, **res)


def _settings(rhos, measures, n_batches, batch_size, n_iter, seed, sizes, length_buckets=None) -> tuple:
    """``(grid, settings)``: the radii per measure and the settings ``evaluation.json`` records."""
    grid = measure_grid(measures, rhos)
    config = dict(measures=list(measures), batches=n_batches, batch_size=batch_size, iters=n_iter, seed=seed,
                  labels="clean", subset="pool[:batches*batch_size]")
    if isinstance(rhos, dict):
        lengths = {len(v) for v in grid.values()}
        if len(lengths) != 1:
            raise ValueError(f"a ρ grid needs the same number of radii for every measure, got {rhos}")
        config["rho_grid"] = {m: [rho_key(r) for r in grid[m]] for m in measures}
        if sizes is not None:
            config["sizes"] = [float(x) for x in sizes]
    else:
        config["rhos"] = [rho_key(r) for r in grid[measures[0]]]
    if length_buckets is not None:
        config["length_buckets"] = int(length_buckets)
    return grid, config


def check_settings_file(cpath: Path, config: dict, out: Path, files: dict) -> None:
    """Refuse to resume an evaluation whose ``evaluation.json`` holds other settings."""
    if not cpath.is_file():
        return
    try:
        old = json.loads(cpath.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{cpath} is not valid JSON ({exc}); delete it and {out / files['results']} to start "
                         f"over") from None
    if old != config:
        raise ValueError(f"{cpath} holds other evaluation settings ({old}); use the same options to "
                         f"resume, use another --tag, or delete {cpath} and {out / files['results']} to start over")


def _evaluate_population(out, files, manifest, rank, world, grid, config, batches, measures, n_batches, batch_size,
                         n_iter, seed, threads, progress, device, tag, length_buckets=None, curvature_options=None):
    if threads:
        torch.set_num_threads(threads)
    if device is None:
        device = gdist.default_device()
    cpath = out / files["config"]
    error = None
    if rank == 0:
        try:
            check_settings_file(cpath, config, out, files)
        except ValueError as exc:
            error = str(exc)
        if error is None and not cpath.is_file():
            write_json_atomic(cpath, config)
    error = gdist.broadcast_object(error)  # every rank stops together (no rank left in a barrier)
    if error:
        raise ValueError(error)

    if world > 1:
        (out / files["parts"]).mkdir(exist_ok=True)
        mine_path = out / files["parts"] / f"rank{rank}.jsonl"
        read_jsonl(mine_path, repair=True)
    else:
        mine_path = out / files["results"]
    read_jsonl(out / files["results"], repair=(rank == 0))
    done = read_results(out, tag) if rank == 0 else None
    # one view for every rank: the models done, and those left out of the evaluations (excluded.json)
    done_names, excluded = gdist.broadcast_object((sorted(done), sorted(read_excluded(out))) if rank == 0 else None)
    pending = [m for m in manifest["models"] if m["name"] not in set(done_names) | set(excluded)]
    mine = gdist.shard(pending, rank, world)
    outside = [m["name"] for m in manifest["models"]
               if (m["metrics"].get("train_examples") or math.inf) < n_batches * batch_size]
    if outside and rank == 0:
        warnings.warn(f"{len(outside)} models trained on fewer than the {n_batches * batch_size} sharpness "
                      f"examples (e.g. {outside[0]}): for them part of the sharpness subset is not training "
                      f"data; lower --batches or --batch-size", stacklevel=2)

    from tqdm.auto import tqdm

    digest = settings_digest(config)
    done_units = read_units(out, files, digest)  # a killed run resumes inside a model
    units_path = out / files["units"] / f"rank{rank}.jsonl"
    n_units = sum(len(v) for v in grid.values())
    new = []
    bar = tqdm(mine, desc=f"evaluate (rank {rank}/{world})" if world > 1 else "evaluate population",
               unit="model", disable=not progress, position=rank if world > 1 else None)
    plan = dict(measures=measures, grid=grid, iters=n_iter, seed=seed, length_buckets=length_buckets,
                curvature=curvature_options)
    for m in bar:
        t0 = time.perf_counter()
        done = {(ms, r): u for (name, ms, r), u in done_units.items() if name == m["name"]}

        def finished(measure, key, unit, name=m["name"]):
            units_path.parent.mkdir(exist_ok=True)
            append_line(units_path, dict(model=name, measure=measure, rho=key, settings=digest, **unit))
            done[measure, key] = unit
            bar.set_postfix_str(f"{name} {len(done)}/{n_units} {measure} ρ={key}")

        rec = evaluate_entry(out, m, batches, plan, m["metrics"]["gap"], device, done, finished, progress)
        append_line(mine_path, rec)
        new.append(rec)
        bar.set_postfix_str(f"{m['name']} {time.perf_counter() - t0:.1f}s")
    bar.close()
    gathered = gdist.gather_objects(new)  # rank 0: every rank's new records (no shared disk needed)
    if rank == 0 and finalize_results(out, manifest, extra=[r for part in gathered for r in part], tag=tag):
        shutil.rmtree(out / files["units"], ignore_errors=True)  # every model's record is whole now
    gdist.barrier()
    return {n: r for n, r in read_results(out, tag).items() if n not in excluded}  # a kept record is not used
