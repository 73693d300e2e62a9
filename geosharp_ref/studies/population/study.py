"""The whole population study in one call: train (resuming), evaluate (resuming), correlate."""
from __future__ import annotations

import sys
import time

import torch

from pathlib import Path

from .calibration import calibrate_population, calibrated_grid
from .correlation import correlate_population
from .evaluation import ALL_MEASURES, DEFAULT_RHOS, MEASURES, evaluate_population, read_results
from .options import MIN_STUDY_MODELS, check_calibration, check_count, check_evaluation, check_training
from .task import PopulationTask
from .tasks import get_task
from .training import train_population

__all__ = ["run_study", "STUDY_DEFAULTS", "study_protocol"]

#: the evaluation protocol of a study when neither the caller nor the task (``PopulationTask.evaluation``)
#: sets an item: one ρ sweep for every measure, 4 fixed batches of 32, 20 Auto-PGD iterations
STUDY_DEFAULTS = dict(rhos=DEFAULT_RHOS, measures=MEASURES, batches=4, batch_size=32, iters=20, sizes=None,
                      calibration_models=3, probe_rhos=(0.01, 0.03), length_buckets=None)


def study_protocol(task: PopulationTask, **given) -> dict:
    """The evaluation protocol of a study: what the caller gives (not None), else the task's
    :attr:`~geosharp_ref.studies.population.task.PopulationTask.evaluation`, else :data:`STUDY_DEFAULTS`."""
    proto = {**STUDY_DEFAULTS, **dict(task.evaluation)}
    proto.update({k: v for k, v in given.items() if v is not None})
    return proto



def run_study(out, task: PopulationTask | str = "vision", n_models: int = 32, seed: int = 0,
              epochs_max: int | None = None, train_size_max: int | None = None, workers: int = 2, rhos=None,
              measures=None, n_batches: int | None = None, batch_size: int | None = None, n_iter: int | None = None,
              sizes=None, n_boot: int = 1000, progress: bool = True, stream=None,
              length_buckets: int | None = None) -> dict:
    """Train (resuming), evaluate (resuming) and correlate a population; returns the correlation result.

    The evaluation protocol (radii, measures, batches, iterations, matched sizes) is :func:`study_protocol`:
    arguments left None come from the task, then from :data:`STUDY_DEFAULTS`. With target ``sizes`` the
    radii are calibrated per measure first (:mod:`.calibration`) and the evaluation runs on that grid.
    Each stage skips what is already on disk, so rerunning after an interruption continues."""
    stream = stream or sys.stdout
    ptask = get_task(task) if isinstance(task, str) else task
    proto = study_protocol(ptask, rhos=rhos, measures=measures, batches=n_batches, batch_size=batch_size,
                           iters=n_iter, sizes=sizes, length_buckets=length_buckets)
    # every stage's options are checked before the first one runs (no training for a refused evaluation)
    check_training(n_models, seed, 0, epochs_max, train_size_max, workers, min_models=MIN_STUDY_MODELS)
    check_evaluation(proto["rhos"], proto["measures"], proto["batches"], proto["batch_size"], proto["iters"],
                     sizes=proto["sizes"] or None, known_measures=ALL_MEASURES, length_buckets=proto["length_buckets"])
    if proto["sizes"]:
        check_calibration(proto["sizes"], proto["calibration_models"], proto["batch_size"], proto["probe_rhos"],
                          proto["iters"], length_buckets=proto["length_buckets"])
        if proto["calibration_models"] > n_models:
            raise ValueError(f"the protocol calibrates on {proto['calibration_models']} models but --models is "
                             f"{n_models}; train at least {proto['calibration_models']}")
    check_count("--bootstrap", n_boot)
    out = Path(out)
    on_disk = sum(1 for p in (out / "models").glob("model_*") if p.is_dir()) if (out / "models").is_dir() else 0
    t0 = time.perf_counter()
    man = train_population(out, n_models=n_models, seed=seed, epochs_max=epochs_max, workers=workers,
                           train_size_max=train_size_max, progress=progress, task=ptask)
    gaps = [m["metrics"]["gap"] for m in man["models"]]
    t1 = time.perf_counter()
    fresh = len(gaps) - min(on_disk, len(gaps))
    done = (f"trained {fresh} {ptask.name} models in {t1 - t0:.0f} s" + (f" ({len(gaps) - fresh} were on disk)"
            if fresh < len(gaps) else "")) if fresh else f"all {len(gaps)} {ptask.name} models were trained already"
    print(f"{done} (gap {min(gaps):+.3f} … {max(gaps):+.3f})", file=stream, flush=True)
    threads = torch.get_num_threads()
    evaluated_before = set(read_results(out))
    measures = tuple(proto["measures"])
    try:
        if proto["sizes"]:
            cal = calibrate_population(out, proto["sizes"], measures=measures, models=proto["calibration_models"],
                                       batch_size=proto["batch_size"], probe_rhos=proto["probe_rhos"],
                                       n_iter=proto["iters"], progress=progress,
                                       length_buckets=proto["length_buckets"])
            grid = calibrated_grid(cal, measures)
            print("radii matched in ‖Δθ‖/‖θ‖ " + ", ".join(f"{s:g}" for s in proto["sizes"]) + ": " +
                  "; ".join(f"{m} {', '.join(f'{r:g}' for r in grid[m])}" for m in measures),
                  file=stream, flush=True)
            recs = evaluate_population(out, rhos=grid, sizes=proto["sizes"], measures=measures,
                                       n_batches=proto["batches"], batch_size=proto["batch_size"],
                                       n_iter=proto["iters"], threads=1, progress=progress,
                                       length_buckets=proto["length_buckets"])
        else:
            recs = evaluate_population(out, rhos=proto["rhos"], measures=measures, n_batches=proto["batches"],
                                       batch_size=proto["batch_size"], n_iter=proto["iters"], threads=1,
                                       progress=progress, length_buckets=proto["length_buckets"])
    finally:
        torch.set_num_threads(threads)
    t2 = time.perf_counter()
    fresh = len(set(recs) - evaluated_before)  # recs: every model evaluated, none left out (exclusion.py)
    print(f"evaluated {fresh} models in {t2 - t1:.0f} s" if fresh > 0 else
          f"all {len(recs)} models were evaluated already", file=stream, flush=True)
    return correlate_population(out, n_boot=n_boot, stream=stream)
