"""The options of the population commands, checked once, before anything is read, computed or written.

Each function raises ``ValueError`` with one line naming the option (its command-line spelling, with the
library argument beside it), the value given and what is accepted. :func:`check_training`,
:func:`check_evaluation` and :func:`check_calibration` are called at the top of
:func:`~geosharp_ref.studies.population.training.train_population`,
:func:`~geosharp_ref.studies.population.evaluation.evaluate_population`,
:func:`~geosharp_ref.studies.population.calibration.calibrate_population` and, for all three stages at once,
:func:`~geosharp_ref.studies.population.study.run_study` (so a study never trains for an evaluation it
would then refuse).

Accepted values: counts (models, batches, batch size, iterations, workers, threads, epochs, training-set
size, bootstrap resamples, halvings) are integers ≥ 1; radii ρ are finite and > 0; target relative sizes
‖Δθ‖/‖θ‖ lie in (0, 1] (a larger one would move the weights further than their own norm); seeds are integers.
"""
from __future__ import annotations

import math
import numbers

from ...sharpness.curvature import check_trace_method
from ...sharpness.pipeline import MAX_RHO

__all__ = ["check_count", "check_seed", "check_radii", "check_sizes", "check_training", "check_evaluation",
           "check_calibration", "check_curvature_options", "CURVATURE_OPTIONS", "MIN_STUDY_MODELS"]

#: a study ends in a Kendall τ over the models: it needs at least this many
MIN_STUDY_MODELS = 3


def check_count(name: str, value, minimum: int = 1, optional: bool = False) -> None:
    """``value`` is an integer ≥ ``minimum`` (None allowed where ``optional``: the default applies)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"
        raise ValueError(f"{name} must be {what}, got {value!r}")


def check_seed(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")


def _number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real)


def check_radii(name: str, rhos) -> None:
    """One list of radii, or ``{measure: [radii]}``: every radius finite, > 0 and at most
    :data:`~geosharp_ref.sharpness.pipeline.MAX_RHO` (so an evaluation refuses it before its first model, not at
    its unit), none empty."""
    lists = list(rhos.values()) if isinstance(rhos, dict) else [rhos]
    for rs in lists:
        rs = list(rs) if isinstance(rs, (list, tuple)) else [rs]
        if not rs or any(not _number(r) or not (math.isfinite(r) and r > 0) for r in rs):
            raise ValueError(f"{name}: every radius ρ must be a positive finite number, got {rhos}")
        if any(r > MAX_RHO for r in rs):
            raise ValueError(f"{name}: every radius ρ must be at most {MAX_RHO:g}, the largest radius an evaluation "
                             f"accepts, got {rhos}; check it for a typo")


def check_sizes(name: str, sizes, optional: bool = False) -> None:
    """Target relative sizes ‖Δθ‖/‖θ‖: a non-empty list of finite numbers in (0, 1]."""
    if sizes is None and optional:
        return
    sizes = list(sizes) if isinstance(sizes, (list, tuple)) else [sizes]
    if not sizes or any(not _number(s) or not (math.isfinite(s) and s > 0) for s in sizes):
        raise ValueError(f"{name}: every target relative size ‖Δθ‖/‖θ‖ must be a positive finite number, got "
                         f"{sizes}")
    big = [s for s in sizes if s > 1]
    if big:
        raise ValueError(f"{name}: target relative size {big[0]:g} is above 1, a perturbation larger than the "
                         f"weights themselves (‖Δθ‖ > ‖θ‖); give fractions such as 2e-5 2e-4")


def check_training(n_models, seed=0, split_seed=0, epochs_max=None, train_size_max=None, workers=1,
                   min_models: int = 1) -> None:
    """The training options (``geosharp population train``)."""
    check_count("--models", n_models)
    if n_models < min_models:
        raise ValueError(f"--models {n_models}: a population ranks its models, so give at least {min_models}"
                         + (" (its Kendall τ needs 3)" if min_models < MIN_STUDY_MODELS else " (a study ends in a "
                            "Kendall τ over the models)")
                         + "; to measure one model use `geosharp evaluate MODEL_DIR --data FILE`")
    check_seed("--seed", seed)
    check_seed("--split-seed", split_seed)
    check_count("--epochs-max", epochs_max, optional=True)
    check_count("--train-size-max", train_size_max, optional=True)
    check_count("--workers", workers)


def check_evaluation(rhos, measures, n_batches, batch_size, n_iter, seed=0, threads=None, sizes=None,
                     known_measures=None, length_buckets=None) -> None:
    """The evaluation options (``geosharp population evaluate``)."""
    measures = list(measures)
    if not measures:
        raise ValueError("--measures is empty: name at least one measure")
    if known_measures is not None:
        unknown = sorted(set(measures) - set(known_measures))
        if unknown:
            raise ValueError(f"unknown measures {unknown}; choose from {list(known_measures)}")
    check_radii("--rho", rhos)
    check_count("--batches (n_batches)", n_batches)
    check_count("--batch-size", batch_size)
    check_count("--iters (Auto-PGD iterations, n_iter)", n_iter)
    check_seed("--seed", seed)
    check_count("--threads", threads, optional=True)
    check_sizes("--sizes", sizes, optional=True)
    check_count("--length-buckets", length_buckets, optional=True)


#: the options of the curvature measures (``hessian-*``) an evaluation may set: Hutchinson / Hutch++ matvecs,
#: Lanczos steps, the trace estimator
CURVATURE_OPTIONS = {"probes": "--probes", "steps": "--lanczos-steps", "trace_method": "--trace-method"}


def check_curvature_options(measures, options) -> dict:
    """The curvature measures' options of an evaluation (``{"probes", "steps", "trace_method"}``, None for the
    library's defaults), checked; returns those given. They are refused where no ``hessian-*`` measure is
    evaluated (they would change nothing)."""
    given = {k: v for k, v in (options or {}).items() if v is not None}
    unknown = sorted(set(given) - set(CURVATURE_OPTIONS))
    if unknown:
        raise ValueError(f"unknown curvature options {unknown}; choose from {sorted(CURVATURE_OPTIONS)}")
    if given and not any(str(m).startswith("hessian-") for m in measures):
        names = ", ".join(CURVATURE_OPTIONS[k] for k in given)
        raise ValueError(f"{names} set the curvature measures (hessian-*), and --measures names none: add one "
                         f"(e.g. hessian-trace-mix) or drop {names}")
    for key in ("probes", "steps"):
        check_count(CURVATURE_OPTIONS[key], given.get(key), optional=True)
    if "trace_method" in given:
        check_trace_method(given["trace_method"], given.get("probes", 16))
    return given


def check_calibration(sizes, models, batch_size, probe_rhos, n_iter, seed=0, length_buckets=None) -> None:
    """The calibration options (``geosharp population calibrate``)."""
    check_sizes("--sizes", sizes)
    check_count("--models", models)
    check_count("--batch-size", batch_size)
    check_count("--iters (Auto-PGD iterations, n_iter)", n_iter)
    check_seed("--seed", seed)
    check_count("--length-buckets", length_buckets, optional=True)
    probes = list(probe_rhos)
    if (len(probes) != 2 or not all(_number(r) and math.isfinite(r) and r > 0 for r in probes)
            or probes[0] == probes[1]):
        raise ValueError(f"--probe-rho: give two distinct positive finite probe radii, got {probe_rhos}")
