"""The measured setups of the geosharp benchmarks (``benchmarks/run.py``): the models and one function
per case, each returning the raw results (a dict) that :func:`benchmarks.report.render` turns into text.

1. :func:`case_iteration` — one Auto-PGD iteration on BERT-base / ViT-B-sized random models
   (:func:`make_model`, :func:`iteration_setup`), on the GL fast path and on the generic path
   (``geodesic_sharpness(..., symmetries=[...])``: attention pairs alone, and with every applicable
   symmetry, :func:`all_symmetries`);
2. :func:`case_geometry` — geometry alone for 288 GL(h) pairs: batched torch vs a scipy loop, vs mix;
3. :func:`case_kernels` — generated kernels vs hand-written torch of the same formulas;
4. :func:`case_derive` — cold derivation + code generation of all built-ins (subprocess);
5. :func:`case_memory` — peak memory of geodesic vs adaptive evaluation (each in its own process:
   ``run.py --memory-child`` runs :func:`memory_child`);
6. :func:`case_cuda_full` — a full geodesic-sharpness evaluation of a ViT-B/32-sized model (CUDA).
"""
from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.harness import flop_counter, interleaved, maxrss_bytes, ratio_stats, sync

ROOT = Path(__file__).resolve().parent.parent
#: the command-line entry; case 5 runs ``RUNNER --memory-child MEASURE ...`` once per measurement
RUNNER = Path(__file__).resolve().with_name("run.py")
#: the models of case 1, as the report names them
MODEL_NAMES = dict(bert="BERT-base (batch 8, seq 128)", vit="ViT-B/16 (batch 8, 224²)")


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

def all_symmetries(model, batch) -> list:
    """The symmetries beyond the attention pairs that the library finds and binds for ``model``
    (:func:`geosharp_ref.symmetry.find_symmetries`, checked on the first two examples of ``batch``): what
    ``geodesic_sharpness(..., symmetries="all")`` quotients. BERT-base and ViT-B: the head's softmax
    translation (GELU MLPs have no unit rescaling; eps > 0 refuses norm scaling)."""
    from geosharp_ref.symmetry import find_symmetries

    inputs, targets = batch
    small = ({k: v[:2] for k, v in inputs.items()} if isinstance(inputs, dict) else inputs[:2], targets[:2])
    return find_symmetries(model, small).bindings


#: the measures of case 1: adaptive, the GL fast path (``geodesic-<metric>``, ``-perturbed``: the paper's
#: gradient at the perturbed weights), and the generic ProductSpace path of ``geodesic_sharpness(...,
#: symmetries=...)``: ``generic-mix`` with ``symmetries=[]`` (the attention pairs as ``gl_mix`` factors),
#: ``generic-mix-all`` with ``symmetries=all_symmetries(model, batch)`` (every applicable symmetry quotiented)
ITERATION_MEASURES = ("adaptive", "geodesic-mix", "geodesic-inv", "geodesic-mix-perturbed", "generic-mix",
                      "generic-mix-all")
#: the per-iteration cost targets of case 1 (ratio to adaptive in the same run)
ITERATION_TARGETS = {"geodesic-mix": 1.10, "geodesic-inv": 1.25, "geodesic-mix-perturbed": 1.10,
                     "generic-mix": 1.5, "generic-mix-all": 1.5}


def iteration_setup(model, batch, measure, rho=0.05, seed=0):
    """(space, f_and_grad, x, g) exactly as ``geosharp_ref.sharpness.measures._evaluate`` builds them."""
    from geosharp_ref.sharpness import PerturbationSpace, default_loss, model_loss
    from geosharp_ref.sharpness.measures import generic_space, prepare_inputs
    from geosharp_ref.symmetry import symmetry_map

    if measure.startswith("generic-"):  # geodesic_sharpness(..., metric, symmetries=[...]): the ProductSpace
        metric = measure.split("-")[1]
        symmetries = all_symmetries(model, batch) if measure.endswith("-all") else []
        params, batches, _, _ = prepare_inputs(model, [batch], rho, None)
        space = generic_space(params, symmetry_map(model), metric, symmetries)
        batch = batches[0]
        f_and_grad = space.value_and_grad(lambda params: model_loss(model, params, batch, default_loss))
        gen = torch.Generator().manual_seed(seed)
        x = space.project(space.random(rho, gen), rho)
        return space, f_and_grad, x, rho
    params, batches, device, dtype = prepare_inputs(model, [batch], rho, None)
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
    sync(x_new[0].device)
    t1 = time.perf_counter()
    _, g_new = f_and_grad(x_new)
    split.append(t1 - t0)
    state[2], state[4], state[5] = x_new, g_new, xx_new


#: untimed Auto-PGD iterations per measure before the timed ones (case 1)
ITERATION_WARMUP = 4


def case_iteration(quick: bool, device, reps: int, kinds=("bert", "vit"), measures=ITERATION_MEASURES) -> dict:
    """One Auto-PGD iteration of every measure in ``measures`` (adaptive first) on each model of ``kinds``,
    timed in one interleaved loop; ratios to adaptive per repetition. A subset (e.g. BERT-base only, or
    without the fast-path rows) is a call with other ``kinds`` / ``measures``; the report leaves out what
    was not measured."""
    measures = list(measures)
    assert measures[0] == "adaptive", "ratios are taken to adaptive, measured in the same loop"
    #: result key of each ratio (the report's columns): mix, inv, mix_perturbed, generic, generic_all
    keys = {m: k for m, k in (("geodesic-mix", "mix"), ("geodesic-inv", "inv"),
                              ("geodesic-mix-perturbed", "mix_perturbed"), ("generic-mix", "generic"),
                              ("generic-mix-all", "generic_all")) if m in measures}
    out = {}
    for kind in kinds:
        model, batch = make_model(kind, quick, batch=8 if not quick else 2)
        model = model.to(device)
        batch = ({k: v.to(device) for k, v in batch[0].items()}, batch[1].to(device))
        states, splits, factors = {}, {}, {}
        for m in measures:
            space, fg, x, rho = iteration_setup(model, batch, m)
            _, g = fg(x)
            states[m] = [space, fg, x, rho, g, space.inner(x, x)]
            splits[m] = []
            if hasattr(space, "factors"):  # the generic path: which factors it quotients
                factors[m] = [f.binding.key for f in space.factors]
        fns = {m: (lambda m=m: _one_iteration(states[m], splits[m])) for m in measures}
        # untimed iterations first, as the start of any Auto-PGD run: until the heap has grown to its
        # steady size, an iteration page-faults hundreds of MB in (about 1 s of system time on BERT-base)
        warmup = 0 if quick else ITERATION_WARMUP
        times, cpu, faults = interleaved(fns, reps, device, warmup=warmup, resources=True)
        geo = {m: splits[m][-reps:] for m in measures}
        flops = {}
        for m in measures:  # matrix-product work of one iteration: deterministic, unlike the times
            with flop_counter() as fc:
                _one_iteration(states[m], [])
            flops[m] = fc.get_total_flops()
        out[kind] = dict(
            params=sum(p.numel() for p in model.parameters()),
            times={m: times[m] for m in measures},
            geometry={m: geo[m] for m in measures},
            flops=flops,
            **{k: ratio_stats(times[m], times["adaptive"]) for m, k in keys.items()},
            cpu_times=cpu,
            page_faults=faults,
            warmup=warmup,
            cpu={k: ratio_stats(cpu[m], cpu["adaptive"]) for m, k in keys.items()},
            factors=factors,
        )
        if "generic-mix" in measures and "geodesic-mix" in measures:  # the generic path vs the fast path
            out[kind]["generic_over_mix"] = ratio_stats(times["generic-mix"], times["geodesic-mix"])
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
    base = maxrss_bytes()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        cbase = torch.cuda.memory_allocated()
    t = time.perf_counter()
    if measure == "adaptive":
        res = adaptive_sharpness(model, [(x, y)], 0.05, n_iter=n_iter)
    else:
        res = geodesic_sharpness(model, [(x, y)], 0.05, metric=measure.split("-")[1], n_iter=n_iter)
    out = dict(measure=measure, base=base, peak=maxrss_bytes(), seconds=time.perf_counter() - t,
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
            cmd = [sys.executable, str(RUNNER), "--memory-child", m,
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
        sync(device)
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**30 if cuda else None
        rows.append(dict(measure=measure, seconds=time.perf_counter() - t, peak_gib=peak, sharpness=res.mean))
    return dict(inputs=n_inputs, batch=bs, n_iter=n_iter, device=str(device), rows=rows)
