"""Keeps benchmarks/run.py from rotting: the quick mode (tiny sizes) runs end to end, writes its report
to a temp path (never over benchmarks/RESULTS.md), the generic rows of case 1 (ProductSpace with the fast hooks
off: attention pairs alone and every applicable symmetry) and the Llama-shaped rows of case 1c (RoPE Q/K,
V/O and gated units quotiented) give finite ratios, and the stacked buckets of the fast GL factor give the
same sharpness as one bucket per group."""
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from geosharp_ref.apgd import apgd
from geosharp_ref.sharpness import GLPairFactor, ProductSpace, model_loss
from geosharp_ref.symmetry import symmetry_map
from tests import cases
from tests.cases import TwoLayers

ROOT = Path(__file__).resolve().parent.parent


def test_bench_quick_runs_and_writes_report(tmp_path):
    results = ROOT / "benchmarks" / "RESULTS.md"
    before = results.read_bytes() if results.exists() else None
    out = tmp_path / "quick.md"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--device", "cpu",
                        "--cases", "iteration,iteration-llama,geometry,kernels,memory,cuda,length-buckets", "--out",
                        str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    text = out.read_text()
    for section in ("Machine", "One Auto-PGD iteration", "Geometry alone", "Generated kernels",
                    "Peak memory", "Full evaluation on cpu", "Arithmetic floors", "torch: ",
                    "page faults per iteration", "first runs 0 untimed iterations", "The generic path",
                    "generic/adaptive (≤ 1.25)", "all/adaptive (≤ 1.5)", "(+ classifier.weight:translation)",
                    "1c. One Auto-PGD iteration on a Llama-shaped decoder", "all/adaptive (≤ 1.25)",
                    "2 × vo, 2 × qk, 2 × gated-units, 1 × translation",
                    "9. Length buckets", "| mix | 16 |"):
        assert section in text
    assert (results.read_bytes() if results.exists() else None) == before


def test_stacked_groups_match_per_group_path():
    """The benchmark's accelerator default (equal-shaped groups stacked in one bucket of the fast GL factor)
    gives the sharpness of one bucket per group (the CPU default)."""
    torch.manual_seed(0)
    model = TwoLayers().double()
    batch = (torch.randn(4, 5, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))
    smap = symmetry_map(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    out = {}
    for stack in (False, True):
        for metric in ("inv", "mix"):
            space = ProductSpace(params, [GLPairFactor(tuple(smap.groups), metric, stack=stack)], smap.adaptive_masks)
            r = apgd(space.value_and_grad(lambda p: model_loss(model, p, batch)), space, 0.1, n_iter=6,
                     random_start=True, generator=torch.Generator().manual_seed(0))
            out[stack, metric] = (r.best_value, space.norm(r.best_xi))
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


def test_generic_rows_give_finite_ratios_on_the_tiny_case():
    """Case 1's generic-path rows (``geodesic_sharpness(..., symmetries=[])`` and with
    ``all_symmetries(model, batch)``) on the tiny BERT: finite ratios to adaptive and to the fast path, the head
    translation factor only in the second, and the report's row for them (also for a run of a subset)."""
    from benchmarks.cases import ITERATION_MEASURES, ITERATION_TARGETS, case_iteration
    from benchmarks.report import render
    assert {"generic-mix", "generic-mix-all"} <= set(ITERATION_MEASURES) <= {"adaptive"} | set(ITERATION_TARGETS)
    res = case_iteration(True, torch.device("cpu"), 1, kinds=("bert",),
                         measures=("adaptive", "geodesic-mix", "generic-mix", "generic-mix-all"))
    r = res["bert"]
    for key in ("mix", "generic", "generic_all", "generic_over_mix"):
        assert math.isfinite(r[key]["median"]) and r[key]["median"] > 0 and math.isfinite(r[key]["best"])
    for key in ("generic", "generic_all"):
        assert math.isfinite(r["cpu"][key]["median"])
    pairs = r["factors"]["generic-mix"]
    assert pairs and not any("translation" in k for k in pairs)
    assert r["factors"]["generic-mix-all"] == pairs + ["classifier.weight:translation"]
    assert r["flops"]["generic-mix"] > r["flops"]["adaptive"]
    text = render({"cpu": "test"}, {"iteration": res}, True, 0.0)
    assert "The generic path" in text and "(+ classifier.weight:translation)" in text
    assert "inv/adaptive" in text  # the fast-path table with "—" where inv was not measured


def _relu_bert():
    torch.manual_seed(0)
    return cases.bert(hidden_act="relu").to(torch.float64).eval()


def _tokens():
    return ({"input_ids": torch.randint(3, 50, (3, 6), generator=torch.Generator().manual_seed(1))},
            torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("build, batch, expected", [
    (cases.bert, _tokens, ["classifier.weight:translation"]),
    (_relu_bert, _tokens, ["bert.encoder.layer.0.intermediate.dense.weight:relu-units",
                           "bert.encoder.layer.1.intermediate.dense.weight:relu-units",
                           "classifier.weight:translation"]),
    # the ReLU units hold the last layer's weight, so its softmax translation is left out (one symmetry each)
    (lambda: cases.mlp(nn.ReLU).double(), lambda: (torch.randn(3, 4, dtype=torch.float64), torch.tensor([0, 1, 2])),
     ["0.weight:relu-units"]),
    (lambda: cases.mlp(nn.Tanh).double(), lambda: (torch.randn(3, 4, dtype=torch.float64), torch.tensor([0, 1, 2])),
     ["2.weight:translation"]),
])
def test_all_symmetries_are_the_ones_the_library_binds(build, batch, expected):
    from benchmarks.cases import all_symmetries
    assert [b.key for b in all_symmetries(build(), batch())] == expected


def test_llama_rows_quotient_rope_vo_and_gated_units():
    """Case 1c on the tiny Llama-shaped decoder (GQA 6 over 2 heads, RoPE, SwiGLU): ``geodesic-mix`` quotients
    the pairs (RoPE Q/K as ``rope_half_mix``, V/O as ``gl_mix``), ``geodesic-mix-all`` also the gated units of
    every layer and the head's translation, and the norms' weights jointly with them (what ``symmetries="all"``
    resolves); finite ratios to adaptive and
    the report's row with the ≤ 1.25 target."""
    from benchmarks.cases import LLAMA_MEASURES, ITERATION_TARGETS, case_iteration_llama, iteration_setup, make_model
    from benchmarks.report import render
    from geosharp_ref.sharpness import prepare_inputs
    assert ITERATION_TARGETS["geodesic-mix-all"] == 1.25 and LLAMA_MEASURES[0] == "adaptive"
    model, batch = make_model("llama", True, batch=2)
    _, batches, _, _ = prepare_inputs(model, [batch])
    space = iteration_setup(model, batches[0], "geodesic-mix-all")[0]
    q = space.quotient
    layers = model.config.num_hidden_layers
    assert sorted(p.kernels for p in q.pairs) == ["gl_mix"] * layers + ["rope_half_mix"] * layers
    assert [b.key for b in q.bindings if b.kernels is not None] == [
        f"model.layers.{i}.mlp.up_proj.weight:gated-units" for i in range(layers)] + ["score.weight:translation"]
    # and every norm's weights, jointly with the symmetries of their readers (folded; no factor of their own)
    norms = [f"model.layers.{i}.{n}:norm-weights" for i in range(layers)
             for n in ("input_layernorm", "post_attention_layernorm")] + ["model.norm:norm-weights"]
    assert [b.key for b in q.bindings if b.kernels is None] == norms and [n for n, _ in q.joint] == norms
    res = case_iteration_llama(True, torch.device("cpu"), 1)
    r = res["llama"]
    for key in ("mix", "mix_all"):
        assert math.isfinite(r[key]["median"]) and r[key]["median"] > 0 and math.isfinite(r["cpu"][key]["median"])
    assert 0 < r["quotiented"]["geodesic-mix"] < r["quotiented"]["geodesic-mix-all"] < 1
    assert r["joint"]["geodesic-mix"] == [] and r["joint"]["geodesic-mix-all"] == norms
    assert r["flops"]["adaptive"] < r["flops"]["geodesic-mix"] < r["flops"]["geodesic-mix-all"]
    text = render({"cpu": "test"}, {"iteration-llama": res}, True, 0.0)
    assert "all/adaptive (≤ 1.25)" in text and "2 × gated-units" in text and "2 × qk" in text


def test_the_cuda_profile_runs_quick_on_the_cpu_and_its_rows_agree():
    """``benchmarks/profile_cuda.py --quick`` (meant for a lent GPU) runs on the CPU: the floor, every row, the
    profiler tables, and the rows of one measure give the same sharpness. (On the CPU the rows differ in their
    parking only, which this tiny vector never reaches: what is tested is that the script keeps working.)"""
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_cuda.py"), "--quick", "--batch", "2",
                        "--iters", "2", "--rows", "3"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [line for line in p.stdout.splitlines() if ", rest " in line]
    assert "floor: forward+backward" in p.stdout and "kernel launches" in p.stdout and len(rows) == 8
    assert "phases of one adaptive evaluation" in p.stdout and "f_and_grad" in p.stdout
    for measure in ("adaptive", "geodesic-inv"):
        assert len({line.split("sharpness ")[1] for line in rows if line.startswith(measure + ",")}) == 1
