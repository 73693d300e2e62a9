"""``geosharp evaluate``: adaptive or geodesic sharpness of a saved model on a saved data set."""
from __future__ import annotations

import json
from dataclasses import replace
import sys
import warnings
from pathlib import Path

import torch

from ..io.data import load_data, split_batches
from ..io.models import check_model_dir
from ..sharpness import EvaluationOptions, evaluate, rho_for_size
from ..sharpness.pipeline import check_rho
from ..symmetry import NoAttentionPairsWarning, Quotient
from .common import (check_positive, check_symmetry_options, describe_symmetry, load_model_with_head,
                     requested_symmetries, symmetry_map_quiet)

__all__ = ["run", "PROBE_RHOS"]

#: the probe radii of --target-relative-size
PROBE_RHOS = (0.01, 0.03)


def run(args) -> int:
    """``geosharp evaluate``: adaptive or geodesic sharpness of a saved model on a saved data set."""
    # every option is checked here, before the model or the data is read (the library's own checks:
    # check_rho and EvaluationOptions)
    if args.rho is not None:
        check_rho(args.rho)
    else:
        check_positive("--target-relative-size", args.target_relative_size)
    if args.iters < 1:
        raise ValueError(f"--iters must be at least 1, got {args.iters}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.batches is not None and args.batches < 1:
        raise ValueError(f"--batches must be at least 1, got {args.batches}")
    spec = check_symmetry_options(args, args.metric)
    if args.metric == "adaptive" and args.all_symmetries:
        raise ValueError("--all-symmetries quotients symmetries for geodesic sharpness: use --metric inv or mix")
    geodesic_metric = args.attention_metric if spec is not None else args.metric
    options = EvaluationOptions(
        metric=None if args.metric == "adaptive" else geodesic_metric, n_iter=args.iters, eps=args.eps,
        geodesic_correction=not args.no_geodesic_correction, metric_norm=not args.no_metric_norm,
        gradient=args.gradient, seed=args.seed, dtype=torch.float64 if args.float64 else None, progress=True)
    check_model_dir(args.model_dir)
    inputs, targets, n = load_data(args.data)
    n_batches = args.batches if args.batches is not None else max(1, n // args.batch_size)
    batches = split_batches(inputs, targets, n_batches, args.batch_size, f"data file {args.data!r}")
    model, probe = load_model_with_head(args.model_dir, args.num_labels, (inputs, targets, n), args.seed)

    name = type(model).__name__
    print(f"{args.metric} sharpness of {name} ({args.model_dir})")
    print(f"  data      : {args.data}, {n_batches} batches × {args.batch_size} (first "
          f"{n_batches * args.batch_size} of {n} examples)")
    smap, symmetries = None, None
    if args.metric != "adaptive":
        smap = symmetry_map_quiet(model)
        describe_symmetry(smap)
        symmetries = requested_symmetries(args, spec, model, batches[0])
        if symmetries is not None:  # "all" resolved once (the radius probes reuse it)
            symmetries = Quotient.resolve(model, batches[0], metric=geodesic_metric, symmetries=symmetries,
                                             smap=smap).bindings
        if not smap.groups and symmetries is None:
            print(f"geosharp: warning: no recognised GL(h) attention in {name}: geodesic sharpness equals "
                  f"adaptive sharpness for this model", file=sys.stderr)

    def measure(rho, on, progress=True):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=NoAttentionPairsWarning)
            return evaluate(model, on, rho, replace(options, progress=progress), smap=smap, symmetries=symmetries)

    rho = args.rho
    if rho is None:  # matched perturbation size: fit ρ ↦ ‖Δθ‖/‖θ‖ on the first batch from two probes
        sizes = [measure(r, batches[:1], progress=False).relative_size[0] for r in PROBE_RHOS]
        rho = rho_for_size(PROBE_RHOS, sizes, [args.target_relative_size])[0]
        print(f"  radius    : ρ = {rho:.4g} for ‖Δθ‖/‖θ‖ = {args.target_relative_size:g} (first batch: "
              + ", ".join(f"ρ {r:g} → {x:.3g}" for r, x in zip(PROBE_RHOS, sizes)) + ")")
    result = measure(rho, batches)
    cfg = result.config
    opts = f"APGD {cfg['n_iter']} iterations, {cfg['dtype'].replace('torch.', '')}"
    if smap is not None:
        opts += (f", eps {cfg['eps']:g}, geodesic correction {'on' if cfg['geodesic_correction'] else 'off'}, "
                 f"metric norm {'on' if cfg['metric_norm'] else 'off'}, gradient {cfg['gradient']}")
    if cfg.get("factors") is not None:
        print(f"  factors   : {len(cfg['factors'])} quotiented symmetries (attention pairs and bindings)"
              + (f"; {len(cfg['yielded'])} attention pairs yielded to a binding" if cfg.get("yielded") else ""))
    print(f"  measure   : {result.measure}")
    print(f"  rho       : {result.rho:g} ({opts})")
    print(f"  mean      : {result.mean:.6g}")
    print(f"  per batch : {', '.join(f'{v:.6g}' for v in result.per_batch)}")
    groups = result.relative_size_groups[0] if result.relative_size_groups else {}
    print(f"  ‖Δθ‖/‖θ‖  : median {result.median_relative_size:.3g} over the batches"
          + (" (first batch: " + ", ".join(f"{k} {v:.3g}" for k, v in groups.items()) + ")" if groups else ""))
    print(f"  seconds   : {result.seconds:.2f}")

    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        d = result.to_dict()
        d.update(model_dir=str(Path(args.model_dir).resolve()), model_class=name,
                 data=str(Path(args.data).resolve()), batches=n_batches, batch_size=args.batch_size,
                 examples_available=n)
        if probe is not None:
            d["probe"] = probe
        if spec is not None:
            d.update(spec=str(Path(args.spec).resolve()), spec_metric=args.metric)
        if symmetries is not None:
            d["all_symmetries"] = bool(args.all_symmetries)
        if smap is not None:
            d["refused"] = [list(r) for r in smap.refused]
        out.write_text(json.dumps(d, indent=2) + "\n")
        print(f"  json      : {out}")
    return 0
