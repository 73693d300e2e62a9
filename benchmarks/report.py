"""The report of the geosharp benchmarks: :func:`render` turns the machine description and the raw
results of :mod:`benchmarks.cases` into the markdown text of ``benchmarks/RESULTS.md`` (one section and
table per case, with each target's verdict), using the formatters below.
"""
from __future__ import annotations

import statistics

from benchmarks.cases import ITERATION_TARGETS, LLAMA_TARGET, MODEL_NAMES


def fmt_ratio(s: dict) -> str:
    return f"{s['median']:.3f} [{s['lo']:.3f}–{s['hi']:.3f}]"


def _fmt_faults(faults):
    if not faults:
        return "—"
    return " / ".join(f"{statistics.median(faults[m]):.0f}" if m in faults else "—"
                      for m in ("adaptive", "geodesic-mix", "geodesic-inv"))


def _fmt_flops(f) -> str:
    if not f:
        return "—"
    a, m, i = (f.get(k) for k in ("adaptive", "geodesic-mix", "geodesic-inv"))
    g, r = (lambda x: "—" if x is None else f"{x / 1e9:.4g}"), (lambda x: "—" if x is None else f"{x / a:.3f}")
    return f"{g(a)} / {g(m)} / {g(i)} ({r(m)}, {r(i)})"


def _ratio_cells(r: dict, key: str, target: float) -> str:
    """Per-repetition ratio | best-of | by CPU time, each with its verdict ("—" where not measured)."""
    if key not in r:
        return "— | — | —"
    return (f"{fmt_ratio(r[key])} {verdict(r[key]['median'], target)} | "
            f"{r[key]['best']:.3f} {verdict(r[key]['best'], target)} | "
            f"{fmt_ratio(r['cpu'][key])} {verdict(r['cpu'][key]['median'], target)}")


def fmt_t(ts: list) -> str:
    m = statistics.median(ts)
    return f"{m * 1e3:.1f} ms" if m < 1 else f"{m:.2f} s"


def verdict(value: float, target: float, smaller_is_better: bool = True) -> str:
    ok = value <= target if smaller_is_better else value >= target
    return "met" if ok else "**missed**"


def _generic_rows(iteration: dict) -> list:
    """The price of generality: the ProductSpace with the fast hooks off (``build_space(..., fast=False)``:
    every factor generic; attention pairs alone, then every applicable symmetry) per Auto-PGD iteration, as
    ratios to adaptive measured in the same interleaved loop as the fast GL factor's rows."""
    tg, ta = ITERATION_TARGETS["generic-mix"], ITERATION_TARGETS["generic-mix-all"]
    L = ["The generic path (`build_space(..., symmetries=[...], fast=False)`: `ProductSpace` with every factor "
         "generic, a sum over generated-kernel factors plus the adaptive rest), measured in the same loop: the "
         "attention pairs alone as one `gl_mix` factor per group (`symmetries=[]`), and every applicable "
         "symmetry quotiented (the "
         "pairs plus `all_symmetries(model, batch)` of `benchmarks/cases.py`, listed under the model):",
         "",
         f"| model | generic, attention pairs | generic/adaptive (≤ {tg:g}) | best-of | by CPU time | "
         f"generic/fast-path mix | generic, every symmetry | all/adaptive (≤ {ta:g}) | best-of | by CPU time | "
         "geometry-step time a / mix / generic / all | matmul GFLOP generic / all (ratios to adaptive) |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for kind, r in iteration.items():
        t, gm, f = r["times"], r["geometry"], r.get("flops") or {}
        extra = [k for k in r.get("factors", {}).get("generic-mix-all", [])
                 if k not in r.get("factors", {}).get("generic-mix", [])]
        name = MODEL_NAMES[kind] + (f" (+ {', '.join(extra)})" if extra else "")
        cells = [name]
        for m, k, target in (("generic-mix", "generic", tg), ("generic-mix-all", "generic_all", ta)):
            if k not in r:
                cells += ["—"] * (5 if k == "generic" else 4)
                continue
            cells += [fmt_t(t[m]), f"{fmt_ratio(r[k])} {verdict(r[k]['median'], target)}",
                      f"{r[k]['best']:.3f} {verdict(r[k]['best'], target)}",
                      f"{fmt_ratio(r['cpu'][k])} {verdict(r['cpu'][k]['median'], target)}"]
            if k == "generic":
                cells.append(fmt_ratio(r["generic_over_mix"]) if "generic_over_mix" in r else "—")
        cells.append(" / ".join(fmt_t(gm[m]) if m in gm else "—"
                                for m in ("adaptive", "geodesic-mix", "generic-mix", "generic-mix-all")))
        cells.append(" / ".join(f"{f[m] / 1e9:.4g} ({f[m] / f['adaptive']:.3f})" if m in f and f.get("adaptive")
                                else "—" for m in ("generic-mix", "generic-mix-all")))
        L.append("| " + " | ".join(cells) + " |")
    L.append("")
    return L


def _summarise_keys(keys) -> str:
    """Factor keys summarised by kind: ``6 × qk, 6 × vo, 6 × gated-units, 1 × translation``."""
    counts = {}
    for k in keys:
        kind = k.rsplit(":", 1)[-1]
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{n} × {kind}" for kind, n in counts.items())


def _llama_rows(iteration: dict) -> list:
    """Case 1c: the Llama-shaped decoder (GQA, RoPE, SwiGLU), the attention pairs alone and everything
    quotiented (``symmetries="all"``) per Auto-PGD iteration, as ratios to adaptive in one interleaved loop."""
    L = ["## 1c. One Auto-PGD iteration on a Llama-shaped decoder (GQA, RoPE, SwiGLU), random weights",
         "",
         "`geodesic-mix`: the attention pairs alone (V/O through the fast GL factor, RoPE Q/K as generic "
         "`rope_half_mix` factors, per KV head); `geodesic-mix-all`: the space of `geodesic_sharpness(..., "
         "symmetries=\"all\")` (`Quotient.resolve(..., symmetries=\"all\")`: the pairs plus every built-in "
         "found and checked on the model). Target: all/adaptive ≤ "
         f"{LLAMA_TARGET:g} (issue 30).",
         "",
         "| model | params | quotiented: pairs / all (share of parameters) | adaptive | geodesic-mix (pairs) | "
         f"geodesic-mix-all | pairs/adaptive | all/adaptive (≤ {LLAMA_TARGET:g}) | all, best-of | all, by CPU time | "
         "geometry-step time a / pairs / all | matmul GFLOP a / pairs / all (ratios) | "
         "page faults per iteration a / pairs / all |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ms = ("adaptive", "geodesic-mix", "geodesic-mix-all")
    for kind, r in iteration.items():
        t, gm, f = r["times"], r["geometry"], r.get("flops") or {}
        fac, q = r.get("factors", {}), r.get("quotiented", {})
        quot = " / ".join(f"{_summarise_keys(fac[m])} ({q[m]:.1%})" if m in fac and m in q else "—"
                          for m in ms[1:])
        pairs = (f"{fmt_ratio(r['mix'])} (best-of {r['mix']['best']:.3f}, CPU {fmt_ratio(r['cpu']['mix'])})"
                 if "mix" in r else "—")
        if "mix_all" in r:
            a = r["mix_all"]
            allc = (f"{fmt_ratio(a)} {verdict(a['median'], LLAMA_TARGET)} | {a['best']:.3f} "
                    f"{verdict(a['best'], LLAMA_TARGET)} | {fmt_ratio(r['cpu']['mix_all'])} "
                    f"{verdict(r['cpu']['mix_all']['median'], LLAMA_TARGET)}")
        else:
            allc = "— | — | —"
        flops = (" / ".join(f"{f[m] / 1e9:.4g}" if m in f else "—" for m in ms) + " (" +
                 ", ".join(f"{f[m] / f['adaptive']:.3f}" if m in f else "—" for m in ms[1:]) + ")"
                 if f.get("adaptive") else "—")
        faults = r.get("page_faults") or {}
        L.append(f"| {MODEL_NAMES[kind]} | {r['params'] / 1e6:.1f} M | {quot} | "
                 + " | ".join(fmt_t(t[m]) if m in t else "—" for m in ms) + f" | {pairs} | {allc} | "
                 + " / ".join(fmt_t(gm[m]) if m in gm else "—" for m in ms) + f" | {flops} | "
                 + " / ".join(f"{statistics.median(faults[m]):.0f}" if m in faults else "—" for m in ms) + " |")
    L.append("")
    L.append(f"Timed as section 1 ({next(iter(iteration.values())).get('warmup', 0)} untimed iterations per "
             "measure first; ratios median [min–max] over interleaved repetitions; best-of and CPU-time ratios "
             "as there).")
    L.append("")
    return L


def render(info: dict, res: dict, quick: bool, elapsed: float) -> str:
    """The markdown report: ``info`` from :func:`benchmarks.harness.machine_info`, ``res`` case name -> the
    dict its ``case_*`` function returned (absent cases leave their section out), ``elapsed`` seconds."""
    L = []
    L.append("# geosharp benchmarks" + (" (QUICK MODE: tiny sizes, numbers meaningless)" if quick else ""))
    L.append("")
    L.append("Generated by `benchmarks/run.py`" + (" --quick" if quick else "") +
             f" in {elapsed:.0f} s. Ratios: median [min–max] over interleaved repetitions in one run.")
    L.append("")
    L.append("**Machine.** " + ", ".join(f"{k}: {v}" for k, v in info.items()))
    L.append("")
    if "iteration" in res:
        L.append("## 1. One Auto-PGD iteration (geometry steps + forward/backward), random weights")
        L.append("")
        L.append("| model | params | adaptive | geodesic-mix | geodesic-inv | "
                 f"mix/adaptive (≤ {ITERATION_TARGETS['geodesic-mix']:.2f}) | mix, best-of | mix, by CPU time | "
                 f"inv/adaptive (≤ {ITERATION_TARGETS['geodesic-inv']:.2f}) | inv, best-of | inv, by CPU time | "
                 "geometry-step time a / mix / inv | matmul GFLOP a / mix / inv (ratios) | "
                 "page faults per iteration a / mix / inv |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for kind, r in res["iteration"].items():  # "—": a measure left out of a run of a subset
            name = MODEL_NAMES[kind]
            t, gm = r["times"], r["geometry"]
            tm = {m: fmt_t(t[m]) if m in t else "—" for m in ("adaptive", "geodesic-mix", "geodesic-inv")}
            gt = " / ".join(fmt_t(gm[m]) if m in gm else "—" for m in ("adaptive", "geodesic-mix", "geodesic-inv"))
            L.append(f"| {name} | {r['params'] / 1e6:.1f} M | {tm['adaptive']} | "
                     f"{tm['geodesic-mix']} | {tm['geodesic-inv']} | "
                     f"{_ratio_cells(r, 'mix', ITERATION_TARGETS['geodesic-mix'])} | "
                     f"{_ratio_cells(r, 'inv', ITERATION_TARGETS['geodesic-inv'])} | {gt} | "
                     + _fmt_flops(r.get("flops")) + " | " + _fmt_faults(r.get("page_faults")) + " |")
        L.append("")
        L.append("With the gradient at the perturbed weights (`gradient=\"perturbed\"`, the paper's Algorithm 1: "
                 "no backward pass through the ½γ̈ correction):")
        L.append("")
        L.append("| model | geodesic-mix, perturbed gradient | its mix/adaptive (≤ 1.10) | best-of | by CPU time | "
                 "matmul GFLOP (ratio) |")
        L.append("|---|---|---|---|---|---|")
        for kind, r in res["iteration"].items():
            if "mix_perturbed" not in r:
                continue
            name = MODEL_NAMES[kind]
            f = r.get("flops") or {}
            fl = (f"{f['geodesic-mix-perturbed'] / 1e9:.4g} ({f['geodesic-mix-perturbed'] / f['adaptive']:.3f})"
                  if f else "—")
            L.append(f"| {name} | {fmt_t(r['times']['geodesic-mix-perturbed'])} | "
                     f"{fmt_ratio(r['mix_perturbed'])} {verdict(r['mix_perturbed']['median'], 1.10)} | "
                     f"{r['mix_perturbed']['best']:.3f} {verdict(r['mix_perturbed']['best'], 1.10)} | "
                     f"{fmt_ratio(r['cpu']['mix_perturbed'])} | {fl} |")
        L.append("")
        if any("generic" in r or "generic_all" in r for r in res["iteration"].values()):
            L += _generic_rows(res["iteration"])
        L.append("Times: medians over the repetitions. Ratios: median [min–max] of the per-repetition "
                 "ratios; best-of: ratio of the minimum times (other tenants of a shared machine only add "
                 "time, so this estimates the ratio of the intrinsic costs); by CPU time: the same per-repetition ratios of the process's CPU time (time the process waited while other tenants ran is not counted; slowdowns from shared caches and memory bandwidth are). Matmul GFLOP: the matrix products of one "
                 "iteration counted by `torch.utils.flop_counter` (element-wise work not included), with "
                 "mix/adaptive and inv/adaptive ratios. Every measure first runs "
                 f"{next(iter(res['iteration'].values())).get('warmup', 0)} untimed iterations (as an "
                 "Auto-PGD run does before its steady state: "
                 "the process heap grows to its working size, page-faulting fresh memory in); page faults: "
                 "median minor page faults per timed iteration (0: steady state, nothing mapped anew).")
        L.append("")
    if "iteration-llama" in res:
        L += _llama_rows(res["iteration-llama"])
    if "geometry" in res:
        r = res["geometry"]
        L.append(f"## 2. Geometry alone: horizontal projection of {r['pairs']} pairs (float64; float32 rows "
                 "compared with scipy in float32)")
        L.append("")
        L.append("| variant | time | scipy loop / variant (≥ 50) |")
        L.append("|---|---|---|")
        t = r["times"]
        L.append(f"| scipy loop (`solve_sylvester` per pair) | {fmt_t(t['scipy_inv'])} | 1 |")
        L.append(f"| torch inv, incl. per-base-point factorisation (`prepare` + projection) | "
                 f"{fmt_t(t['torch_inv'])} | {fmt_ratio(r['speedup'])} {verdict(r['speedup']['median'], 50, False)} |")
        L.append(f"| torch inv, factors cached (amortised over an Auto-PGD run) | {fmt_t(t['torch_inv_cached'])} | "
                 f"{fmt_ratio(r['speedup_cached'])} {verdict(r['speedup_cached']['median'], 50, False)} |")
        L.append(f"| torch inv, no cache (generic `solve_sylvester_spd_product`, validates inputs) | "
                 f"{fmt_t(t['torch_inv_nocache'])} | {fmt_ratio(r['speedup_nocache'])} |")
        L.append(f"| torch mix (explicit), factors cached | {fmt_t(t['torch_mix_cached'])} | — |")
        if "speedup_cached_f32" in r:
            L.append(f"| *float32 (the evaluator's dtype for a float32 model):* scipy loop in float32 | "
                     f"{fmt_t(t['scipy_inv_f32'])} | 1 |")
            L.append(f"| torch inv, factors cached, float32 (vs the float32 scipy loop) | "
                     f"{fmt_t(t['torch_inv_cached_f32'])} | {fmt_ratio(r['speedup_cached_f32'])} "
                     f"{verdict(r['speedup_cached_f32']['median'], 50, False)} |")
        L.append("")
        L.append(f"inv/mix (both cached): {fmt_ratio(r['inv_over_mix'])}; max rel. diff torch vs scipy: "
                 f"{r['max_rel_diff']:.1e}" + (f" (float32 row: {r['max_rel_diff_f32']:.1e})"
                                               if "max_rel_diff_f32" in r else ""))
        L.append("")
        if "solve_times" in r:
            st_ = r["solve_times"]
            L.append(f"The Sylvester solve alone (P Λ + Λ P = C′ with P = HᵀH·GᵀG given, {r['pairs']} pairs; "
                     "the projection above adds the O(n h²) products Gᵀξ, GΛ, … that both sides pay):")
            L.append("")
            L.append("| variant | time | scipy loop / variant (≥ 50) |")
            L.append("|---|---|---|")
            L.append(f"| scipy loop (`solve_sylvester` per pair) | {fmt_t(st_['scipy_solve'])} | 1 |")
            L.append(f"| torch batched, incl. factorisation (Cholesky + `eigh`) | {fmt_t(st_['torch_solve'])} | "
                     f"{fmt_ratio(r['solve_speedup'])} {verdict(r['solve_speedup']['median'], 50, False)} |")
            L.append(f"| torch batched, factors cached (4 matmuls + 1 division) | {fmt_t(st_['torch_solve_cached'])} | "
                     f"{fmt_ratio(r['solve_speedup_cached'])} "
                     f"{verdict(r['solve_speedup_cached']['median'], 50, False)} |")
            if "solve_floor" in r:
                L.append(f"| floor: the 4 batched h×h products alone (no division) | "
                         f"{fmt_t(st_['floor_solve'])} | {fmt_ratio(r['solve_floor'])} |")
            if "solve_speedup_cached_f32" in r:
                L.append(f"| *float32:* scipy loop in float32 | {fmt_t(st_['scipy_solve_f32'])} | 1 |")
                L.append(f"| torch batched, factors cached, float32 (vs the float32 scipy loop; vs the float64 "
                         f"loop: {fmt_ratio(r['solve_speedup_cached_f32_vs64'])}) | "
                         f"{fmt_t(st_['torch_solve_cached_f32'])} | {fmt_ratio(r['solve_speedup_cached_f32'])} "
                         f"{verdict(r['solve_speedup_cached_f32']['median'], 50, False)} |")
            L.append("")
            L.append(f"max rel. diff torch vs scipy: {r['solve_max_rel_diff']:.1e}"
                     + (f" (float32 row: {r['solve_max_rel_diff_f32']:.1e})" if "solve_max_rel_diff_f32" in r else ""))
            L.append("")
            if "projection_floor" in r:
                gf = r["gemm_gflops"]
                L.append("**Arithmetic floors on this machine** (measured in the same interleaved loop): any solve "
                         "that diagonalises P needs V⁻¹C′V and VΛ̃V⁻¹, four h×h products per pair; they alone "
                         f"take {fmt_t(st_['floor_solve'])} ({gf['solve']:.1f} GFLOP/s float64), so no such "
                         f"solve can beat the scipy loop by more than {fmt_ratio(r['solve_floor'])}. Any "
                         "projection needs Gᵀξ_G, ξ_HᵀH, GΛ and HΛᵀ (four n·h² products per pair): "
                         f"{fmt_t(st_['floor_projection'])} ({gf['projection']:.1f} GFLOP/s), at most "
                         f"{fmt_ratio(r['projection_floor'])} the scipy projection loop "
                         f"({fmt_t(st_['scipy_inv'])} in this loop).")
                L.append("")
    if "kernels" in res:
        L.append("## 3. Generated kernels vs hand-written torch (same formulas, 288 pairs, float32)")
        L.append("")
        L.append("Both uncached (each call builds its own Gram inverses / Sylvester factors); the hand-written "
                 "versions use explicit h×h inverses applied by matmuls and compute shared products once. "
                 "Last column: the generated kernel with a prepared base-point cache. Rows "
                 "`second_order_geodesic + VJP`: forward E = θ + ξ + ½γ̈ and its reverse-mode derivative for a "
                 "random cotangent; generated: the generated E and its symbolically derived VJP (what "
                 "`exp2` runs in Auto-PGD); hand-written: the hand-written acceleration, θ + ξ + ½γ̈, and "
                 "autograd.")
        L.append("")
        L.append("| metric | kernel | generated | hand-written | generated/hand (≤ 1.05) | generated/hand, best-of | "
                 "max rel. diff | generated, cached | `torch.compile`, cached | compiled/eager (cached) | "
                 "compile time |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in res["kernels"]["rows"]:
            cached = fmt_t(r['times']['cached']) if 'cached' in r['times'] else "—"
            comp = (f"{fmt_t(r['times']['compiled'])} | {fmt_ratio(r['compiled_ratio'])} | "
                    f"{r['compile_seconds']:.1f} s" if "compiled" in r["times"] else "— | — | —")
            L.append(f"| {r['metric']} | {r['kernel']} | {fmt_t(r['times']['generated'])} | "
                     f"{fmt_t(r['times']['hand'])} | {fmt_ratio(r['ratio'])} "
                     f"{verdict(r['ratio']['median'], 1.05)} | {r['ratio']['best']:.3f} | "
                     f"{r['max_rel_diff']:.1e} | {cached} | {comp} |")
        L.append("")
        L.append("`torch.compile` (inductor, static shapes) of the generated kernel with the prepared cache; "
                 "compile time: its first calls, one compilation per pair shape; compiled and eager agree to "
                 + ", ".join(f"{r['compiled_max_rel_diff']:.0e}" for r in res["kernels"]["rows"]
                             if "compiled_max_rel_diff" in r) + " (float32).")
        L.append("")
    if "derive" in res:
        r = res["derive"]
        L.append("## 4. Cold derivation + code generation of all built-ins (`geosharp derive --out TMP`)")
        L.append("")
        L.append(f"{r['seconds']:.1f} s wall (subprocess, target < 30 s: {verdict(r['seconds'], 30)}); "
                 f"modules: {', '.join(r['modules'])}")
        L.append("")
    if "memory" in res:
        r = res["memory"]
        L.append(f"## 5. Peak memory, geodesic vs adaptive evaluation ({r['source']}, separate subprocesses; "
                 f"BERT-base, batch {r['batch']}, n_iter {r['n_iter']})")
        L.append("")
        L.append("| measure | peak (median) | peak − model-loaded baseline | total ratio (≤ 1.2) | "
                 "increment ratio |")
        L.append("|---|---|---|---|---|")
        kp, kb = ("cuda_peak", "cuda_base") if r["source"].startswith("cuda") else ("peak", "base")
        for m, runs in r["runs"].items():
            peak = statistics.median(x[kp] for x in runs) / 2**20
            inc = statistics.median(x[kp] - x[kb] for x in runs) / 2**20
            if m == "adaptive":
                L.append(f"| {m} | {peak:.0f} MiB | {inc:.0f} MiB | 1 | 1 |")
            else:
                L.append(f"| {m} | {peak:.0f} MiB | {inc:.0f} MiB | {fmt_ratio(r[m]['total'])} "
                         f"{verdict(r[m]['total']['median'], 1.2)} | {fmt_ratio(r[m]['increment'])} |")
        L.append("")
    if "cuda" in res:
        r = res["cuda"]
        model = "tiny ViT" if quick else "ViT-B/32"
        L.append(f"## 6. Full evaluation on {r['device']}, {model}, {r['inputs']} inputs, batches of {r['batch']}, "
                 f"{r['n_iter']} iterations")
        L.append("")
        L.append("| measure | time | peak allocated | time / adaptive |")
        L.append("|---|---|---|---|")
        t0 = r["rows"][0]["seconds"]
        for row in r["rows"]:
            peak = "—" if row["peak_gib"] is None else f"{row['peak_gib']:.2f} GiB"
            L.append(f"| {row['measure']} | {row['seconds']:.1f} s | {peak} | "
                     f"{row['seconds'] / t0:.3f} |")
        L.append("")
    return "\n".join(L)
