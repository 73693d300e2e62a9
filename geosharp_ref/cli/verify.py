"""``geosharp verify``: orbit invariance of the output and of geodesic sharpness for a saved model.

At the fixed ``--scales`` (a table), and with ``--examples N`` a hypothesis search as well
(:func:`geosharp_ref.testing.find_counterexample`): per binding (declared ones before their fixed check, the
attention pairs, the built-ins) N group elements whose action must leave the log-probabilities unchanged
(≤ 1e-10), then N orbit points moving every symmetry at once whose invariant quantities must not change
(≤ 1e-6); a failure is shrunk to a minimal counterexample and printed as one ``geosharp: error:`` line, exit 1.
"""
from __future__ import annotations

import sys
import time

import torch

from ..forward import batch_to_device, float64_inputs
from ..io.data import load_data, random_batch, split_batches
from ..io.models import check_model_dir
from ..kernels import kernel_name
from ..testing import (OUTPUT_TOL, SCALE_RANGE, Float64Copy, find_counterexample, group_elements, orbit_points)
from ..verification.orbits import (INVARIANCE_TOL, INVARIANT_QUANTITIES, QUANTITIES, orbit_invariance,
                                   orbit_quantities, parameters_set_to, relative_change)
from ..symmetry import SymmetryMap, Quotient, find_symmetries
from ..symmetry.declared import declared_bindings
from ..symmetry.summary import summary_lines
from .common import (resolve_device, check_positive, check_symmetry_options, load_model_with_head, requested_symmetries,
                     symmetry_map_quiet)

__all__ = ["run"]


def run(args) -> int:
    """``geosharp verify``: orbit invariance of the output and of geodesic sharpness for a saved model."""
    check_positive("rho", args.rho)
    if args.iters < 1:
        raise ValueError(f"--iters must be at least 1, got {args.iters}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    examples = getattr(args, "examples", None)
    if examples is not None and examples < 1:
        raise ValueError(f"--examples must be at least 1 (the number of group elements hypothesis draws per "
                         f"search), got {examples}")
    try:
        scales = [float(s) for s in str(args.scales).split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--scales must be comma-separated numbers, got {args.scales!r}") from None
    if not scales:
        raise ValueError("--scales is empty")
    for s in scales:
        check_positive("every scale in --scales", s)
    spec = check_symmetry_options(args, args.metric)
    device = resolve_device(args)
    check_model_dir(args.model_dir)
    data = load_data(args.data) if args.data else None  # fail early on a bad file
    model, _ = load_model_with_head(args.model_dir, args.num_labels, data, args.seed)
    name = type(model).__name__
    model64 = model.to(device=device, dtype=torch.float64).eval()  # in place: no second copy of the weights
    del model
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
        batch = batch_to_device((float64_inputs(batch[0]), batch[1]), device)  # float64 images, model's device
        source = f"first {b} of {n} examples of {args.data}"
    else:
        batch = random_batch(model64, args.batch_size, seed=args.seed)
        key = next(iter(batch[0]))
        source = f"random batch: {key} {tuple(batch[0][key].shape)}, targets {tuple(batch[1].shape)}"
    searched = set()
    if examples and spec is not None:  # searched before the fixed check, so a failure is shrunk
        module, decl = spec
        declared = declared_bindings(model64, module, decl, where=f"{args.spec}: BINDINGS[{kernel_name(module)!r}]")
        print(f"hypothesis search of the declared bindings of {args.spec} ({args.examples} examples each, "
              f"seed {args.seed}):")
        failure = _search_exactness(model64, batch, declared, args)
        if failure:
            return failure
        searched = {b.key for b in declared}
        print()
    symmetries = requested_symmetries(args, spec, model64, batch)
    if symmetries and symmetries[-1] == "all":
        report = find_symmetries(model64, batch, metric=args.attention_metric, seed=args.seed)
        taken = {n for b in symmetries[:-1] for n in b.param_names}
        found = [b for b in report.bindings if not taken.intersection(b.param_names)]
        for line in summary_lines([(b.key, "built-in") for b in found], indent="    ", status="bound  "):
            print(line)  # one line per family repeated over layers
        symmetries = symmetries[:-1] + found
    if symmetries is not None:
        print(f"further symmetries quotiented and moved along their orbits: {len(symmetries)} bindings "
              f"(group elements of scale a from each binding's random_element)")
    print(f"A = a·Q·diag(u) per head (Q orthogonal, u ~ U[0.5, 2], seed {args.seed}), applied with "
          f"SymmetryMap.act to a float64 copy")
    print(f"batch: {source}; rho {args.rho:g}, APGD {args.iters} iterations, float64 on {device}")
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
    if examples:
        failure = _search(model64, smap, batch, symmetries, args, skip=searched)
        if failure:
            return failure
    adaptive = ("adaptive sharpness varies (max relative change "
                f"{worst['adaptive']:.1e}), as expected" if worst["adaptive"] > INVARIANCE_TOL
                else f"adaptive sharpness changed by at most {worst['adaptive']:.1e} here")
    print(f"PASS: output, geodesic sharpness and Riemannian gradient norms invariant to ≤ {INVARIANCE_TOL:g} "
          f"(worst {max(worst[c] for c in INVARIANT_QUANTITIES):.1e}); {adaptive}"
          + (f"; the hypothesis search ({examples} examples per search, seed {args.seed}) found no counterexample"
             if examples else ""))
    return 0


def _failed(args, what: str, counterexample) -> int:
    """The shrunk counterexample as one error line (exit 1: an invariance failed, as the fixed-scale FAIL)."""
    x = counterexample.example
    print(f"geosharp: error: verify --examples {args.examples} --seed {args.seed}: hypothesis found a counterexample "
          f"and shrank it to a minimal one: {what}, scale a = {x.scale!r}, seed {x.seed}: {counterexample.message}",
          file=sys.stderr)
    return 1


def _progress(label: str, total: int):
    """A progress line every 5 s of a long search (examples run, shrinking included)."""
    last = [time.perf_counter()]

    def report(i, seconds):
        now = time.perf_counter()
        if now - last[0] >= 5.0:
            last[0] = now
            print(f"    … {label}: {i} examples run ({total} to draw, shrinking counted), {seconds:.0f} s", flush=True)
    return report


def _search_exactness(model64, batch, bindings, args):
    """Per binding, a hypothesis search over its group elements: the log-probabilities must not change by more
    than OUTPUT_TOL (float64). Returns None, or the exit code 1 after the counterexample line."""
    ref = Float64Copy(model64, batch)
    for b in bindings:
        worst, t0 = [0.0], time.perf_counter()

        def exact(element, b=b, worst=worst):
            change = ref.change(b.act(ref.params, element.value))
            worst[0] = max(worst[0], change) if change == change else float("nan")
            if not change <= OUTPUT_TOL:
                raise AssertionError(f"the log-probabilities changed by {change:.3g} (relative max-abs, float64; "
                                     f"tolerance {OUTPUT_TOL:g}), so {b.key} is not a symmetry of this model")

        found = find_counterexample(exact, group_elements(b, ref.params), examples=args.examples, seed=args.seed,
                                    progress=_progress(b.key, args.examples))
        if found is not None:
            return _failed(args, f"binding {b.key}", found)
        print(f"    searched {b.key}: {args.examples} elements, a in [{SCALE_RANGE[0]:g}, {SCALE_RANGE[1]:g}], output "
              f"change ≤ {worst[0]:.1e} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return None


def _search(model64, smap, batch, symmetries, args, skip=()):
    """``--examples N``: hypothesis searches over group elements. First per binding (each attention pair and each
    further symmetry not searched yet): the output; then orbit points moving every binding at once: the invariant
    quantities of the table. Returns None, or the exit code 1 after the counterexample line."""
    print(f"\nhypothesis search: {args.examples} examples per search, scales a log-uniform in "
          f"[{SCALE_RANGE[0]:g}, {SCALE_RANGE[1]:g}], seed {args.seed}, failures shrunk")
    params = {n: p.detach() for n, p in model64.named_parameters()}
    pairs = smap
    further = [b for b in symmetries or () if not isinstance(b, str)]
    if further:  # pairs that yield to a binding hold its parameters: moving them is the binding's business
        pairs = SymmetryMap(Quotient.assemble(params, smap, "mix", further).pairs, smap.param_shapes, smap.refused)
    failure = _search_exactness(model64, batch, list(smap.groups) + [b for b in further if b.key not in skip], args)
    if failure:
        return failure
    moving = ([pairs] if pairs.groups else []) + further
    if not moving:
        print("    no symmetry to move along: nothing more to search")
        return None
    base = orbit_quantities(model64, smap, batch, args.rho, args.iters, args.seed, symmetries)
    worst, t0 = {c: 0.0 for c in INVARIANT_QUANTITIES}, time.perf_counter()

    def invariant(point):
        with parameters_set_to(model64, point.params):  # swapped in, not a deep copy of the model per point
            vals = orbit_quantities(model64, smap, batch, args.rho, args.iters, args.seed, symmetries)
        rel = {c: relative_change(base[c], vals[c]) for c in INVARIANT_QUANTITIES}
        bad = [c for c in INVARIANT_QUANTITIES if not rel[c] <= INVARIANCE_TOL]
        for c in INVARIANT_QUANTITIES:
            worst[c] = max(worst[c], rel[c])
        if bad:
            raise AssertionError("; ".join(f"{c} changed by {rel[c]:.3g}" for c in bad)
                                 + f" (relative; tolerance {INVARIANCE_TOL:g}) moving along "
                                   f"the orbits")

    print(f"    orbit points: {len(moving)} symmetries moved at once "
          f"({len(pairs.groups)} attention pairs, {len(further)} bindings), {args.examples} examples",
          flush=True)
    found = find_counterexample(invariant, orbit_points(moving, params), examples=args.examples, seed=args.seed,
                                progress=_progress("orbit points", args.examples))
    if found is not None:
        return _failed(args, f"orbit point moving {len(moving)} symmetries at once", found)
    print(f"    searched orbit points: worst relative change {max(worst.values()):.1e} "
          f"({', '.join(f'{c} {v:.1e}' for c, v in worst.items())}; {time.perf_counter() - t0:.1f} s)")
    return None
