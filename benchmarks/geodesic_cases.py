"""Case 7 of the geosharp benchmarks (``benchmarks/run.py --cases geodesic``): exact vs second-order geodesic
sharpness, one Auto-PGD iteration (issue 27 item 5).

For each metric (mix, inv), one Auto-PGD iteration (:func:`benchmarks.cases._one_iteration`: the ascent step,
two radial clips, then forward + backward through the perturbed model) in the space of
``geodesic_sharpness(..., geodesic="second-order")`` and of ``geodesic="exact"`` at the default RK4 step count
(:data:`geosharp_ref.sharpness.exact_geodesic.DEFAULT_STEPS`), timed in one interleaved loop on the same
random-weight MiniLM-shaped BERT (:func:`minilm_shaped`: all-MiniLM-L6-v2's shape, the model of the
geodesic-gap study; BERT-base's 24 pair groups of 12 × 769 × 64 make one exact iteration minutes of CPU time
here) on one batch of 8 × 32 tokens (quick mode: case 1's tiny BERT). The ratio exact / second-order is taken
per repetition (median [min–max]), with the best-of ratio and the matrix-product work of each.
"""
from __future__ import annotations

import torch

from benchmarks.cases import make_model
from benchmarks.harness import flop_counter, interleaved, ratio_stats, sync

__all__ = ["case_geodesic", "render_geodesic", "one_iteration", "minilm_shaped", "GEODESIC_MEASURES"]

#: (metric, geodesic, options) per timed variant: the default steps with the exact gradient through RK4, and
#: for mix also 4 steps and ``gradient="perturbed"`` (ū itself: no backpropagation through the integration)
GEODESIC_MEASURES = {"mix-second-order": ("mix", "second-order", {}), "mix-exact": ("mix", "exact", {}),
                     "mix-exact-4": ("mix", "exact", {"steps": 4}),
                     "mix-exact-perturbed": ("mix", "exact", {"gradient": "perturbed"}),
                     "inv-second-order": ("inv", "second-order", {}), "inv-exact": ("inv", "exact", {})}


def _setup(model, batch, metric, geodesic, options=None, rho=0.05, seed=0):
    from geosharp_ref.sharpness import build_space, default_loss, model_loss, prepare_inputs
    from geosharp_ref.symmetry import symmetry_map

    params, batches, _, _ = prepare_inputs(model, [batch])
    batch = batches[0]
    space = build_space(params, symmetry_map(model), metric, geodesic=geodesic, **(options or {}))
    fg = space.value_and_grad(lambda p: model_loss(model, p, batch, default_loss))
    x = space.project(space.random(rho, torch.Generator().manual_seed(seed)), rho)
    _, g = fg(x)
    return [space, fg, x, rho, g, space.inner(x, x)]


#: the model of case 7 as the report names it
MINILM_NAME = "MiniLM-shaped BERT (6 layers, hidden 384, 12 heads of 32; batch 8, seq 32)"


def minilm_shaped(seed: int = 0, batch: int = 8, seq: int = 32):
    """A random-weight BERT of all-MiniLM-L6-v2's shape (vocab 30522, 5 labels, eager attention) and one batch."""
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    cfg = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
                     num_labels=5)
    cfg._attn_implementation = "eager"
    x = {"input_ids": torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)}
    return BertForSequenceClassification(cfg).eval(), (x, torch.randint(0, 5, (batch,), generator=g))


def one_iteration(state):
    """The body of one ``apgd`` iteration (momentum 0.75), as case 1 times it: the ascent step with its two
    radial clips (:func:`geosharp_ref.apgd.apgd_step`), then forward + backward through the perturbed model;
    ``state`` = [space, f_and_grad, x, ρ, g, ‖x‖²] advances to the new iterate."""
    from geosharp_ref.apgd import apgd_step
    space, f_and_grad, x, rho, g, xx = state
    x_new, xx_new = apgd_step(space, x, x, g, xx, 2.0 * rho, rho, 0.75)
    sync(x_new[0].device)
    _, g_new = f_and_grad(x_new)
    state[2], state[4], state[5] = x_new, g_new, xx_new


def case_geodesic(quick: bool, device, reps: int) -> dict:
    """One Auto-PGD iteration per :data:`GEODESIC_MEASURES` variant on :func:`minilm_shaped` (case 1's tiny BERT
    in quick mode), interleaved; ratios exact / second-order per metric."""
    from geosharp_ref.sharpness.exact_geodesic import DEFAULT_STEPS

    model, batch = make_model("bert", True, batch=2) if quick else minilm_shaped()
    model = model.to(device)
    batch = ({k: v.to(device) for k, v in batch[0].items()}, batch[1].to(device))
    states = {m: _setup(model, batch, *mg) for m, mg in GEODESIC_MEASURES.items()}
    fns = {m: (lambda m=m: one_iteration(states[m])) for m in states}
    times = interleaved(fns, reps, device, warmup=0 if quick else 1)
    flops = {}
    for m in states:
        with flop_counter() as fc:
            one_iteration(states[m])
        flops[m] = fc.get_total_flops()
    return dict(model="tiny BERT (quick)" if quick else MINILM_NAME, steps=DEFAULT_STEPS, reps=reps, times=times,
                flops=flops,
                params=sum(p.numel() for p in model.parameters()),
                **{f"{m}_ratio": ratio_stats(times[m], times[f"{m.split('-')[0]}-second-order"])
                   for m in ("mix-exact", "mix-exact-4", "mix-exact-perturbed", "inv-exact")},
                **{f"{metric}_ratio": ratio_stats(times[f"{metric}-exact"], times[f"{metric}-second-order"])
                   for metric in ("mix", "inv")})


def _med(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def render_geodesic(r: dict) -> str:
    """The markdown section of :func:`case_geodesic`'s result."""
    lines = [f"## 7. Exact vs second-order geodesic sharpness, one Auto-PGD iteration (default {r['steps']} RK4 "
             "steps)", "", "| model | params | variant | second-order | exact | exact / second-order | best-of | "
             "matmul GFLOP second-order / exact |", "|---|---|---|---|---|---|---|---|"]
    names = {"mix-exact": f"mix, {r['steps']} steps", "mix-exact-4": "mix, 4 steps",
             "mix-exact-perturbed": f"mix, {r['steps']} steps, gradient perturbed", "inv-exact": f"inv, {r['steps']} steps"}
    for m, label in names.items():
        base = f"{m.split('-')[0]}-second-order"
        s, e, q = r["times"][base], r["times"][m], r[f"{m}_ratio"]
        fs, fe = r["flops"][base] / 1e9, r["flops"][m] / 1e9
        lines.append(f"| {r['model']} | {r['params'] / 1e6:.1f} M | {label} | {_med(s):.2f} s | {_med(e):.2f} s | "
                     f"{q['median']:.2f} [{q['lo']:.2f}–{q['hi']:.2f}] | {q['best']:.2f} | {fs:.1f} / {fe:.1f} |")
    return "\n".join(lines)
