"""Cases 2 and 3 of the geosharp benchmarks (``benchmarks/run.py``): the GL(h) pair geometry alone.

2. :func:`case_geometry` — geometry alone for 288 GL(h) pairs: batched torch vs a scipy loop, vs mix;
3. :func:`case_kernels` — generated kernels vs hand-written torch of the same formulas (written here,
   independently of the generator).
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from benchmarks.harness import interleaved, ratio_stats
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
