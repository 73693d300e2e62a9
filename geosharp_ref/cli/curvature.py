"""``geosharp curvature``: Hessian trace and top eigenvalues of a saved model, on the quotient and Euclidean.

For the mean loss over the first N·B examples of the data file (N batches of B): the Hutchinson or Hutch++
trace (``--trace-method``, with its standard error) and the top-k eigenvalues (Lanczos, with residual bounds) of the Riemannian Hessian on
the quotient by the model's symmetries (``--metric inv|mix``; ``--all-symmetries`` as for ``evaluate``) and
of the Euclidean Hessian of the same parameters (:mod:`geosharp_ref.sharpness.curvature`).
"""
from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import torch

from ..io.data import load_data, split_batches
from ..io.durable import check_output_path, write_json_atomic
from ..io.models import check_model_dir
from ..sharpness.curvature import PROBES, check_trace_method, curvature
from ..sharpness.pipeline import bucket_batches, check_length_buckets, prepare_inputs
from ..symmetry import NoAttentionPairsWarning
from .common import describe_symmetry, load_model_with_head, resolve_device, symmetry_map_quiet

__all__ = ["run"]


def _check(args):
    for name, value, low in (("--probes", args.probes, 0), ("--top-k", args.top_k, 0), ("--batch-size",
                             args.batch_size, 1), ("--batches", args.batches, 1)):
        if value < low:
            raise ValueError(f"{name} must be at least {low}, got {value}")
    check_trace_method(args.trace_method, args.probes)
    if args.probes == 0 and args.top_k == 0:
        raise ValueError("--probes 0 and --top-k 0 leave nothing to compute: keep one of them positive")
    if args.lanczos_steps is not None and args.lanczos_steps < max(1, args.top_k):
        raise ValueError(f"--lanczos-steps must be at least --top-k ({args.top_k}), got {args.lanczos_steps}")
    if args.eps < 0:
        raise ValueError(f"--eps must be non-negative, got {args.eps}")
    check_length_buckets(args.length_buckets)
    if args.json:
        check_output_path(args.json, "--json", {"MODEL_DIR": args.model_dir, "--data": args.data})


def _line(r):
    eig = ", ".join(f"{v:.6g}" for v in r.eigenvalues) or "-"
    trace = f"{r.trace:.6g} ± {r.trace_stderr:.2g}" if r.probes else "-"
    how = f"{r.probes} probes" if r.config.get("trace_method") != "hutch++" else f"Hutch++, {r.probes} HVPs"
    return f"  {r.geometry:<10}: trace {trace} ({how}); top eigenvalues {eig}; {r.seconds:.1f} s"


def run(args) -> int:
    """``geosharp curvature``: see the module doc."""
    _check(args)
    device = resolve_device(args)
    check_model_dir(args.model_dir)
    inputs, targets, n = load_data(args.data)
    batches = split_batches(inputs, targets, args.batches, args.batch_size, f"data file {args.data!r}")
    model, probe = load_model_with_head(args.model_dir, args.num_labels, (inputs, targets, n), args.seed)
    model = model.to(device)  # the library computes on the model's device (batches follow it)
    if args.length_buckets is not None:  # refused before anything is printed: text without its mask, or a model
        params, first, _, _ = prepare_inputs(model, batches[:1], None)  # whose real positions see the padding
        bucket_batches(model, params, first, args.length_buckets)
    name = type(model).__name__
    dtype = torch.float64 if args.float64 else None
    print(f"Hessian curvature of {name} ({args.model_dir})")
    print(f"  data      : {args.data}, {args.batches} batches × {args.batch_size} (first "
          f"{args.batches * args.batch_size} of {n} examples), mean loss")
    print(f"  device    : {device}")
    smap = symmetry_map_quiet(model)
    describe_symmetry(smap)
    symmetries = ["all"] if args.all_symmetries else None
    if not smap.groups and symmetries is None:
        print(f"geosharp: warning: no recognised GL(h) attention in {name}: the quotient Hessian is the adaptive "
              f"one here", file=sys.stderr)
    geometries = [args.metric] + ([] if args.no_euclidean else ["euclidean"])
    n_params = sum(p.numel() for p in model.parameters() if p.is_floating_point())
    steps = args.lanczos_steps if args.lanczos_steps is not None else max(2 * args.top_k + 10, 20)
    per_geometry = args.probes + (min(steps, n_params) if args.top_k else 0)
    from tqdm.auto import tqdm
    results = []
    t0 = time.perf_counter()
    with tqdm(total=per_geometry * len(geometries), desc="Hessian-vector products", unit="HVP",
              disable=args.no_progress) as bar:
        for geometry in geometries:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", category=NoAttentionPairsWarning)
                r = curvature(model, batches, geometry, k=args.top_k, probes=args.probes,
                              distribution=args.distribution, steps=args.lanczos_steps, seed=args.seed,
                              symmetries=None if geometry == "euclidean" else symmetries,
                              smap=None if geometry == "euclidean" else smap, eps=args.eps, dtype=dtype,
                              progress=bar.update, trace_method=args.trace_method,
                              length_buckets=args.length_buckets)
            results.append(r)
    print(f"  options   : {args.distribution} probes, Lanczos {steps} steps, seed {args.seed}, "
          f"{results[0].config['dtype'].replace('torch.', '')}, HVP {results[0].config['hvp']}-mode"
          + (", all symmetries" if args.all_symmetries else "")
          + (f", {args.length_buckets} length buckets" if args.length_buckets else ""))
    factors = results[0].config.get("factors") or []
    if args.metric and factors:
        print(f"  factors   : {len(factors)} quotiented symmetries (attention pairs"
              + (" and bindings: " + ", ".join(k for k in factors if not k.endswith((":qk", ":vo"))) + ")"
                 if args.all_symmetries else ")"))
    for r in results:
        print(_line(r))
        if r.eigenvalue_errors:
            print(f"  {'':<10}  eigenvalue residual bounds {', '.join(f'{e:.2g}' for e in r.eigenvalue_errors)}; "
                  f"dimension {r.dim}")
    print(f"  seconds   : {time.perf_counter() - t0:.2f}")
    if args.json:
        d = dict(model_dir=str(Path(args.model_dir).resolve()), model_class=name,
                 data=str(Path(args.data).resolve()), batches=args.batches, batch_size=args.batch_size,
                 examples_available=n, metric=args.metric, all_symmetries=bool(args.all_symmetries),
                 probes=args.probes, trace_method=args.trace_method, top_k=args.top_k,
                 distribution=args.distribution, seed=args.seed,
                 results={r.geometry: r.to_dict() for r in results}, refused=[list(x) for x in smap.refused])
        if probe is not None:
            d["probe"] = probe
        if args.length_buckets is not None:
            d["length_buckets"] = args.length_buckets
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(args.json, d)
        print(f"  json      : {args.json}")
    return 0

