"""Profile one Auto-PGD iteration (as in benchmarks/run.py case 1, benchmarks/cases.py) with torch.profiler.

    .venv/bin/python benchmarks/profile_iteration.py [--model bert|vit] [--measure geodesic-inv] [--quick]

Prints the top operators by self CPU time, split into the geometry part (ascent direction, norm,
projections) and the forward/backward part (perturbed_params + model + autograd).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from benchmarks.cases import iteration_setup, make_model  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert")
    ap.add_argument("--measure", default="geodesic-inv")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", type=int, default=25)
    a = ap.parse_args(argv)
    from geosharp_ref.apgd import apgd_step
    from geosharp_ref.cpu_allocator import keep_freed_memory
    keep_freed_memory()  # as the runner and the CLI do (page faults would otherwise show as op time)
    model, batch = make_model(a.model, a.quick, batch=8 if not a.quick else 2)
    space, fg, x, rho = iteration_setup(model, batch, a.measure)
    _, g = fg(x)
    state = [x, g, space.inner(x, x)]

    def step():  # advances the iterate: every step starts from a gradient no step has used yet
        x, g, xx = state
        with record_function("geometry"):
            x_new, xx_new = apgd_step(space, x, x, g, xx, 2.0 * rho, rho, 0.75)
        with record_function("forward_backward"):
            _, g_new = fg(x_new)
        state[:] = [x_new, g_new, xx_new]

    step()  # warm
    t = time.perf_counter()
    step()
    print(f"one iteration: {time.perf_counter() - t:.3f} s ({a.measure}, {a.model}, "
          f"{torch.get_num_threads()} threads)")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows))


if __name__ == "__main__":
    main()
