"""Keeps benchmarks/run.py from rotting: the quick mode (tiny sizes) runs end to end, writes its report
to a temp path (never over benchmarks/RESULTS.md), and the stacked-group fast path of
PerturbationSpace gives the same sharpness as the per-group path."""
import subprocess
import sys
from pathlib import Path

import torch

from geosharp_ref.sharpness import PerturbationSpace, geodesic_sharpness
from tests.cases import TwoLayers

ROOT = Path(__file__).resolve().parent.parent


def test_bench_quick_runs_and_writes_report(tmp_path):
    results = ROOT / "benchmarks" / "RESULTS.md"
    before = results.read_bytes() if results.exists() else None
    out = tmp_path / "quick.md"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--device", "cpu",
                        "--cases", "iteration,geometry,kernels,memory,cuda", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    text = out.read_text()
    for section in ("Machine", "One Auto-PGD iteration", "Geometry alone", "Generated kernels",
                    "Peak memory", "Full evaluation on cpu", "Arithmetic floors", "torch: ",
                    "page faults per iteration", "first runs 0 untimed iterations"):
        assert section in text
    assert (results.read_bytes() if results.exists() else None) == before


def test_stacked_groups_match_per_group_path():
    torch.manual_seed(0)
    model = TwoLayers().double()
    batch = (torch.randn(4, 5, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))
    old = PerturbationSpace.stack_groups
    try:
        out = {}
        for stack in (False, True):
            PerturbationSpace.stack_groups = stack
            for metric in ("inv", "mix"):
                r = geodesic_sharpness(model, [batch], 0.1, metric=metric, n_iter=6, random_start=True)
                out[stack, metric] = (r.mean, r.perturbation_norms[0])
    finally:
        PerturbationSpace.stack_groups = old
    for metric in ("inv", "mix"):
        a, b = out[False, metric], out[True, metric]
        assert abs(a[0] - b[0]) <= 1e-12 * max(1.0, abs(a[0])) and abs(a[1] - b[1]) <= 1e-12


def test_flop_counter_counts_in_place_accumulated_products():
    """The runner's matmul-work column counts ``baddbmm_`` (Span.materialize accumulates products in
    place; torch's FlopCounterMode registers only the out-of-place op) exactly like ``bmm``."""
    from benchmarks.harness import flop_counter
    a, b, c = torch.randn(3, 5, 4), torch.randn(3, 4, 6), torch.zeros(3, 5, 6)
    with flop_counter() as fc:
        c.baddbmm_(a, b)
    with flop_counter() as ref:
        torch.bmm(a, b)
    assert fc.get_total_flops() == ref.get_total_flops() == 2 * 3 * 5 * 4 * 6
