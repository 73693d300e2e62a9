"""``geosharp evaluate``: adaptive or geodesic sharpness of a saved model on a saved data set."""
from __future__ import annotations

import json
from dataclasses import replace
import sys
import warnings
from pathlib import Path

import torch

from ..io.data import load_data, split_batches
from ..io.durable import check_output_path, write_text_atomic
from ..forward import batch_to_device, check_finite_batch
from ..io.models import check_model_dir, resolve_model_dir
from ..sharpness import EvaluationOptions, evaluate, get_measure, rho_for_size
from ..sharpness.average_case import average_case_sharpness
from ..sharpness.pipeline import check_rho
from ..symmetry import NoAttentionPairsWarning, Quotient
from .common import (resolve_device, check_positive, check_symmetry_options, describe_symmetry, load_model_with_head,
                     requested_symmetries, symmetry_map_quiet)

__all__ = ["run", "run_measure", "measure_refusal", "PROBE_RHOS", "METRIC_DEFAULTS"]

#: the probe radii of --target-relative-size
PROBE_RHOS = (0.01, 0.03)


def _quotiented(cfg, args, spec, declared_count) -> str:
    """What the geodesic measure quotiented, truthfully: the attention pairs kept and yielded, the declared and
    built-in bindings (each with its metric), the rest adaptive."""
    if cfg.get("metric") is None:
        return ""
    pairs, yielded = cfg.get("pairs", 0), len(cfg.get("yielded") or ())
    bindings = len(cfg["factors"]) - pairs if cfg.get("factors") is not None else 0
    parts = [f"{cfg['metric']} on {pairs} attention pairs" + (f" ({yielded} yielded to bindings)" if yielded else "")]
    if spec is not None:
        parts.append(f"{args.metric} on {declared_count} declared bindings")
    if bindings - declared_count > 0:
        parts.append(f"{bindings - declared_count} built-in bindings")
    if cfg.get("joint"):
        parts.append(f"{len(cfg['joint'])} joint groups (norm weights, stream scaling, LoRA × attention)")
    return " (" + "; ".join(parts) + "; adaptive elsewhere)"


#: the --metric path's values of the options the parser leaves None when not given (--measure refuses those
#: that do not apply to its measure, so it must see which were given)
METRIC_DEFAULTS = dict(iters=20, eps=0.0, gradient="exact", geodesic="second-order", samples=32,
                       attention_metric="mix")


def _check_size_and_iters(args) -> None:
    """The radius (``--rho``, else ``--target-relative-size`` in (0, 1]) and ``--iters`` (≥ 1 where given),
    checked before the model or the data is read."""
    if args.rho is not None:
        check_rho(args.rho)
    else:
        check_positive("--target-relative-size", args.target_relative_size)
        if args.target_relative_size > 1:
            raise ValueError(f"--target-relative-size {args.target_relative_size:g} is above 1, a perturbation larger "
                             f"than the weights themselves (‖Δθ‖ > ‖θ‖); give a fraction such as 2e-4")
    if args.iters is not None and args.iters < 1:
        raise ValueError(f"--iters must be at least 1, got {args.iters}")


def _radius(args, measure, batches) -> float:
    """``--rho``, or the radius of matched perturbation size ``--target-relative-size``: ρ ↦ ‖Δθ‖/‖θ‖ fitted on the
    first batch from the two probe radii :data:`PROBE_RHOS` (:func:`~geosharp_ref.sharpness.rho_for_size`), printed.
    ``measure(rho, batches, progress=...)`` evaluates the chosen measure."""
    if args.rho is not None:
        return args.rho
    sizes = [measure(r, batches[:1], progress=False).relative_size[0] for r in PROBE_RHOS]
    rho = rho_for_size(PROBE_RHOS, sizes, [args.target_relative_size])[0]
    print(f"  radius    : ρ = {rho:.4g} for ‖Δθ‖/‖θ‖ = {args.target_relative_size:g} (first batch: "
          + ", ".join(f"ρ {r:g} → {x:.3g}" for r, x in zip(PROBE_RHOS, sizes)) + ")")
    return rho


def run(args) -> int:
    """``geosharp evaluate``: adaptive or geodesic sharpness of a saved model on a saved data set; with
    ``--measure`` a named measure (:func:`run_measure`)."""
    if getattr(args, "measure", None) is not None:
        return run_measure(args)
    for key, value in METRIC_DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    # every option is checked here, before the model or the data is read (the library's own checks:
    # check_rho and EvaluationOptions)
    _check_size_and_iters(args)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.batches is not None and args.batches < 1:
        raise ValueError(f"--batches must be at least 1, got {args.batches}")
    spec = check_symmetry_options(args, args.metric)
    if args.json:
        check_output_path(args.json, "--json", {"--data": args.data, "--spec": args.spec})
    if args.metric == "adaptive" and args.all_symmetries:
        raise ValueError("--all-symmetries quotients symmetries for geodesic sharpness: use --metric inv or mix")
    geodesic_metric = args.attention_metric if spec is not None else args.metric
    options = EvaluationOptions(
        metric=None if args.metric == "adaptive" else geodesic_metric, n_iter=args.iters, eps=args.eps,
        geodesic_correction=not args.no_geodesic_correction, metric_norm=not args.no_metric_norm,
        gradient=args.gradient, seed=args.seed, dtype=torch.float64 if args.float64 else None, progress=True,
        geodesic=args.geodesic, steps=args.steps, length_buckets=args.length_buckets)
    if args.geodesic == "exact" and args.metric == "adaptive":
        raise ValueError("--geodesic exact integrates the geodesics of a quotient metric: use --metric inv or mix")
    if args.average_case and args.samples < 2:
        raise ValueError(f"--samples must be at least 2 (for a standard error), got {args.samples}")
    device = resolve_device(args)
    model, probe, batches, n_batches, n = _load(args, device)  # the library computes on the model's device

    name = type(model).__name__
    print(f"{args.metric} sharpness of {name} ({args.model_dir})")
    print(f"  device    : {device}")
    print(f"  data      : {args.data}, {n_batches} batches × {args.batch_size} (first "
          f"{n_batches * args.batch_size} of {n} examples)")
    smap, symmetries, declared_count = None, None, 0
    if args.metric != "adaptive":
        smap = symmetry_map_quiet(model)
        describe_symmetry(smap)
        first = batch_to_device(batches[0], device)  # the checks run on the model's device
        symmetries = requested_symmetries(args, spec, model, first)
        declared_count = sum(1 for b in symmetries or () if not isinstance(b, str))
        if symmetries is not None:  # "all" resolved once (the radius probes reuse it)
            symmetries = Quotient.resolve(model, first, metric=geodesic_metric, symmetries=symmetries,
                                             smap=smap).bindings
        if not smap.groups and symmetries is None:
            print(f"geosharp: warning: no recognised GL(h) attention in {name}: geodesic sharpness equals "
                  f"adaptive sharpness for this model", file=sys.stderr)

    def measure(rho, on, progress=True):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=NoAttentionPairsWarning)
            if args.average_case:  # E_ξ L(γ_ξ(1)) − L(θ) (sharpness/average_case.py)
                return average_case_sharpness(
                    model, on, rho, metric=options.metric, n_samples=args.samples, distribution=args.distribution
                    or ("gaussian" if options.metric is None else "sphere"), geodesic=args.geodesic,
                    steps=args.steps, seed=args.seed, symmetry_map=smap, symmetries=symmetries, eps=args.eps,
                    dtype=options.dtype, progress=progress, length_buckets=args.length_buckets)
            return evaluate(model, on, rho, replace(options, progress=progress), smap=smap, symmetries=symmetries)

    result = measure(_radius(args, measure, batches), batches)
    cfg = result.config
    opts = f"APGD {cfg['n_iter']} iterations, {cfg['dtype'].replace('torch.', '')}" if not args.average_case else \
        f"{cfg['n_samples']} samples, {cfg['distribution']}, {cfg['dtype'].replace('torch.', '')}"
    if cfg.get("geodesic") == "exact":
        opts += f", exact geodesic ({cfg['steps']} RK4 steps)"
    if smap is not None and not args.average_case:
        opts += (f", eps {cfg['eps']:g}, geodesic correction {'on' if cfg['geodesic_correction'] else 'off'}, "
                 f"metric norm {'on' if cfg['metric_norm'] else 'off'}, gradient {cfg['gradient']}")
    if cfg.get("factors") is not None:
        print(f"  factors   : {len(cfg['factors'])} quotiented symmetries (attention pairs and bindings)"
              + (f"; {len(cfg['yielded'])} attention pairs yielded to a binding" if cfg.get("yielded") else ""))
    print(f"  measure   : {result.measure}" + _quotiented(cfg, args, spec, declared_count if smap is not None else 0))
    print(f"  rho       : {result.rho:g} ({opts})")
    print(f"  mean      : {result.mean:.6g}" + (f" ± {cfg['standard_error']:.2g} (Monte Carlo standard error)"
                                                  if args.average_case else ""))
    if cfg.get("geodesic_gap") is not None:
        print(f"  second order at the maximiser: {', '.join(f'{v:.6g}' for v in cfg['second_order_per_batch'])} "
              f"(exact − second order: {', '.join(f'{v:.3g}' for v in cfg['geodesic_gap'])})")
    print(f"  per batch : {', '.join(f'{v:.6g}' for v in result.per_batch)}")
    groups = result.relative_size_groups[0] if result.relative_size_groups else {}
    print(f"  ‖Δθ‖/‖θ‖  : median {result.median_relative_size:.3g} over the batches"
          + (" (first batch: " + ", ".join(f"{k} {v:.3g}" for k, v in groups.items()) + ")" if groups else ""))
    print(f"  seconds   : {result.seconds:.2f}")

    if args.json:
        extra = dict(spec=str(Path(args.spec).resolve()), spec_metric=args.metric) if spec is not None else {}
        if symmetries is not None:
            extra["all_symmetries"] = bool(args.all_symmetries)
        _write_json(args, result, name, n_batches, n, probe, smap, extra)
    return 0


# ------------------------------------------------------------------------------------------------
# --measure NAME: any named measure (geosharp_ref.sharpness.get_measure)
# ------------------------------------------------------------------------------------------------

def _family(m) -> str:
    """What kind of measure ``m`` is, in words (for the summary and the refusals)."""
    geometry = f"quotient metric {m.metric}" if m.metric is not None else \
        ("Euclidean" if m.curvature is not None else "adaptive")
    if m.curvature is not None:
        return (f"Hutchinson trace" if m.curvature == "trace" else "Lanczos top eigenvalue") + \
            f" of the Hessian, {geometry}; no perturbation, ρ recorded only"
    if m.average is not None:
        return f"average-case, ξ {'on the sphere' if m.average == 'sphere' else 'Gaussian'}, {geometry}"
    if m.linearised:
        return f"first order ρ‖∇L‖_*, {geometry}"
    return f"worst case (Auto-PGD), {geometry}" + (", exact geodesic" if m.geodesic == "exact" else "")


def measure_refusal(args, m):
    """The one-line reason an option given with ``--measure`` does not apply to measure ``m``
    (:class:`~geosharp_ref.sharpness.Measure`), or None. Options the parser leaves None (or False) were not
    given. The measure's name fixes its metric, geodesic, distribution and ablations; the rest applies as
    follows: ``--iters`` to the Auto-PGD measures, ``--gradient`` to the Auto-PGD quotient ones, ``--steps`` to
    ``geodesic-*-exact``, ``--samples`` to ``average-*``, ``--eps`` to the quotient measures, ``--all-symmetries``
    to those but the linearised ones (which quotient the attention pairs only), ``--spec`` (the spec file's only
    metric) to the worst-case and curvature quotient measures (average-case sampling knows the built-in
    geometries only), and
    ``--target-relative-size`` to every measure that moves the weights (not linearised, not curvature)."""
    auto_pgd = m.average is None and m.curvature is None and not m.linearised
    rules = (
        ("--geodesic", args.geodesic is not None, "the measure's name fixes its geodesic (geodesic-inv|mix-exact "
                                                  "integrate it with RK4)"),
        ("--average-case", args.average_case, "the measure's name says whether it is average-case (average-*)"),
        ("--distribution", args.distribution is not None,
         "the measure's name fixes the distribution (average-adaptive: gaussian, the other average-*: sphere)"),
        ("--no-geodesic-correction", args.no_geodesic_correction, "that ablation is --measure geodesic-inv|mix-first-order"),
        ("--no-metric-norm", args.no_metric_norm, "that ablation is --measure geodesic-inv|mix-frobenius"),
        ("--attention-metric", args.attention_metric is not None, "the measure's name fixes the metric"),
        ("--iters", args.iters is not None and not auto_pgd, "it runs no Auto-PGD (only the worst-case measures do)"),
        ("--gradient", args.gradient is not None and not (auto_pgd and m.metric is not None),
         "it applies to the worst-case quotient measures (geodesic-*)"),
        ("--steps", args.steps is not None and m.geodesic != "exact",
         "RK4 steps apply to the exact geodesic measures (geodesic-inv|mix-exact)"),
        ("--samples", args.samples is not None and m.average is None,
         "Monte Carlo samples apply to the average-case measures (average-*)"),
        ("--eps", args.eps is not None and m.metric is None, "the Gram relaxation applies to the quotient measures"),
        ("--spec", bool(args.spec) and (m.metric is None or m.linearised or m.average is not None),
         "declared symmetries are quotiented by the worst-case and curvature quotient measures (the average-case "
         "ones sample the built-in geometries only, the linearised ones quotient the attention pairs only)"),
        ("--all-symmetries", args.all_symmetries and (m.metric is None or m.linearised),
         "further symmetries are quotiented by the quotient measures other than the linearised ones"),
        ("--target-relative-size", args.target_relative_size is not None and (m.linearised or m.curvature is not None),
         "it moves no weights to match a size: give --rho"),
    )
    for flag, given, why in rules:
        if given:
            return f"{flag} does not apply to --measure {m.name} ({_family(m)}): {why}"
    return None


def _load(args, device):
    """The data file's batches (checked finite) and the model (with its probe head) on ``device``."""
    check_model_dir(args.model_dir)
    inputs, targets, n = load_data(args.data)
    n_batches = args.batches if args.batches is not None else max(1, n // args.batch_size)
    batches = split_batches(inputs, targets, n_batches, args.batch_size, f"data file {args.data!r}")
    for i, b in enumerate(batches):  # before the model is loaded: e.g. a batch with no scored token
        check_finite_batch(b, i)
    model, probe = load_model_with_head(args.model_dir, args.num_labels, (inputs, targets, n), args.seed)
    return model.to(device), probe, batches, n_batches, n


def run_measure(args) -> int:
    """``geosharp evaluate --measure NAME``: ``get_measure(NAME).evaluate(model, batches, ρ, symmetry_map=…,
    **options)`` with the options that apply to the measure (:func:`measure_refusal`), each validated before the
    model or the data is read (:class:`~geosharp_ref.sharpness.EvaluationOptions`, ``check_rho``)."""
    m = get_measure(args.measure)
    why = measure_refusal(args, m)
    if why:
        raise ValueError(why)
    _check_size_and_iters(args)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.batches is not None and args.batches < 1:
        raise ValueError(f"--batches must be at least 1, got {args.batches}")
    if args.samples is not None and args.samples < 2:
        raise ValueError(f"--samples must be at least 2 (for a standard error), got {args.samples}")
    spec = check_symmetry_options(args, None)  # --spec: the spec file's only metric
    if args.json:
        check_output_path(args.json, "--json", {"--data": args.data, "--spec": args.spec})
    dtype = torch.float64 if args.float64 else None
    EvaluationOptions(metric=m.metric, linearised=m.linearised, n_iter=args.iters or 20, eps=args.eps or 0.0,
                      geodesic_correction=m.geodesic_correction, metric_norm=m.metric_norm,
                      gradient=args.gradient or "exact", seed=args.seed, dtype=dtype, geodesic=m.geodesic,
                      steps=args.steps, length_buckets=args.length_buckets)  # the library's checks, once,
    options = dict(seed=args.seed, dtype=dtype, progress=True)   # before anything is loaded
    if args.length_buckets is not None:
        options["length_buckets"] = args.length_buckets
    for key, value in (("n_iter", args.iters), ("eps", args.eps), ("gradient", args.gradient),
                       ("steps", args.steps), ("n_samples", args.samples)):
        if value is not None:  # given, so it applies (measure_refusal); otherwise the library's default
            options[key] = value
    device = resolve_device(args)
    model, probe, batches, n_batches, n = _load(args, device)

    name = type(model).__name__
    print(f"{m.name} of {name} ({args.model_dir})")
    print(f"  device    : {device}")
    print(f"  data      : {args.data}, {n_batches} batches × {args.batch_size} (first "
          f"{n_batches * args.batch_size} of {n} examples)")
    smap = None
    if m.metric is not None:
        smap = symmetry_map_quiet(model)
        describe_symmetry(smap)
        first = batch_to_device(batches[0], device)
        symmetries = requested_symmetries(args, spec, model, first)
        if symmetries is not None:  # "all" resolved once (the radius probes reuse it)
            options["symmetries"] = Quotient.resolve(model, first, metric=m.metric, symmetries=symmetries,
                                                     smap=smap).bindings

    def measure(rho, on, progress=True):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=NoAttentionPairsWarning)
            return m.evaluate(model, on, rho, symmetry_map=smap, **{**options, "progress": progress})

    result = measure(_radius(args, measure, batches), batches)
    cfg = result.config
    if cfg.get("factors") is not None:
        print(f"  factors   : {len(cfg['factors'])} quotiented symmetries (attention pairs and bindings)"
              + (f"; {len(cfg['yielded'])} attention pairs yielded to a binding" if cfg.get("yielded") else ""))
    print(f"  measure   : {result.measure} ({_family(m)})")
    settings = [f"APGD {cfg['n_iter']} iterations"] if "n_iter" in cfg and not m.linearised else []
    if m.average is not None:
        settings.append(f"{cfg['n_samples']} samples, {cfg['distribution']}")
    if m.curvature == "trace":
        settings.append(f"{cfg['probes']} probes")
    if cfg.get("geodesic") == "exact":
        settings.append(f"exact geodesic ({cfg['steps']} RK4 steps)")
    if "gradient" in options:
        settings.append(f"gradient {cfg.get('gradient', options['gradient'])}")
    if "eps" in options:
        settings.append(f"eps {options['eps']:g}")
    settings += [f"seed {args.seed}", str(dtype or next(model.parameters()).dtype).replace("torch.", "")]
    print(f"  rho       : {result.rho:g} ({', '.join(settings)})")
    error = cfg.get("standard_error")
    if m.curvature == "trace":  # independent Hutchinson estimates per batch: the mean's standard error
        error = sum(e * e for e in cfg["errors"]) ** 0.5 / len(cfg["errors"])
    print(f"  mean      : {result.mean:.6g}" + (f" ± {error:.2g} (standard error)" if error is not None else ""))
    if cfg.get("geodesic_gap") is not None:
        print(f"  second order at the maximiser: {', '.join(f'{v:.6g}' for v in cfg['second_order_per_batch'])} "
              f"(exact − second order: {', '.join(f'{v:.3g}' for v in cfg['geodesic_gap'])})")
    print(f"  per batch : {', '.join(f'{v:.6g}' for v in result.per_batch)}")
    if m.curvature is not None:
        print(f"  errors    : {', '.join(f'{v:.2g}' for v in cfg['errors'])} per batch ("
              + ("Hutchinson standard errors)" if m.curvature == "trace" else "Lanczos residual bounds)"))
    if result.relative_size:
        print(f"  ‖Δθ‖/‖θ‖  : median {result.median_relative_size:.3g} over the batches")
    print(f"  seconds   : {result.seconds:.2f}")

    if args.json:
        extra = {"spec": str(Path(args.spec).resolve())} if spec is not None else {}
        if "symmetries" in options:
            extra["all_symmetries"] = bool(args.all_symmetries)
        _write_json(args, result, name, n_batches, n, probe, smap, extra)
    return 0


def _write_json(args, result, name, n_batches, n, probe, smap, extra) -> None:
    """``--json``: the result, what was evaluated (model, data, batches, probe, ``extra``) and the refused
    symmetries, written atomically."""
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    d = result.to_dict()
    d.update(model_dir=str(resolve_model_dir(args.model_dir).resolve()), model_class=name,
             data=str(Path(args.data).resolve()), batches=n_batches, batch_size=args.batch_size,
             examples_available=n)
    if probe is not None:
        d["probe"] = probe
    d.update(extra)
    if smap is not None:
        d["refused"] = [list(r) for r in smap.refused]
    write_text_atomic(out, json.dumps(d, indent=2, default=str) + "\n")
    print(f"  json      : {out}")
