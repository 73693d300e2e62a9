"""geosharp performance benchmarks (issue "Performance: benchmarks and fast paths").

    .venv/bin/python benchmarks/run.py            # full sizes, writes benchmarks/RESULTS.md  (make bench)
    .venv/bin/python benchmarks/run.py --quick    # tiny sizes, writes to a temp file         (make bench-quick)

Every comparison is a ratio measured side by side in one run: the variants are timed in interleaved
repetitions (the order rotates each repetition), the ratio is taken per repetition and reported as
median [min–max] over repetitions. Cases:

1. one Auto-PGD iteration (ascent direction = Riemannian gradient + horizontal projection, metric
   norm, two radial clips, then forward + backward through the perturbed model) on BERT-base /
   ViT-B-sized random models: geodesic/adaptive ratios; ``iteration-llama`` (section 1c): the same on a
   Llama-shaped decoder (GQA, RoPE, SwiGLU: SmolLM2-135M's layer shape, 6 layers), the attention pairs and
   everything quotiented (``symmetries="all"``) vs adaptive;
2. geometry alone for 288 GL(h) pairs: batched torch Sylvester projection (with and without the
   per-base-point factorisation) vs a scipy loop, vs mix;
3. generated kernels vs hand-written torch of the same formulas;
4. cold derivation + code generation of all built-ins (``geosharp derive --out TMP``, subprocess);
5. peak memory of geodesic vs adaptive evaluation (ru_maxrss of separate subprocesses);
6. (CUDA only) a full geodesic-sharpness evaluation of a ViT-B/32-sized model, 2048 inputs;
7. exact (RK4) vs second-order geodesic sharpness, one Auto-PGD iteration (``benchmarks/geodesic_cases.py``).
8. one Hessian-vector product on the quotient vs Euclidean, and HVP / gradient (``benchmarks/curvature_cases.py``).
9. padded text in length buckets vs the plain padded batch, one Auto-PGD iteration's model work on the tweets
   population's batch (``benchmarks/length_bucket_cases.py``).

This file is the command line; the timing machinery is in ``benchmarks/harness.py``, the cases in
``benchmarks/cases.py`` and ``benchmarks/geometry_cases.py``, the report in ``benchmarks/report.py``.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.cases import (case_cuda_full, case_derive, case_iteration, case_iteration_llama,  # noqa: E402
                              case_memory, memory_child)
from benchmarks.geodesic_cases import case_geodesic, render_geodesic  # noqa: E402
from benchmarks.curvature_cases import case_curvature, render_curvature  # noqa: E402
from benchmarks.length_bucket_cases import case_length_buckets, render_length_buckets  # noqa: E402
from benchmarks.geometry_cases import case_geometry, case_kernels  # noqa: E402
from benchmarks.harness import machine_info  # noqa: E402
from benchmarks.report import render  # noqa: E402

RESULTS = ROOT / "benchmarks" / "RESULTS.md"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke test); writes to a temp path")
    ap.add_argument("--out", type=Path, default=None, help="markdown output (default: RESULTS.md, "
                                                            "or a temp file with --quick)")
    ap.add_argument("--cases", default="iteration,iteration-llama,geometry,kernels,derive,memory,cuda,geodesic,"
                                       "curvature,length-buckets",
                    help="comma-separated: iteration, iteration-llama, geometry, kernels, derive, memory, cuda, "
                         "geodesic, curvature, length-buckets")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the raw results as JSON")
    ap.add_argument("--no-malloc-tuning", action="store_true",
                    help="leave glibc's allocator defaults (see geosharp_ref.cpu_allocator)")
    ap.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-batch", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--child-iters", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if not a.no_malloc_tuning:  # as the geosharp CLI does: no page faults for reused temporaries
        from geosharp_ref.cpu_allocator import keep_freed_memory

        keep_freed_memory()
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if a.memory_child:
        print(json.dumps(memory_child(a.memory_child, a.quick, str(device), a.child_batch, a.child_iters)))
        return 0
    cases = set(a.cases.split(","))
    q = a.quick
    if q:
        torch.set_num_threads(1)  # tiny sizes: threads only add contention on a shared machine
    t0 = time.perf_counter()
    info = machine_info(device)
    info["malloc"] = "defaults" if a.no_malloc_tuning else "keep_freed_memory (geosharp_ref.cpu_allocator)"
    res = {}

    def run(name, fn, *args):
        if name in cases:
            t = time.perf_counter()
            print(f"[bench] {name} ...", flush=True)
            res[name] = fn(*args)
            print(f"[bench] {name} done in {time.perf_counter() - t:.1f} s", flush=True)

    run("iteration", case_iteration, q, device, a.reps or (2 if q else 7))
    run("iteration-llama", case_iteration_llama, q, device, a.reps or (2 if q else 7))
    run("geometry", case_geometry, q, device, a.reps or (3 if q else 7))
    run("kernels", case_kernels, q, device, a.reps or (3 if q else 15))
    run("derive", case_derive, q)
    run("memory", case_memory, q, device, a.reps or (1 if q else 3))
    if device.type == "cuda" or q:  # quick mode: tiny sizes on any device, so the case never rots
        run("cuda", case_cuda_full, q, device)
    run("geodesic", case_geodesic, q, device, a.reps or (2 if q else 3))
    run("curvature", case_curvature, q, device, a.reps or (2 if q else 3))
    run("length-buckets", case_length_buckets, q, device, a.reps or (2 if q else 3))
    own = ("geodesic", "curvature", "length-buckets")  # cases that render their own sections
    text = render(info, {k: v for k, v in res.items() if k not in own}, q, time.perf_counter() - t0)
    if "geodesic" in res:  # case 7 (benchmarks/geodesic_cases.py) renders its own section
        text += "\n\n" + render_geodesic(res["geodesic"])
    if "curvature" in res:  # case 8 (benchmarks/curvature_cases.py) renders its own section
        text += "\n\n" + render_curvature(res["curvature"])
    if "length-buckets" in res:  # case 9 (benchmarks/length_bucket_cases.py)
        text += "\n\n" + render_length_buckets(res["length-buckets"])
    print(text)
    out = a.out or (Path(tempfile.mkdtemp(prefix="geosharp-bench-")) / "RESULTS.md" if q else RESULTS)
    out.write_text(text + "\n")
    print(f"[bench] wrote {out}")
    if a.json:
        a.json.write_text(json.dumps(dict(machine=info, results=res), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
