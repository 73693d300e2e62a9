"""Matched perturbation size: choose ρ per measure so that the relative weight change is equal across measures.

At one ρ, measures perturb the weights by very different amounts (on MiniLM fine-tunes the inv and mix
balls move the weights several times further than the adaptive ball), so τ at one raw ρ does not compare
like with like. Calibration fixes, before any τ is computed, a grid of radii per measure whose columns are
matched in size:

1. on the first ``models`` models of the population (manifest order) and the first sharpness batch, each
   measure's Auto-PGD maximiser is found at two probe radii ρ₁ < ρ₂ (``probe_rhos``), and its relative
   size s = ‖Δθ‖/‖θ‖ (Δθ = γ_ξ(1) − θ over every parameter) is measured;
2. per measure, log s is fitted as a line in log ρ through the medians over the models at the two probes;
3. for every target size sᵢ (``sizes``) the measure's radius is the ρ where the fit reaches sᵢ.

The result (``calibration.json``: the probes, the fit and the grid ``{measure: [ρ per size]}``) is what
``geosharp population evaluate --calibration`` evaluates; every record then also holds the measured median
size, so the correlation reports how well the columns are matched across the whole population.
First-order measures (``*-linearised``) use the radii of the measure they linearise, and the paper's
ablations (``geodesic-*-first-order``, ``geodesic-*-frobenius``, App. G) the radii of the measure they
ablate, unless they were calibrated themselves: an ablation changes one ingredient at the same ρ.
``calibrated_grid(..., sizes=…)`` keeps only some target sizes' columns (e.g. the ablations at the larger
size alone).

Resumability: each probe run is appended to ``calibration.units.jsonl`` (model, measure, ρ, the settings'
digest, its size) with one ``os.write`` + ``os.fsync`` as it finishes, so a killed calibration resumes after
its last finished run and loses at most the run in progress (the sizes, and so the fit, are those of an
uninterrupted run). Runs measured under other settings are not reused. The file is removed once
``calibration.json`` is written.
"""
from __future__ import annotations

import contextlib
import math
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from ...io.durable import append_line, exclusive_lock, read_jsonl, write_json_atomic
from ...sharpness.measures import MEASURES as NAMED_MEASURES
from ...sharpness.pipeline import MAX_RHO
from ...sharpness import at_theta, get_measure, rho_for_size
from ...symmetry import symmetry_map as build_symmetry_map
from .evaluation import (MEASURES, check_bucketable, load_population_model, rho_key, settings_digest,
                         sharpness_batches)
from .manifest import read_json_object, read_manifest
from .pack import check_packed_models
from .options import check_calibration

__all__ = ["calibrate_population", "evaluation_radii", "read_calibration", "read_probe_units", "calibrated_grid",
           "radius_source", "CALIBRATION", "CALIBRATION_UNITS"]

CALIBRATION = "calibration.json"
#: the finished probe runs of a calibration in progress (removed once calibration.json is written)
CALIBRATION_UNITS = "calibration.units.jsonl"


def radius_source(measure: str, grid: dict) -> str:
    """The calibrated measure whose radii ``measure`` uses: itself if calibrated, else the headline measure it
    derives from (``geodesic-mix-frobenius`` → ``geodesic-mix``, ``adaptive-linearised`` → ``adaptive``)."""
    return measure if measure in grid else get_measure(measure).base


def calibrated_grid(calibration: dict, measures, sizes=None) -> dict:
    """``{measure: [ρ per target size]}`` for ``measures`` (a derived measure takes its base's radii).

    ``sizes`` (a subset of the calibrated target sizes) keeps only those columns, in the given order."""
    grid = calibration["grid"]
    missing = sorted({radius_source(m, grid) for m in measures} - set(grid))
    if missing:
        raise ValueError(f"the calibration has no radii for {missing}; calibrate with these measures "
                         f"(geosharp population calibrate --measures …)")
    columns = range(len(calibration["settings"]["sizes"]))
    if sizes is not None:
        calibrated = [float(s) for s in calibration["settings"]["sizes"]]
        columns = []
        for s in sizes:
            hits = [i for i, c in enumerate(calibrated) if math.isclose(float(s), c, rel_tol=1e-9)]
            if not hits:
                raise ValueError(f"size {s:g} was not calibrated; choose from "
                                 f"{', '.join(f'{c:g}' for c in calibrated)}")
            columns.append(hits[0])
    return {m: [float(grid[radius_source(m, grid)][i]) for i in columns] for m in measures}


def evaluation_radii(out, measures, rhos=None, calibration: bool = False, sizes=None,
                     cal: dict | None = None) -> tuple:
    """``(rhos, sizes)`` an evaluation runs at (``geosharp population evaluate``): ``rhos`` as given, or with
    ``calibration`` the calibrated grid of ``measures`` (:func:`calibrated_grid`, only the columns of ``sizes`` where
    given) and the target sizes of its columns, from ``cal`` (default: ``calibration.json`` of ``out``)."""
    if sizes and not calibration:
        raise ValueError("--sizes picks columns of the calibrated grid; add --calibration (or use --rho)")
    if not calibration:
        return rhos, None
    cal = read_calibration(out) if cal is None else cal
    return calibrated_grid(cal, measures, sizes=sizes), sizes or cal["settings"]["sizes"]


def read_calibration(out) -> dict:
    """``calibration.json`` of the population in ``out``, checked: its settings' target sizes and a grid
    ``{measure: [ρ per size]}`` of positive radii, none above :data:`~geosharp_ref.sharpness.pipeline.MAX_RHO`."""
    path = Path(out) / CALIBRATION
    fix = f"delete it and run `geosharp population calibrate --out {out} --sizes …` again"
    cal = read_json_object(path, "calibration", ("settings", "grid"), fix,
                           missing=f"run `geosharp population calibrate --out {out} --sizes …` first")
    settings, grid = cal["settings"], cal["grid"]
    sizes = settings.get("sizes") if isinstance(settings, dict) else None
    if not (isinstance(sizes, list) and sizes and all(isinstance(x, (int, float)) for x in sizes)):
        raise ValueError(f"{path}: 'settings' must hold the calibrated target sizes ('sizes', a list of numbers); "
                         f"{fix}")
    ok = isinstance(grid, dict) and grid and all(
        isinstance(rs, list) and len(rs) == len(sizes)
        and all(isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) and 0 < r <= MAX_RHO
                for r in rs)
        for rs in grid.values())
    if not ok:
        raise ValueError(f"{path}: 'grid' must map every calibrated measure to {len(sizes)} positive radii of at "
                         f"most {MAX_RHO:g} (one per target size); {fix}")
    return cal


def calibrate_population(out, sizes, measures=MEASURES, models: int = 3, batch_size: int = 32,
                         probe_rhos=(0.01, 0.03), n_iter: int = 10, seed: int = 0, threads: int | None = 1,
                         progress: bool = True, length_buckets: int | None = None, stamps: dict | None = None) -> dict:
    """Fit ρ ↦ ‖Δθ‖/‖θ‖ per measure on a few models and write ``calibration.json`` (see the module doc).
    ``length_buckets`` K (recorded in the settings): padded text evaluated in K groups of similar length.
    ``stamps`` (``{model name: fields}``, the per-model pipeline's weights digests): added to each probe run's line.

    Returns the calibration. An existing calibration with the same settings is returned unchanged; one
    with other settings is refused (it fixes the protocol of evaluations already run)."""
    out = Path(out)
    check_calibration(sizes, models, batch_size, probe_rhos, n_iter, seed, length_buckets)
    sizes = [float(s) for s in sizes]
    probes = sorted(float(r) for r in probe_rhos)
    measures = [m for m in measures if not m.endswith("-linearised")]
    unknown = sorted(set(measures) - set(NAMED_MEASURES))
    if unknown:
        raise ValueError(f"unknown measures {unknown}; choose from {list(NAMED_MEASURES)}")
    manifest = read_manifest(out, trained=False)  # only its first `models` models need be trained
    if models < 1 or models > len(manifest["models"]):
        raise ValueError(f"--models must lie in [1, {len(manifest['models'])}], got {models}")
    settings = dict(sizes=sizes, measures=measures, models=models, batch_size=batch_size, probe_rhos=probes,
                    iters=n_iter, seed=seed, batch="pool[:batch_size] (the first sharpness batch)")
    if length_buckets is not None:
        settings["length_buckets"] = int(length_buckets)
    path = out / CALIBRATION
    done = _existing_calibration(out, settings)
    if done is not None:
        return done
    untrained = [m["name"] for m in manifest["models"][:models] if "dir" in m and not (out / m["dir"]).is_dir()]
    if untrained:
        raise ValueError(f"the calibration's models {untrained} are not trained yet; let `geosharp population train "
                         f"--out {out}` train them (or run `geosharp population pipeline`, which trains them first)")
    read_probe_units(out, settings_digest(settings))  # a damaged units file is refused before anything is written
    check_packed_models(out, manifest)  # and so is a packed model's damaged SHA256SUMS
    (batch,) = sharpness_batches(manifest, 1, batch_size, out)
    check_bucketable([batch], length_buckets)
    with exclusive_lock(out / ".calibrate.lock", busy=f"another `geosharp population calibrate` is running on {out}; "
                        f"wait for it to finish (its probe runs are kept and this one would only repeat them)"):
        done = _existing_calibration(out, settings)  # finished while this one waited for the lock
        if done is not None:
            return done
        entries = manifest["models"][:models]
        measured, seconds = _probe_sizes(out, entries, batch, settings, measures, probes, n_iter, seed, threads,
                                         progress, length_buckets, stamps or {})
        calibration = _fit(settings, measured, probes, sizes)
        calibration.update(models_used=[e["name"] for e in entries], seconds=round(seconds, 1))
        if stamps:  # the weights each model had (population pipeline): a later retrain leaves the radii as they are
            calibration["stamps"] = {e["name"]: stamps[e["name"]] for e in entries if e["name"] in stamps}
        write_json_atomic(path, calibration)
        (out / CALIBRATION_UNITS).unlink(missing_ok=True)  # every probe run is in calibration.json now
    return calibration


def _existing_calibration(out: Path, settings: dict) -> dict | None:
    """The calibration in ``out`` if it has ``settings``; None if there is none; another one is refused."""
    if not (out / CALIBRATION).is_file():
        return None
    old = read_calibration(out)
    if old.get("settings") == settings:
        return old
    raise ValueError(f"{out / CALIBRATION} holds another calibration ({old.get('settings')}); it fixes the radii of "
                     f"evaluations already run: use the same options, or delete it to start over")


def _fit(settings: dict, measured: dict, probes, sizes) -> dict:
    """The calibration of the probe sizes ``measured``: per measure the line of log size in log ρ through the
    medians at the two probes, and the radii where it reaches each target size."""
    fits, grid = {}, {}
    for m in measured:
        s1, s2 = (float(np.median(measured[m][rho_key(r)])) for r in probes)
        if not (s1 > 0 and s2 > 0):
            raise ValueError(f"{m}: the probes moved no weight (median sizes {s1:g}, {s2:g}); the models may sit "
                             f"at a loss maximum of the batch, or the probe radii are too small")
        fits[m] = dict(median_sizes=[s1, s2], slope=math.log(s2 / s1) / math.log(probes[1] / probes[0]))
        grid[m] = [float(f"{r:.4g}") for r in rho_for_size(probes, (s1, s2), sizes)]
        beyond = [(size, r) for size, r in zip(sizes, grid[m]) if not r <= MAX_RHO]
        if beyond:  # refused here, before calibration.json is written, not at that unit of the evaluation
            size, r = beyond[0]
            raise ValueError(f"{m}: the fit reaches the relative size {size:g} only at ρ = {r:g}, above the largest "
                             f"radius an evaluation accepts ({MAX_RHO:g}); leave that size out of --sizes, or probe "
                             f"nearer it (--probe-rho)")
    return dict(settings=settings, measured=measured, fit=fits, grid=grid)


def read_probe_units(out, digest: str, repair: bool = False) -> dict:
    """``{(model, measure, rho_key): (relative size, seconds)}`` of the finished probe runs in
    ``calibration.units.jsonl`` measured under the settings ``digest`` (first wins; a torn last line, left by a
    killed run, is ignored, and with ``repair`` truncated away on disk); a line that is not a probe run is
    refused, naming it."""
    path = Path(out) / CALIBRATION_UNITS
    units = {}
    for i, u in enumerate(read_jsonl(path, repair=repair), start=1):
        ok = (isinstance(u, dict) and all(isinstance(u.get(k), str) for k in ("model", "measure", "rho", "settings"))
              and all(isinstance(u.get(k), (int, float)) and not isinstance(u.get(k), bool)
                      for k in ("relative_size", "seconds")))
        if not ok:
            raise ValueError(f"{path}: line {i} is not a finished probe run (a JSON object with 'model', 'measure', "
                             f"'rho', 'settings', 'relative_size', 'seconds'); delete that line (the run is repeated) "
                             f"or the file")
        if u["settings"] == digest:
            units.setdefault((u["model"], u["measure"], u["rho"]), (float(u["relative_size"]), float(u["seconds"])))
    return units


def _probe_sizes(out: Path, entries, batch, settings, measures, probes, n_iter, seed, threads, progress,
                 length_buckets, stamps: dict) -> tuple[dict, float]:
    """``({measure: {rho_key: [relative size per model]}}, seconds)``: every probe run of the calibration (the
    manifest ``entries`` on ``batch``), each appended to ``calibration.units.jsonl`` as it finishes, so a killed
    calibration resumes after its last finished run (runs of other settings are not reused). A model's runs share
    what they compute at θ alone (:func:`~geosharp_ref.sharpness.at_theta.keeping`, as a model's evaluation does)."""
    if threads:
        torch.set_num_threads(threads)
    from tqdm.auto import tqdm

    digest = settings_digest(settings)
    done = read_probe_units(out, digest, repair=True)
    measured = {m: {rho_key(r): [] for r in probes} for m in measures}
    seconds = 0.0
    bar = tqdm(total=len(entries) * len(measures) * len(probes), desc="calibrate", unit="run", disable=not progress)
    for entry in entries:
        with contextlib.ExitStack() as scope:  # a model's runs share what they compute at θ alone
            model = smap = None
            for m in measures:
                meas = NAMED_MEASURES[m]
                for r in probes:
                    key = (entry["name"], m, rho_key(r))
                    if key not in done:
                        if model is None:
                            model = load_population_model(out, entry, progress)
                            with warnings.catch_warnings():
                                warnings.simplefilter("ignore")
                                smap = build_symmetry_map(model)
                            scope.enter_context(at_theta.keeping(model))  # the model is not changed from here
                        t0 = time.perf_counter()
                        res = meas.evaluate(model, [batch], r, n_iter=n_iter, seed=seed,
                                            length_buckets=length_buckets,
                                            **({} if meas.metric is None else {"symmetry_map": smap}))
                        done[key] = (float(res.relative_size[0]), time.perf_counter() - t0)
                        append_line(out / CALIBRATION_UNITS,
                                    dict(model=key[0], measure=m, rho=key[2], settings=digest,
                                         relative_size=done[key][0], seconds=done[key][1], **stamps.get(key[0], {})))
                    measured[m][rho_key(r)].append(done[key][0])
                    seconds += done[key][1]
                    bar.update(1)
    bar.close()
    return measured, seconds
