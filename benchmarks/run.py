"""geosharp performance benchmarks (issue "Performance: benchmarks and fast paths").

    .venv/bin/python benchmarks/run.py            # full sizes, writes benchmarks/RESULTS.md  (make bench)
    .venv/bin/python benchmarks/run.py --quick    # tiny sizes, writes to a temp file         (make bench-quick)

Every comparison is a ratio measured side by side in one run: the variants are timed in interleaved
repetitions (the order rotates each repetition), the ratio is taken per repetition and reported as
median [min–max] over repetitions. Cases:

1. one Auto-PGD iteration (ascent direction = Riemannian gradient + horizontal projection, metric
   norm, two radial clips, then forward + backward through the perturbed model) on BERT-base /
   ViT-B-sized random models: geodesic/adaptive ratios;
2. geometry alone for 288 GL(h) pairs: batched torch Sylvester projection (with and without the
   per-base-point factorisation) vs a scipy loop, vs mix;
3. generated kernels vs hand-written torch of the same formulas;
4. cold derivation + code generation of all built-ins (``geosharp derive --out TMP``, subprocess);
5. peak memory of geodesic vs adaptive evaluation (ru_maxrss of separate subprocesses);
6. (CUDA only) a full geodesic-sharpness evaluation of a ViT-B/32-sized model, 2048 inputs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

RESULTS = ROOT / "benchmarks" / "RESULTS.md"
MODEL_NAMES = dict(bert="BERT-base (batch 8, seq 128)", vit="ViT-B/16 (batch 8, 224²)")


# ------------------------------------------------------------------------------------------------
# timing helpers
# ------------------------------------------------------------------------------------------------

def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(fns: dict, reps: int, device=torch.device("cpu"), warmup: int = 1, resources: bool = False):
    """Time each callable ``reps`` times after ``warmup`` untimed rounds, interleaved (rotating order);
    returns name -> [seconds] of wall time. With ``resources``, returns (wall, cpu, faults): also
    name -> [seconds] of this process's CPU time (time.process_time: excludes the time the process
    waits while other tenants run) and name -> [minor page faults] (getrusage: pages the kernel had to
    map and zero during the call, e.g. while the heap still grows)."""
    def minflt():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    times, cpu, faults = ({n: [] for n in names} for _ in range(3))
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            _sync(device)
            f, c, t = minflt(), time.process_time(), time.perf_counter()
            fns[n]()
            _sync(device)
            times[n].append(time.perf_counter() - t)
            cpu[n].append(time.process_time() - c)
            faults[n].append(minflt() - f)
    return (times, cpu, faults) if resources else times


def ratio_stats(num: list, den: list) -> dict:
    """Per-repetition ratios (median, min, max) and the ratio of the best (minimum) times.

    On a shared machine other tenants only ever add time, so min(num)/min(den) estimates the ratio
    of the intrinsic costs; the per-repetition median also carries the interference."""
    rs = [a / b if b else float("nan") for a, b in zip(num, den)]
    best = min(num) / min(den) if min(den) else float("nan")
    return dict(median=statistics.median(rs), lo=min(rs), hi=max(rs), n=len(rs), best=best)


def fmt_ratio(s: dict) -> str:
    return f"{s['median']:.3f} [{s['lo']:.3f}–{s['hi']:.3f}]"


def _fmt_faults(faults):
    if not faults:
        return "—"
    return " / ".join(f"{statistics.median(faults[m]):.0f}" for m in ("adaptive", "geodesic-mix", "geodesic-inv"))


def _fmt_flops(f) -> str:
    if not f:
        return "—"
    a, m, i = (f[k] for k in ("adaptive", "geodesic-mix", "geodesic-inv"))
    return f"{a / 1e9:.4g} / {m / 1e9:.4g} / {i / 1e9:.4g} ({m / a:.3f}, {i / a:.3f})"


def fmt_t(ts: list) -> str:
    m = statistics.median(ts)
    return f"{m * 1e3:.1f} ms" if m < 1 else f"{m:.2f} s"


def verdict(value: float, target: float, smaller_is_better: bool = True) -> str:
    ok = value <= target if smaller_is_better else value >= target
    return "met" if ok else "**missed**"


def machine_info(device) -> dict:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = dict(cpu=cpu, cores=os.cpu_count(), torch_threads=torch.get_num_threads(),
                torch=torch.__version__, python=platform.python_version(), platform=platform.platform(),
                device=str(device))
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


# ------------------------------------------------------------------------------------------------
# models
# ------------------------------------------------------------------------------------------------

def make_model(kind: str, quick: bool, batch: int, seed: int = 0, vit_patch: int | None = None):
    """Random-weight BERT-base / ViT-B (or tiny versions in quick mode) and one batch."""
    from transformers import (BertConfig, BertForSequenceClassification, ViTConfig,
                              ViTForImageClassification)
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    if kind == "bert":
        cfg = BertConfig() if not quick else BertConfig(hidden_size=32, num_hidden_layers=2,
                                                        num_attention_heads=2, intermediate_size=37,
                                                        vocab_size=100, max_position_embeddings=64)
        cfg._attn_implementation = "eager"
        model = BertForSequenceClassification(cfg)
        seq = 128 if not quick else 16
        x = {"input_ids": torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)}
        y = torch.randint(0, cfg.num_labels, (batch,), generator=g)
    elif kind == "vit":
        kw = {} if not quick else dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=37, image_size=32, patch_size=8)
        if vit_patch:
            kw["patch_size"] = vit_patch
        cfg = ViTConfig(num_labels=10, **kw)
        cfg._attn_implementation = "eager"
        model = ViTForImageClassification(cfg)
        x = {"pixel_values": torch.randn(batch, cfg.num_channels, cfg.image_size, cfg.image_size,
                                         generator=g)}
        y = torch.randint(0, cfg.num_labels, (batch,), generator=g)
    else:
        raise ValueError(kind)
    return model.eval(), (x, y)


# ------------------------------------------------------------------------------------------------
# case 1: one Auto-PGD iteration
# ------------------------------------------------------------------------------------------------

def _iteration_setup(model, batch, measure, rho=0.05, seed=0):
    """(space, f_and_grad, x, g) exactly as ``sharpness._evaluate`` builds them."""
    from geosharp_ref.sharpness import PerturbationSpace, _prepare, default_loss, model_loss
    from geosharp_ref.symmetry_map import symmetry_map

    params, batches, device, dtype = _prepare(model, [batch], rho, None)
    batch = batches[0]
    groups, masks, metric = (), None, None
    if measure != "adaptive":
        smap = symmetry_map(model)
        groups, masks, metric = smap.groups, smap.adaptive_masks, measure.split("-")[1]
    space = PerturbationSpace(params, groups, masks, metric=metric,
                              gradient="perturbed" if measure.endswith("-perturbed") else "exact")

    f_and_grad = space.value_and_grad(lambda params: model_loss(model, params, batch, default_loss))

    gen = torch.Generator().manual_seed(seed)
    x = space.project(space.random(rho, gen), rho)
    return space, f_and_grad, x, rho


def _one_iteration(state, split):
    """The body of one ``apgd`` iteration (momentum 0.75), timed in two parts: the geometry
    (:func:`geosharp_ref.apgd.apgd_step`: ascent direction, step norms, two radial clips) and the
    forward + backward through the perturbed model. ``state`` = [space, f_and_grad, x, ρ, g, ‖x‖²]
    advances to the new iterate, so every call starts from a gradient no step has used yet (as in
    Auto-PGD: the cotangent path memoises its Gram products per gradient, and a repeated step from
    the same gradient would skip them)."""
    from geosharp_ref.apgd import apgd_step
    space, f_and_grad, x, rho, g, xx = state  # ‖x‖² is known to Auto-PGD from the previous step
    t0 = time.perf_counter()
    x_new, xx_new = apgd_step(space, x, x, g, xx, 2.0 * rho, rho, 0.75)
    _sync(x_new[0].device)
    t1 = time.perf_counter()
    _, g_new = f_and_grad(x_new)
    split.append(t1 - t0)
    state[2], state[4], state[5] = x_new, g_new, xx_new


def _flop_counter():
    """``torch.utils.flop_counter.FlopCounterMode`` that also counts the in-place ``baddbmm_`` (the
    accumulated products of :meth:`geosharp_ref.lazy_blocks.Span.materialize`; torch registers only
    the out-of-place op)."""
    from torch.utils.flop_counter import FlopCounterMode

    def baddbmm_flops(self_shape, a_shape, b_shape, out_shape=None, **kwargs):
        (batch, rows, inner), cols = a_shape, b_shape[-1]
        return 2 * batch * rows * inner * cols  # as torch counts bmm/baddbmm (the accumulation not counted)
    return FlopCounterMode(display=False, custom_mapping={torch.ops.aten.baddbmm_: baddbmm_flops})


#: untimed Auto-PGD iterations per measure before the timed ones (case 1)
ITERATION_WARMUP = 4


def case_iteration(quick: bool, device, reps: int) -> dict:
    out = {}
    measures = ["adaptive", "geodesic-mix", "geodesic-inv", "geodesic-mix-perturbed"]
    for kind in ("bert", "vit"):
        model, batch = make_model(kind, quick, batch=8 if not quick else 2)
        model = model.to(device)
        batch = ({k: v.to(device) for k, v in batch[0].items()}, batch[1].to(device))
        states, splits = {}, {}
        for m in measures:
            space, fg, x, rho = _iteration_setup(model, batch, m)
            _, g = fg(x)
            states[m] = [space, fg, x, rho, g, space.inner(x, x)]
            splits[m] = []
        fns = {m: (lambda m=m: _one_iteration(states[m], splits[m])) for m in measures}
        # untimed iterations first, as the start of any Auto-PGD run: until the heap has grown to its
        # steady size, an iteration page-faults hundreds of MB in (about 1 s of system time on BERT-base)
        warmup = 0 if quick else ITERATION_WARMUP
        times, cpu, faults = interleaved(fns, reps, device, warmup=warmup, resources=True)
        geo = {m: splits[m][-reps:] for m in measures}
        flops = {}
        for m in measures:  # matrix-product work of one iteration: deterministic, unlike the times
            with _flop_counter() as fc:
                _one_iteration(states[m], [])
            flops[m] = fc.get_total_flops()
        out[kind] = dict(
            params=sum(p.numel() for p in model.parameters()),
            times={m: times[m] for m in measures},
            geometry={m: geo[m] for m in measures},
            flops=flops,
            mix=ratio_stats(times["geodesic-mix"], times["adaptive"]),
            inv=ratio_stats(times["geodesic-inv"], times["adaptive"]),
            mix_perturbed=ratio_stats(times["geodesic-mix-perturbed"], times["adaptive"]),
            cpu_times=cpu,
            page_faults=faults,
            warmup=warmup,
            cpu={k: ratio_stats(cpu[m], cpu["adaptive"]) for k, m in
                 (("mix", "geodesic-mix"), ("inv", "geodesic-inv"), ("mix_perturbed", "geodesic-mix-perturbed"))},
        )
        del states, model
    return out


# ------------------------------------------------------------------------------------------------
# case 2 & 3: geometry alone / generated vs hand-written kernels
# ------------------------------------------------------------------------------------------------

def _pair_shapes(quick: bool):
    """12 layers × 12 heads × (Q/K: n = m = 769; V/O: n = 769, m = 768), h = 64 (bias rows)."""
    if quick:
        return [(2 * 2, 9, 9, 4), (2 * 2, 9, 8, 4)]
    return [(12 * 12, 769, 769, 64), (12 * 12, 769, 768, 64)]


def _pair_data(quick, dtype=torch.float64, seed=0, device=torch.device("cpu")):
    g = torch.Generator().manual_seed(seed)
    data = []
    for b, n, m, h in _pair_shapes(quick):
        G = torch.randn(b, n, h, generator=g, dtype=dtype) / math.sqrt(n)
        H = torch.randn(b, m, h, generator=g, dtype=dtype) / math.sqrt(m)
        xG = torch.randn(b, n, h, generator=g, dtype=dtype) / math.sqrt(n)
        xH = torch.randn(b, m, h, generator=g, dtype=dtype) / math.sqrt(m)
        data.append(tuple(t.to(device) for t in (G, H, xG, xH)))
    return data


def _max_rel_diff(reference, got) -> float:
    """max |reference − got| / max |got| (reference a numpy array, got a tensor on any device/dtype)."""
    return float((torch.as_tensor(reference) - got.cpu().double()).abs().max() / got.abs().max())


def _scipy_inv_projection(data):
    """The same ``inv`` projection, one pair at a time: numpy + scipy.linalg.solve_sylvester."""
    import numpy as np
    from scipy.linalg import solve_sylvester
    out = []
    for G, H, xG, xH in data:
        G, H, xG, xH = (t.cpu().numpy() for t in (G, H, xG, xH))
        rG, rH = np.empty_like(xG), np.empty_like(xH)
        for i in range(G.shape[0]):
            S2 = G[i].T @ G[i]
            S1 = H[i].T @ H[i]
            C = S1 @ (G[i].T @ xG[i]) - xH[i].T @ (H[i] @ S2)
            P = S1 @ S2
            L = solve_sylvester(P, P, C)
            rG[i] = xG[i] - G[i] @ L
            rH[i] = xH[i] + H[i] @ L.T
        out.append((rG, rH))
    return out


def case_geometry(quick: bool, device, reps: int) -> dict:
    """inv projection: batched torch (a) including the per-base-point factorisation (``prepare`` +
    cached projection, what one isolated call costs) and (b) with the factors cached (amortised over
    an Auto-PGD run: only the projection), vs a scipy.linalg.solve_sylvester loop; vs mix."""
    import numpy as np

    from codegen.generated import gl_inv, gl_mix
    data = _pair_data(quick, device=device)
    pairs = sum(d[0].shape[0] for d in data)
    inv_caches = [gl_inv.prepare(d[0], d[1]) for d in data]
    mix_caches = [gl_mix.prepare(d[0], d[1]) for d in data]

    def torch_inv():  # one isolated call: factorise, then project
        return [gl_inv.horizontal_projection(*d, cache=gl_inv.prepare(d[0], d[1])) for d in data]

    def torch_inv_cached(data=data, caches=inv_caches):
        return [gl_inv.horizontal_projection(*d, cache=c) for d, c in zip(data, caches)]

    def torch_inv_nocache():  # the generic path: solve_sylvester_spd_product (factorises inside)
        return [gl_inv.horizontal_projection(*d) for d in data]

    def torch_mix_cached():
        return [gl_mix.horizontal_projection(*d, cache=c) for d, c in zip(data, mix_caches)]

    # the evaluator's dtype for a float32 model, against numpy/scipy in float32 as well
    data32 = [tuple(t.float() for t in d) for d in data]
    inv_caches32 = [gl_inv.prepare(d[0], d[1]) for d in data32]

    def torch_inv_cached_f32():
        return torch_inv_cached(data32, inv_caches32)

    def scipy_inv(data=data):
        return _scipy_inv_projection(data)

    def scipy_inv_f32():  # LAPACK's single-precision routines
        return scipy_inv(data32)

    # agreement with the float64 scipy loop
    ref = scipy_inv()

    def rel_proj(got):
        return max(_max_rel_diff(r[k], g[k]) for r, g in zip(ref, got) for k in (0, 1))
    err = max(rel_proj(fn()) for fn in (torch_inv, torch_inv_cached, torch_inv_nocache))
    err32 = rel_proj(torch_inv_cached_f32())
    times = interleaved(dict(torch_inv=torch_inv, torch_inv_cached=torch_inv_cached,
                             torch_inv_nocache=torch_inv_nocache, scipy_inv=scipy_inv,
                             torch_mix_cached=torch_mix_cached, torch_inv_cached_f32=torch_inv_cached_f32,
                             scipy_inv_f32=scipy_inv_f32), reps, device)

    # The Sylvester solve alone (S1 = HᵀH, S2 = GᵀG, C' given): what the scipy loop replaces.
    from codegen import runtime as rt
    systems = [gl_inv.sylvester_system(*d) for d in data]
    sys_np = [tuple(t.cpu().numpy() for t in sy) for sy in systems]

    def scipy_solve(systems_np=sys_np):
        from scipy.linalg import solve_sylvester
        out = []
        for S1, S2, C in systems_np:
            out.append([solve_sylvester(S1[i] @ S2[i], S1[i] @ S2[i], C[i]) for i in range(C.shape[0])])
        return out

    sys_np32 = [tuple(a.astype("float32") for a in sy) for sy in sys_np]

    def scipy_solve_f32():
        return scipy_solve(sys_np32)

    def torch_solve():  # factorise (Cholesky + eigh) and solve
        return [rt.solve_sylvester_factored(rt.sylvester_spd_product_factors(S1, S2), C) for S1, S2, C in systems]

    def torch_solve_cached(caches=inv_caches, systems=systems):
        return [rt.solve_sylvester_factored(c.sylvester, sy[2]) for c, sy in zip(caches, systems)]

    systems32 = [gl_inv.sylvester_system(*d) for d in data32]

    def torch_solve_cached_f32():
        return torch_solve_cached(inv_caches32, systems32)

    def floor_solve():  # the four batched h×h products of the cached solve without the division
        return [c.sylvester.V @ ((c.sylvester.V_inv @ sy[2]) @ c.sylvester.V) @ c.sylvester.V_inv
                for c, sy in zip(inv_caches, systems)]

    lams = [torch.randn_like(sy[2]) for sy in systems]

    def floor_projection():  # the projection's four n·h² products alone: Gᵀξ_G, ξ_HᵀH, GΛ, HΛᵀ
        return [(G.mT @ xG, xH.mT @ H, G @ L, H @ L.mT) for (G, H, xG, xH), L in zip(data, lams)]

    ref_s = scipy_solve()

    def rel(got):
        return max(_max_rel_diff(np.stack(r), g) for r, g in zip(ref_s, got))
    err_s, err_s32 = rel(torch_solve_cached()), rel(torch_solve_cached_f32())
    stimes = interleaved(dict(scipy_solve=scipy_solve, torch_solve=torch_solve,
                              torch_solve_cached=torch_solve_cached, floor_solve=floor_solve,
                              floor_projection=floor_projection, scipy_inv=scipy_inv,
                              torch_solve_cached_f32=torch_solve_cached_f32, scipy_solve_f32=scipy_solve_f32),
                         reps, device)
    h = data[0][0].shape[-1]
    solve_flop = 4 * pairs * 2 * h ** 3
    proj_flop = sum(4 * 2 * G.shape[0] * G.shape[1] * h * h for G, *_ in data)
    return dict(pairs=pairs, times=times, max_rel_diff=err, solve_times=stimes, solve_max_rel_diff=err_s,
                max_rel_diff_f32=err32, solve_max_rel_diff_f32=err_s32,
                speedup_cached_f32=ratio_stats(times["scipy_inv_f32"], times["torch_inv_cached_f32"]),
                solve_speedup_cached_f32=ratio_stats(stimes["scipy_solve_f32"], stimes["torch_solve_cached_f32"]),
                solve_speedup_cached_f32_vs64=ratio_stats(stimes["scipy_solve"], stimes["torch_solve_cached_f32"]),
                solve_speedup=ratio_stats(stimes["scipy_solve"], stimes["torch_solve"]),
                solve_speedup_cached=ratio_stats(stimes["scipy_solve"], stimes["torch_solve_cached"]),
                solve_floor=ratio_stats(stimes["scipy_solve"], stimes["floor_solve"]),
                projection_floor=ratio_stats(stimes["scipy_inv"], stimes["floor_projection"]),
                gemm_gflops=dict(solve=solve_flop / statistics.median(stimes["floor_solve"]) / 1e9,
                                 projection=proj_flop / statistics.median(stimes["floor_projection"]) / 1e9),
                speedup=ratio_stats(times["scipy_inv"], times["torch_inv"]),
                speedup_cached=ratio_stats(times["scipy_inv"], times["torch_inv_cached"]),
                speedup_nocache=ratio_stats(times["scipy_inv"], times["torch_inv_nocache"]),
                inv_over_mix=ratio_stats(times["torch_inv_cached"], times["torch_mix_cached"]))


# hand-written torch of the same formulas (independent of the generator), written the way one
# would by hand for speed: explicit h×h inverses of the Gram matrices applied by matmuls, shared
# products (Gᵀξ and its transpose) computed once. ``cache`` optional, as in the generated kernels.
def _inv(X):
    L = torch.linalg.cholesky(X.mT @ X)
    Li = torch.linalg.solve_triangular(L, torch.eye(L.shape[-1], dtype=L.dtype, device=L.device).expand_as(L),
                                       upper=False)
    return Li.mT @ Li


def hand_inv_acc(G, H, xG, xH):
    def one(X, x):
        Si = _inv(X)
        t = X.mT @ x
        return x @ (Si @ (t + t.mT)) - X @ (Si @ (x.mT @ x))
    return one(G, xG), one(H, xH)


def hand_mix_acc(G, H, xG, xH):
    Gi, Hi = _inv(G), _inv(H)
    tG, tH = G.mT @ xG, H.mT @ xH
    aG = G @ ((xH.mT @ xH) @ Hi) - xG @ ((tH + tH.mT) @ Hi)  # inverse folded into the h×h factors
    aH = H @ ((xG.mT @ xG) @ Gi) - xH @ ((tG + tG.mT) @ Gi)
    return aG, aH


def hand_inv_proj(G, H, xG, xH):
    from codegen.runtime import solve_sylvester_spd_product
    S2, S1 = G.mT @ G, H.mT @ H
    L = solve_sylvester_spd_product(S1, S2, S1 @ (G.mT @ xG) - (xH.mT @ H) @ S2)
    return xG - G @ L, xH + H @ L.mT


def hand_mix_proj(G, H, xG, xH):
    Gi, Hi = _inv(G), _inv(H)
    Lam = 0.5 * (Gi @ (G.mT @ xG) - (xH.mT @ H) @ Hi)
    return xG - G @ Lam, xH + H @ Lam.mT


def hand_inv_grad(G, H, eG, eH):
    return eG @ (G.mT @ G), eH @ (H.mT @ H)


def hand_mix_grad(G, H, eG, eH):
    Gi, Hi = _inv(G), _inv(H)
    return eG @ Hi, eH @ Gi


def _second_order_fwd_bwd(acc):
    """θ + ξ + ½γ̈ from a hand-written acceleration, differentiated by autograd (cotangent ū)."""
    def run(G, H, xG, xH, cG, cH):
        xi = (xG.detach().requires_grad_(True), xH.detach().requires_grad_(True))
        aG, aH = acc(G, H, *xi)
        E = (G + xi[0] + 0.5 * aG, H + xi[1] + 0.5 * aH)
        grads = torch.autograd.grad(E, xi, (cG, cH))
        return tuple(e.detach() for e in E), grads
    return run


def _generated_fwd_bwd(mod):
    """The generated forward (E and the products its VJP reuses), then the generated VJP with them:
    what exp2 and its backward run."""
    def run(G, H, xG, xH, cG, cH, cache=None):
        E_G, E_H, saved = mod.second_order_geodesic_fwd(G, H, xG, xH, cache=cache)
        return (E_G, E_H), mod.second_order_geodesic_vjp(G, H, xG, xH, cG, cH, cache=cache, saved=saved)
    return run


def case_kernels(quick: bool, device, reps: int) -> dict:
    from codegen.generated import gl_inv, gl_mix
    data = _pair_data(quick, dtype=torch.float32, device=device)
    hand = {("inv", "geodesic_acceleration"): hand_inv_acc, ("mix", "geodesic_acceleration"): hand_mix_acc,
            ("inv", "horizontal_projection"): hand_inv_proj, ("mix", "horizontal_projection"): hand_mix_proj,
            ("inv", "riemannian_gradient"): hand_inv_grad, ("mix", "riemannian_gradient"): hand_mix_grad,
            ("inv", "second_order_geodesic + VJP"): _second_order_fwd_bwd(hand_inv_acc),
            ("mix", "second_order_geodesic + VJP"): _second_order_fwd_bwd(hand_mix_acc)}
    mods = dict(inv=gl_inv, mix=gl_mix)
    cots = [tuple(torch.randn_like(t) for t in d[2:]) for d in data]
    caches = {m: [mod.prepare(d[0], d[1]) for d in data] for m, mod in mods.items()}
    rows = []
    for (metric, fn), hf in hand.items():
        if fn.endswith("VJP"):  # forward + backward: outputs ((E_G, E_H), (ξ̄_G, ξ̄_H))
            gf, args = _generated_fwd_bwd(mods[metric]), [d + c for d, c in zip(data, cots)]
            flat = lambda r: [t for part in r for t in part]  # noqa: E731
        else:
            gf, args, flat = getattr(mods[metric], fn), data, (lambda r: r)
        a = [flat(gf(*d)) for d in args]
        b = [flat(hf(*d)) for d in args]
        err = max(float((x - y).abs().max() / y.abs().max()) for pa, pb in zip(a, b) for x, y in zip(pa, pb))
        cs = caches[metric]
        fns = dict(generated=lambda: [gf(*d) for d in args], hand=lambda: [hf(*d) for d in args],
                   cached=lambda: [gf(*d, cache=c) for d, c in zip(args, cs)])
        row = dict(metric=metric, kernel=fn, max_rel_diff=err)
        if not quick or (metric, fn) == ("mix", "riemannian_gradient"):  # quick: one compile, so it never rots
            cf, row["compile_seconds"], row["compiled_max_rel_diff"] = _compiled(gf, args, cs, flat)
            fns["compiled"] = lambda: [cf(*d, cache=c) for d, c in zip(args, cs)]
        times = interleaved(fns, reps, device)
        row.update(times=times, ratio=ratio_stats(times["generated"], times["hand"]))
        if "compiled" in times:
            row["compiled_ratio"] = ratio_stats(times["compiled"], times["cached"])
        rows.append(row)
    return dict(rows=rows)


def _compiled(fn, args, caches, flat):
    """``torch.compile`` of a generated kernel (inductor, static shapes) called with the prepared caches:
    returns the compiled callable, the seconds its first calls took (compilation for every shape) and its
    largest relative difference from the eager kernel."""
    cf = torch.compile(fn, dynamic=False)
    t = time.perf_counter()
    got = [flat(cf(*d, cache=c)) for d, c in zip(args, caches)]
    seconds = time.perf_counter() - t
    ref = [flat(fn(*d, cache=c)) for d, c in zip(args, caches)]
    err = max(float((x - y).abs().max() / y.abs().max()) for pa, pb in zip(got, ref) for x, y in zip(pa, pb))
    return cf, seconds, err


# ------------------------------------------------------------------------------------------------
# case 4: cold derivation + code generation
# ------------------------------------------------------------------------------------------------

def case_derive(quick: bool) -> dict:
    exe = Path(sys.executable).with_name("geosharp")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "geosharp_ref.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        r = subprocess.run(cmd + ["derive", "--out", tmp], cwd=ROOT, capture_output=True, text=True)
        dt = time.perf_counter() - t
        files = sorted(p.name for p in Path(tmp).glob("*.py"))
    if r.returncode != 0:
        raise RuntimeError(f"geosharp derive failed:\n{r.stdout}\n{r.stderr}")
    return dict(seconds=dt, modules=[f for f in files if f != "__init__.py"])


# ------------------------------------------------------------------------------------------------
# case 5: peak memory (separate subprocesses, ru_maxrss / cuda max_memory_allocated)
# ------------------------------------------------------------------------------------------------

def _maxrss_bytes() -> int:
    """Peak resident set of this process. Linux: VmHWM of /proc/self/status (per address space;
    ru_maxrss would carry the parent's peak across fork + exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def memory_child(measure: str, quick: bool, device_name: str, batch: int, n_iter: int) -> dict:
    """Runs in its own process: build the model, record the baseline peak, evaluate, record the peak."""
    from geosharp_ref.sharpness import adaptive_sharpness, geodesic_sharpness
    device = torch.device(device_name)
    model, (x, y) = make_model("bert", quick, batch=batch)
    model = model.to(device)
    x = {k: v.to(device) for k, v in x.items()}
    y = y.to(device)
    with torch.no_grad():
        model(**x)  # allocator / thread pools warm, like any evaluation's start
    base = _maxrss_bytes()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        cbase = torch.cuda.memory_allocated()
    t = time.perf_counter()
    if measure == "adaptive":
        res = adaptive_sharpness(model, [(x, y)], 0.05, n_iter=n_iter)
    else:
        res = geodesic_sharpness(model, [(x, y)], 0.05, metric=measure.split("-")[1], n_iter=n_iter)
    out = dict(measure=measure, base=base, peak=_maxrss_bytes(), seconds=time.perf_counter() - t,
               sharpness=res.mean)
    if device.type == "cuda":
        torch.cuda.synchronize()
        out.update(cuda_base=cbase, cuda_peak=torch.cuda.max_memory_allocated())
    return out


def case_memory(quick: bool, device, reps: int) -> dict:
    batch, n_iter = (2, 2) if quick else (4, 1)
    measures = ["adaptive", "geodesic-mix", "geodesic-inv", "geodesic-mix-perturbed"]
    runs = {m: [] for m in measures}
    for r in range(reps):
        for m in measures[r % 3:] + measures[:r % 3]:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-child", m,
                   "--device", str(device), "--child-batch", str(batch), "--child-iters", str(n_iter)]
            if quick:
                cmd.append("--quick")
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"memory child {m} failed:\n{p.stderr[-3000:]}")
            runs[m].append(json.loads(p.stdout.strip().splitlines()[-1]))
    key_peak, key_base = ("cuda_peak", "cuda_base") if device.type == "cuda" else ("peak", "base")
    out = dict(batch=batch, n_iter=n_iter, runs=runs, source="cuda max_memory_allocated"
               if device.type == "cuda" else "VmHWM / ru_maxrss")
    for m in measures[1:]:
        out[m] = dict(
            total=ratio_stats([x[key_peak] for x in runs[m]], [x[key_peak] for x in runs["adaptive"]]),
            increment=ratio_stats([x[key_peak] - x[key_base] for x in runs[m]],
                                  [x[key_peak] - x[key_base] for x in runs["adaptive"]]))
    return out


# ------------------------------------------------------------------------------------------------
# case 6: CUDA full evaluation (ViT-B/32, 2048 inputs, batches of 256, 20 iterations)
# ------------------------------------------------------------------------------------------------

def case_cuda_full(quick: bool, device) -> dict:
    """One full evaluation per measure (ViT-B/32, 2048 inputs in batches of 256, 20 iterations): time and
    peak allocated memory. Meant for a CUDA device; the quick mode runs it at tiny sizes on any device
    (peak memory only on CUDA), so that ``make test`` keeps it working without a GPU."""
    from geosharp_ref.sharpness import adaptive_sharpness, geodesic_sharpness
    n_inputs, bs, n_iter = (2048, 256, 20) if not quick else (8, 4, 2)
    model, _ = make_model("vit", quick, batch=1, vit_patch=None if quick else 32)
    model = model.to(device)
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n_inputs, cfg.num_channels, cfg.image_size, cfg.image_size, generator=g)
    Y = torch.randint(0, cfg.num_labels, (n_inputs,), generator=g)
    batches = [({"pixel_values": X[i:i + bs].to(device)}, Y[i:i + bs].to(device))
               for i in range(0, n_inputs, bs)]
    cuda = device.type == "cuda"
    rows = []
    for measure in ("adaptive", "geodesic-mix", "geodesic-inv"):
        base = 0
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        t = time.perf_counter()
        if measure == "adaptive":
            res = adaptive_sharpness(model, batches, 0.05, n_iter=n_iter)
        else:
            res = geodesic_sharpness(model, batches, 0.05, metric=measure.split("-")[1], n_iter=n_iter)
        _sync(device)
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**30 if cuda else None
        rows.append(dict(measure=measure, seconds=time.perf_counter() - t, peak_gib=peak, sharpness=res.mean))
    return dict(inputs=n_inputs, batch=bs, n_iter=n_iter, device=str(device), rows=rows)


# ------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------

def render(info: dict, res: dict, quick: bool, elapsed: float) -> str:
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
        L.append("| model | params | adaptive | geodesic-mix | geodesic-inv | mix/adaptive (≤ 1.10) | "
                 "mix, best-of | mix, by CPU time | inv/adaptive (≤ 1.25) | inv, best-of | inv, by CPU time | "
                 "geometry-step time a / mix / inv | matmul GFLOP a / mix / inv (ratios) | "
                 "page faults per iteration a / mix / inv |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for kind, r in res["iteration"].items():
            name = MODEL_NAMES[kind]
            t, gm = r["times"], r["geometry"]
            L.append(f"| {name} | {r['params'] / 1e6:.1f} M | {fmt_t(t['adaptive'])} | "
                     f"{fmt_t(t['geodesic-mix'])} | {fmt_t(t['geodesic-inv'])} | "
                     f"{fmt_ratio(r['mix'])} {verdict(r['mix']['median'], 1.10)} | "
                     f"{r['mix']['best']:.3f} {verdict(r['mix']['best'], 1.10)} | "
                     f"{fmt_ratio(r['cpu']['mix'])} {verdict(r['cpu']['mix']['median'], 1.10)} | "
                     f"{fmt_ratio(r['inv'])} {verdict(r['inv']['median'], 1.25)} | "
                     f"{r['inv']['best']:.3f} {verdict(r['inv']['best'], 1.25)} | "
                     f"{fmt_ratio(r['cpu']['inv'])} {verdict(r['cpu']['inv']['median'], 1.25)} | "
                     f"{fmt_t(gm['adaptive'])} / {fmt_t(gm['geodesic-mix'])} / {fmt_t(gm['geodesic-inv'])} | "
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke test); writes to a temp path")
    ap.add_argument("--out", type=Path, default=None, help="markdown output (default: RESULTS.md, "
                                                            "or a temp file with --quick)")
    ap.add_argument("--cases", default="iteration,geometry,kernels,derive,memory,cuda")
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
    run("geometry", case_geometry, q, device, a.reps or (3 if q else 7))
    run("kernels", case_kernels, q, device, a.reps or (3 if q else 15))
    run("derive", case_derive, q)
    run("memory", case_memory, q, device, a.reps or (1 if q else 3))
    if device.type == "cuda" or q:  # quick mode: tiny sizes on any device, so the case never rots
        run("cuda", case_cuda_full, q, device)
    text = render(info, res, q, time.perf_counter() - t0)
    print(text)
    out = a.out or (Path(tempfile.mkdtemp(prefix="geosharp-bench-")) / "RESULTS.md" if q else RESULTS)
    out.write_text(text + "\n")
    print(f"[bench] wrote {out}")
    if a.json:
        a.json.write_text(json.dumps(dict(machine=info, results=res), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
