"""``geosharp population train|evaluate|study|calibrate|import|reliability|status|pack|rebuild|pipeline|exclude|
correlate``: the population study's actions."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .. import distributed as gdist
from ..studies.population.calibration import CALIBRATION, calibrate_population, evaluation_radii
from ..studies.population.correlation import correlate_population, parse_where
from ..studies.population.evaluation import evaluate_population
from ..studies.population.exclusion import EXCLUDED, exclude_model
from ..studies.population.importing import import_population
from ..studies.population.manifest import MANIFEST, population_files, read_json_object
from ..studies.population.options import (check_calibration, check_count, check_curvature_options, check_evaluation,
                                          check_seed, check_sizes, check_training)
from ..studies.population.pack import RETRAINED, pack_population, rebuild_population
from ..studies.population.pipeline import run_pipeline
from ..studies.population.reliability import gap_reliability
from ..studies.population.status import format_status, population_status
from ..studies.population.study import run_study
from ..studies.population.training import train_population
from . import parse_command
from .common import resolve_device

__all__ = ["run", "check_options", "pipeline_stages", "MIN_POPULATION_MODELS"]

#: a population ranks its models: train and import need at least two (correlate's Kendall τ needs three)
MIN_POPULATION_MODELS = 2


def check_options(args) -> None:
    """Every numeric option of the action, checked once before anything is read or written (the library
    functions check them again for their own callers)."""
    a = args.action
    if a in ("train", "study"):
        check_training(args.models, args.seed, getattr(args, "split_seed", 0), args.epochs_max, args.train_size_max,
                       args.workers, min_models=MIN_POPULATION_MODELS if a == "train" else 3)
    if a == "evaluate":
        check_evaluation(args.rho, args.measures, args.batches, args.batch_size, args.iters, args.seed, args.threads,
                         args.sizes, length_buckets=args.length_buckets)
        check_curvature_options(args.measures, _curvature_options(args))
    if a == "study":
        for name, value in (("--batches", args.batches), ("--batch-size", args.batch_size), ("--iters", args.iters),
                            ("--length-buckets", args.length_buckets)):
            check_count(name, value, optional=True)
        if args.rho is not None:
            check_evaluation(args.rho, args.measures or ["adaptive"], 1, 1, 1)
        check_sizes("--sizes", args.sizes, optional=True)
    if a == "calibrate":
        check_calibration(args.sizes, args.models, args.batch_size, args.probe_rho, args.iters,
                          length_buckets=args.length_buckets)
    if a == "import" and len(args.models) < MIN_POPULATION_MODELS:
        raise ValueError(f"--models names {len(args.models)} model; a population ranks its models, so import at least "
                         f"{MIN_POPULATION_MODELS} (3 for `population correlate`), or measure one model with "
                         f"`geosharp evaluate MODEL_DIR --data FILE`")
    if a in ("reliability", "calibrate"):
        check_count("--threads", args.threads)
    if a in ("rebuild", "pipeline"):
        check_count("--workers", args.workers)
    if a == "reliability":
        check_count("--splits", args.splits)
        check_seed("--seed", args.seed)
    if a in ("study", "correlate"):
        check_count("--bootstrap", args.bootstrap)


def pipeline_stages(out, plan_file) -> dict:
    """The keyword arguments of :func:`~geosharp_ref.studies.population.pipeline.run_pipeline` (``calibrate``,
    ``evaluations``, ``reliability``) from a plan file: a JSON object whose ``calibrate``, ``reliability`` (lists
    of options) and ``evaluate`` (a list of them, one per evaluation) are parsed as the options of ``geosharp
    population calibrate|evaluate|reliability --out OUT`` and checked (:func:`check_options`); a stage left out
    is not run."""
    plan = read_json_object(plan_file, "pipeline plan", fix="give a JSON object like docs/tweets/pipeline.json")
    unknown = sorted(set(plan) - {"calibrate", "evaluate", "reliability", "comment"})
    if unknown:
        raise ValueError(f"{plan_file}: unknown stages {unknown}; a plan has 'calibrate', 'evaluate' and "
                         f"'reliability'")

    def parse(action, argv, where):
        if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
            raise ValueError(f"{plan_file}: {where} must be a list of option strings, like a command line's")
        if any(a in ("--out", "--device", "--no-progress") or a.startswith("--out=") for a in argv):
            raise ValueError(f"{plan_file}: {where} gives --out, --device or --no-progress; the pipeline sets them "
                             f"(its own --out, the CPU, its own --no-progress): remove it")
        try:
            args = parse_command(["population", action, "--out", str(out), *argv])
            check_options(args)
        except ValueError as exc:
            raise ValueError(f"{plan_file}: {where}: {exc}") from None
        return args

    stages = dict(calibrate=None, evaluations=[], reliability=None)
    if "calibrate" in plan:
        a = parse("calibrate", plan["calibrate"], "'calibrate'")
        stages["calibrate"] = dict(sizes=a.sizes, measures=a.measures, models=a.models, batch_size=a.batch_size,
                                   probe_rhos=a.probe_rho, n_iter=a.iters, threads=a.threads,
                                   length_buckets=a.length_buckets)
    evaluate = plan.get("evaluate", [])
    if not isinstance(evaluate, list):
        raise ValueError(f"{plan_file}: 'evaluate' must be a list of evaluations, each a list of option strings")
    for i, argv in enumerate(evaluate):
        a = parse("evaluate", argv, f"'evaluate'[{i}]")
        if a.threads != 1:
            raise ValueError(f"{plan_file}: 'evaluate'[{i}] gives --threads {a.threads}; the pipeline's processes "
                             f"run one thread each (use --workers): remove it")
        stages["evaluations"].append(dict(rhos=a.rho, calibration=a.calibration, sizes=a.sizes, measures=a.measures,
                                          n_batches=a.batches, batch_size=a.batch_size, n_iter=a.iters, seed=a.seed,
                                          tag=a.tag, length_buckets=a.length_buckets,
                                          curvature_options=_curvature_options(a)))
    if "reliability" in plan:
        a = parse("reliability", plan["reliability"], "'reliability'")
        stages["reliability"] = dict(splits=a.splits, seed=a.seed)
    return stages


def _curvature_options(args) -> dict:
    return dict(probes=args.probes, steps=args.lanczos_steps, trace_method=args.trace_method)


def run(args) -> int:
    """Run one population action (errors propagate to the CLI's one-line error handler)."""
    check_options(args)
    if args.action == "train":
        man = train_population(args.out, n_models=args.models, seed=args.seed, split_seed=args.split_seed,
                               epochs_max=args.epochs_max, workers=args.workers, task=args.task,
                               train_size_max=args.train_size_max, progress=not args.no_progress)
        gaps = [m["metrics"]["gap"] for m in man["models"]]
        print(f"{len(gaps)} models in {args.out}; gap min {min(gaps):.3f} max {max(gaps):.3f}")
    elif args.action == "evaluate":
        rhos, sizes = evaluation_radii(args.out, args.measures, args.rho, args.calibration, args.sizes)
        # --device, or by default CUDA when available; under torchrun (WORLD_SIZE > 1) without --device each
        # rank takes its own GPU (cuda:LOCAL_RANK with NCCL, else the CPU)
        torchrun = int(os.environ.get("WORLD_SIZE", "1")) > 1
        device = None if torchrun and args.device is None else resolve_device(args)
        with gdist.maybe_init():
            recs = evaluate_population(args.out, rhos=rhos, sizes=sizes, measures=args.measures,
                                       n_batches=args.batches, batch_size=args.batch_size, n_iter=args.iters,
                                       seed=args.seed, threads=args.threads, progress=not args.no_progress,
                                       tag=args.tag, device=device, length_buckets=args.length_buckets,
                                       curvature_options=_curvature_options(args))
            if gdist.rank_world()[0] == 0:
                print(f"{len(recs)} models evaluated -> {Path(args.out) / population_files(args.tag)['results']}")
    elif args.action == "study":
        run_study(args.out, task=args.task, n_models=args.models, seed=args.seed, epochs_max=args.epochs_max,
                  train_size_max=args.train_size_max, workers=args.workers, rhos=args.rho,
                  n_batches=args.batches, batch_size=args.batch_size, n_iter=args.iters, measures=args.measures,
                  sizes=args.sizes, n_boot=args.bootstrap, progress=not args.no_progress,
                  length_buckets=args.length_buckets)
    elif args.action == "calibrate":
        cal = calibrate_population(args.out, args.sizes, measures=args.measures, models=args.models,
                                   batch_size=args.batch_size, probe_rhos=args.probe_rho, n_iter=args.iters,
                                   progress=not args.no_progress, length_buckets=args.length_buckets,
                                   threads=args.threads)
        for m, rs in cal["grid"].items():
            print(f"{m:>14s}: ρ " + ", ".join(f"{r:g}" for r in rs) + "  (‖Δθ‖/‖θ‖ " +
                  ", ".join(f"{x:g}" for x in cal["settings"]["sizes"]) + f"; slope {cal['fit'][m]['slope']:.2f})")
        print(f"written: {Path(args.out) / CALIBRATION}; next: geosharp population evaluate --out {args.out} "
              f"--calibration")
    elif args.action == "import":
        man = import_population(args.out, args.models, args.metrics, args.data, loader=args.loader)
        print(f"{len(man['models'])} models registered in {Path(args.out) / MANIFEST}; next: "
              f"geosharp population evaluate --out {args.out}")
    elif args.action == "reliability":
        gap_reliability(args.out, splits=args.splits, seed=args.seed, progress=not args.no_progress,
                        threads=args.threads)
    elif args.action == "pack":
        summary = pack_population(args.out, args.to)
        size = f"{summary['bytes'] / 1e6:.1f} MB" if summary["bytes"] >= 1e6 else f"{summary['bytes'] / 1e3:.0f} kB"
        print(f"packed {summary['models']} models of {args.out} into {args.to} ({summary['files']} files, "
              f"{size}; {summary['hashed']} models' weights hashed now); continue it "
              f"elsewhere with `cp -r {args.to} DIR` (each packed model is rebuilt from its recipe when needed, "
              f"and checked: bit for bit on the machine that trained it, not always on another CPU)")
    elif args.action == "pipeline":
        stages = pipeline_stages(args.out, args.plan)
        done = run_pipeline(args.out, workers=args.workers, progress=not args.no_progress, **stages)
        print(f"{done['models']} models of {args.out} complete ({done['retrained']} retrained on a machine that did "
              f"not rebuild them: {Path(args.out) / RETRAINED})")
    elif args.action == "rebuild":
        done = rebuild_population(args.out, workers=args.workers, progress=not args.no_progress)
        print(f"rebuilt {done['rebuilt']} of the {done['packed']} packed models of {args.out}")
    elif args.action == "exclude":
        left = exclude_model(args.out, args.model, args.reason)
        print(f"{args.model} is left out of every evaluation of {args.out} ({len(left)} in all; "
              f"{Path(args.out) / EXCLUDED}); run the stopped evaluation again: it resumes without it")
    elif args.action == "status":
        status = population_status(args.out)
        print(json.dumps(status, indent=2, sort_keys=True) if args.json else format_status(status))
    else:
        correlate_population(args.out, n_boot=args.bootstrap, seed=args.seed, plot=not args.no_plot,
                             tag=args.tag, where=parse_where(args.where), color_by=args.color_by)
    return 0
