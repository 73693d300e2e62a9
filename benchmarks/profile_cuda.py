"""Where a full evaluation's time goes on a CUDA device (benchmarks section 6's setup, one batch).

    python3 benchmarks/profile_cuda.py [--batch 256] [--iters 20] [--rows 30]

Prints, for ViT-B/32 on one batch of random images:

1. the floor: one forward + backward of the plain model (``loss.backward()``), the median of 10 after 3 warm-ups;
2. one whole evaluation (``adaptive_sharpness`` and ``geodesic_sharpness``, ``n_iter`` iterations), warm, and
   its time per iteration over the floor, with the adaptive rest one parameter at a time and in groups
   (:mod:`geosharp_ref.sharpness.rest_groups`; the accelerator default), and grouped with Auto-PGD's parking of
   an older best point (:data:`geosharp_ref.apgd.PARK_BYTES`: ViT-B/32's 350 MB vector is parked) in host memory
   (the accelerator default), in a file (the CPU's), and off;
3. the phases of one adaptive evaluation, each timed between synchronisations: gradients, geometry, parking;
4. torch.profiler's top operators of a 3-iteration adaptive evaluation, by self device time and by self CPU
   time, and the number of kernel launches per iteration.

Meant for the session's ``run`` tool; on a CPU it runs too (the device columns are then empty).
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks.cases import make_model  # noqa: E402
from benchmarks.harness import sync  # noqa: E402


def _no_parking(tensors):
    """Auto-PGD's parking turned off: nothing written, the older best point stays where it is."""
    from geosharp_ref.parking import Parked
    return Parked(None, [])


def _phases(run, dev, space_cls, apgd_module):
    """One evaluation with a synchronised timer around each phase: the gradient evaluations (``f_and_grad``), the
    geometry (the space's ascent step, combinations, inner products, scaling), parking and restoring; prints each
    phase's seconds and calls, and what is left of the wall time (the synchronisations add a little to each)."""
    spent, calls = {}, {}

    def timed(phase, fn):
        def wrapper(*args, **kwargs):
            sync(dev)
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            sync(dev)
            spent[phase] = spent.get(phase, 0.0) + time.perf_counter() - t
            calls[phase] = calls.get(phase, 0) + 1
            return out
        return wrapper

    saved = {name: getattr(space_cls, name) for name in ("ascent_step", "lincomb", "inner", "scale", "value_and_grad")}
    saved_apgd = dict(park=apgd_module.park, _restore=apgd_module._restore)
    for name in ("ascent_step", "lincomb", "inner", "scale"):
        setattr(space_cls, name, timed("geometry", saved[name]))
    space_cls.value_and_grad = lambda self, loss: timed("f_and_grad", saved["value_and_grad"](self, loss))
    apgd_module.park = timed("park", saved_apgd["park"])
    apgd_module._restore = timed("restore", saved_apgd["_restore"])
    try:
        sync(dev)
        t = time.perf_counter()
        run()
        sync(dev)
        wall = time.perf_counter() - t
    finally:
        for name, fn in saved.items():
            setattr(space_cls, name, fn)
        apgd_module.park, apgd_module._restore = saved_apgd["park"], saved_apgd["_restore"]
    parts = ", ".join(f"{k} {v:.2f} s in {calls[k]} calls" for k, v in spent.items())
    print(f"phases of one adaptive evaluation (the device's defaults): wall {wall:.2f} s; {parts}; "
          f"other {wall - sum(spent.values()):.2f} s", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rows", type=int, default=30)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    from geosharp_ref.cpu_allocator import keep_freed_memory
    from geosharp_ref.sharpness import adaptive_sharpness, geodesic_sharpness
    apgd_module = importlib.import_module("geosharp_ref.apgd")  # the module, not the function the package exports
    from geosharp_ref.parking import park
    from geosharp_ref.sharpness import space as space_module
    from geosharp_ref.sharpness.rest_groups import GROUP_BYTES
    keep_freed_memory()  # as the CLI and benchmarks/run.py do (host copies reuse freed heap memory)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, (x, y) = make_model("vit", a.quick, batch=a.batch, vit_patch=None if a.quick else 32)
    model = model.to(dev).eval()
    x = {k: v.to(dev) for k, v in x.items()}
    y = y.to(dev)
    print(f"device {dev} {torch.cuda.get_device_name() if dev.type == 'cuda' else ''} torch {torch.__version__} "
          f"tf32 {torch.backends.cuda.matmul.allow_tf32}", flush=True)

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(**x).logits, y)
        loss.backward()
        sync(dev)

    times = []
    for i in range(13):
        t = time.perf_counter()
        fwd_bwd()
        if i >= 3:
            times.append(time.perf_counter() - t)
    floor = statistics.median(times)
    print(f"floor: forward+backward {floor * 1e3:.1f} ms (min {min(times) * 1e3:.1f})", flush=True)
    model.zero_grad(set_to_none=True)

    def evaluate(measure, n_iter):
        if measure == "adaptive":
            return adaptive_sharpness(model, [(x, y)], 0.05, n_iter=n_iter)
        return geodesic_sharpness(model, [(x, y)], 0.05, metric=measure.split("-")[1], n_iter=n_iter)

    parks = dict(host=park, file=lambda ts: park(ts, medium="file"), off=_no_parking)
    rows = [("per parameter", 0, "host"), ("grouped", GROUP_BYTES, "host"),
            ("grouped, parking in a file", GROUP_BYTES, "file"), ("grouped, parking off", GROUP_BYTES, "off")]
    for measure in ("adaptive", "geodesic-inv"):
        for rest, group_bytes, parking in rows:
            space_module.GROUP_BYTES = group_bytes  # what ProductSpace uses on an accelerator
            apgd_module.park = parks[parking]
            evaluate(measure, 2)  # warm
            sync(dev)
            t = time.perf_counter()
            value = evaluate(measure, a.iters).mean
            sync(dev)
            s = time.perf_counter() - t
            print(f"{measure}, rest {rest}: {s:.2f} s for {a.iters} iterations, {s / a.iters * 1e3:.1f} ms per "
                  f"iteration = {s / a.iters / floor:.2f} x the floor; sharpness {value:.6g}", flush=True)
    space_module.GROUP_BYTES, apgd_module.park = GROUP_BYTES, park
    _phases(lambda: evaluate("adaptive", a.iters), dev, space_module.ProductSpace, apgd_module)

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        evaluate("adaptive", 3)
        sync(dev)
    ka = prof.key_averages()
    for key in ("self_device_time_total", "self_cpu_time_total"):
        try:
            print(ka.table(sort_by=key, row_limit=a.rows, max_name_column_width=60), flush=True)
        except Exception as e:  # noqa: BLE001 - a key this torch lacks
            print(f"(no table by {key}: {e})")
    launches = sum(e.count for e in ka if "cudaLaunchKernel" in e.key or "cuLaunchKernel" in e.key)
    print(f"kernel launches in the 3-iteration evaluation: {launches}", flush=True)


if __name__ == "__main__":
    main()
