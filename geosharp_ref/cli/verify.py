"""``geosharp verify``: orbit invariance of the output and of geodesic sharpness for a saved model."""
from __future__ import annotations

import copy
import sys
import time

import torch

from ..io.data import load_data, random_batch, split_batches
from ..io.models import check_model_dir
from ..verification.orbits import INVARIANCE_TOL, INVARIANT_QUANTITIES, QUANTITIES, orbit_invariance
from ..symmetry.catalogue import find_symmetries
from .common import (check_positive, check_symmetry_options, load_model_with_head, requested_symmetries,
                     symmetry_map_quiet)

__all__ = ["run"]


def run(args) -> int:
    """``geosharp verify``: orbit invariance of the output and of geodesic sharpness for a saved model."""
    check_positive("rho", args.rho)
    if args.iters < 1:
        raise ValueError(f"--iters must be at least 1, got {args.iters}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    try:
        scales = [float(s) for s in str(args.scales).split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--scales must be comma-separated numbers, got {args.scales!r}") from None
    if not scales:
        raise ValueError("--scales is empty")
    for s in scales:
        check_positive("every scale in --scales", s)
    spec = check_symmetry_options(args, args.metric)
    check_model_dir(args.model_dir)
    data = load_data(args.data) if args.data else None  # fail early on a bad file
    model, _ = load_model_with_head(args.model_dir, args.num_labels, data, args.seed)
    model64 = copy.deepcopy(model).to(torch.float64).eval()
    name = type(model).__name__
    smap = symmetry_map_quiet(model64)
    print(f"orbit-invariance check of {name} ({args.model_dir})\n")
    print(smap)
    print()
    if not smap.groups:
        print(f"geosharp: warning: no recognised GL(h) attention in {name}: there is no orbit to move along "
              f"and geodesic sharpness equals adaptive sharpness for this model", file=sys.stderr)
    rope = [k for k, why in smap.refused if "rotary" in why]
    if rope:
        print(f"Q/K refused for rotary/relative positions (adaptive instead): {', '.join(rope)}\n")

    if data is not None:
        inputs, targets, n = data
        b = min(args.batch_size, n)
        (batch,) = split_batches(inputs, targets, 1, b, f"data file {args.data!r}")
        source = f"first {b} of {n} examples of {args.data}"
    else:
        batch = random_batch(model64, args.batch_size, seed=args.seed)
        key = next(iter(batch[0]))
        source = f"random batch: {key} {tuple(batch[0][key].shape)}, targets {tuple(batch[1].shape)}"
    symmetries = requested_symmetries(args, spec, model64, batch)
    if symmetries and symmetries[-1] == "all":
        report = find_symmetries(model64, batch, metric=args.attention_metric, seed=args.seed)
        taken = {n for b in symmetries[:-1] for n in b.param_names}
        found = [b for b in report.bindings if not taken.intersection(b.param_names)]
        for b in found:
            print(f"    bound   {b.key} (built-in)")
        symmetries = symmetries[:-1] + found
    if symmetries is not None:
        print(f"further symmetries quotiented and moved along their orbits: {len(symmetries)} bindings "
              f"(group elements of scale a from each binding's random_element)")
    print(f"A = a·Q·diag(u) per head (Q orthogonal, u ~ U[0.5, 2], seed {args.seed}), applied with "
          f"SymmetryMap.act to a float64 copy")
    print(f"batch: {source}; rho {args.rho:g}, APGD {args.iters} iterations, float64")
    print("relative change |f(ψ(A, θ)) − f(θ)| / |f(θ)| (output: max-abs over the "
          f"{'log-probabilities' if symmetries else 'logits'})\n")

    t0 = time.perf_counter()
    report = orbit_invariance(model64, smap, batch, args.rho, scales, args.iters, args.seed, symmetries)
    base, rows, worst, failed = report["base"], report["rows"], report["worst"], report["failed"]

    header = ["scale a"] + list(QUANTITIES)
    cells = [[f"{a:g}"] + [f"{rel[c]:.1e}" + (" varies" if c == "adaptive" and rel[c] > INVARIANCE_TOL else "")
                           for c in QUANTITIES] for a, rel in rows]
    widths = [max(len(h), *(len(r[j]) for r in cells)) for j, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    print(fmt.format(*header).rstrip())
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print(fmt.format(*r).rstrip())
    print(f"\nat θ: geodesic-inv {base['geodesic-inv']:.6g}, geodesic-mix {base['geodesic-mix']:.6g}, "
          f"adaptive {base['adaptive']:.6g}; ‖grad‖ inv {base['grad-inv']:.6g}, mix {base['grad-mix']:.6g} "
          f"({time.perf_counter() - t0:.1f} s)")
    if failed:
        print(f"FAIL: {', '.join(failed)} changed by more than {INVARIANCE_TOL:g} (relative) along the orbit "
              f"(worst {max(worst[c] for c in failed):.1e})")
        return 1
    adaptive = ("adaptive sharpness varies (max relative change "
                f"{worst['adaptive']:.1e}), as expected" if worst["adaptive"] > INVARIANCE_TOL
                else f"adaptive sharpness changed by at most {worst['adaptive']:.1e} here")
    print(f"PASS: output, geodesic sharpness and Riemannian gradient norms invariant to ≤ {INVARIANCE_TOL:g} "
          f"(worst {max(worst[c] for c in INVARIANT_QUANTITIES):.1e}); {adaptive}")
    return 0
