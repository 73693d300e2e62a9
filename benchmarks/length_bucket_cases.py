"""Case 9 of the geosharp benchmarks (``benchmarks/run.py --cases length-buckets``): padded text evaluated in
length buckets (:func:`geosharp_ref.forward.length_buckets`) against the plain padded batch.

One Auto-PGD iteration's model work (``ProductSpace.value_and_grad`` at a fixed random ξ: the perturbed weights,
forward and backward) on the tweets population's sharpness batch — the packaged all-MiniLM-L6-v2 with a fresh
3-class head (the population's starting point) on the first 128 training tweets at max_length 64 (median 32
real tokens) — for adaptive and geodesic-mix, plain and in K = 4, 8, 16 buckets, timed in one interleaved loop.
Reported: time plain / bucketed per repetition (median [min–max], best-of), of wall and of this process's CPU
time, the token positions evaluated (Σ_k n_k ℓ_k / N·L) and the relative difference of the values. Quick mode:
a tiny BERT on random padded rows.
"""
from __future__ import annotations

import torch

from benchmarks.cases import make_model
from benchmarks.harness import interleaved, ratio_stats

__all__ = ["case_length_buckets", "render_length_buckets", "BUCKETS"]

BUCKETS = (4, 8, 16)


def _tweets_batch(batch_size: int):
    """The tweets population's first sharpness batch and its starting model (pretrained encoder, head seeded 0)."""
    from geosharp_ref.studies.population.tweets import TweetsRecipesTask

    task = TweetsRecipesTask()
    split = task.load_split(task.data_spec(0))
    torch.manual_seed(0)
    model = task.build_model({})
    x = {k: v[:batch_size] for k, v in split.pool.items()}
    return model, (x, split.y_pool[:batch_size]), "all-MiniLM-L6-v2 + 3-class head, tweets (128 × 64)"


def _tiny_batch():
    """The quick mode's tiny BERT (:func:`benchmarks.cases.make_model`) on 16 rows of random real lengths."""
    model, (x, y) = make_model("bert", True, batch=16)
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(2, 17, (16,), generator=g)
    mask = (torch.arange(16) < lens[:, None]).long()
    return model, ({"input_ids": x["input_ids"] * mask, "attention_mask": mask}, y), "tiny BERT (16 × 16)"


def _setup(model, batch, metric, buckets):
    from geosharp_ref.forward import length_buckets, model_loss
    from geosharp_ref.sharpness import build_space, prepare_inputs
    from geosharp_ref.symmetry import symmetry_map

    params, (batch,), _, _ = prepare_inputs(model, [batch])
    model.eval()
    space = build_space(params, symmetry_map(model) if metric else None, metric)
    xi = space.random(0.01, torch.Generator().manual_seed(0))
    fns, values, tokens = {}, {}, {}
    for k in (None, *buckets):
        b = batch if k is None else length_buckets(batch, k)
        f = space.value_and_grad(lambda p, b=b: model_loss(model, p, b))
        name = f"{metric or 'adaptive'}-{'plain' if k is None else k}"
        fns[name] = lambda f=f: f(xi)
        values[name] = float(f(xi)[0])
        tokens[name] = 1.0 if k is None else b.tokens / batch[0]["attention_mask"].numel()
    return fns, values, tokens


def case_length_buckets(quick: bool, device, reps: int, batch_size: int = 128) -> dict:
    """The plain batch and :data:`BUCKETS` bucketings, adaptive and geodesic-mix, interleaved."""
    model, batch, name = _tiny_batch() if quick else _tweets_batch(batch_size)
    model = model.to(device)
    batch = ({k: t.to(device) for k, t in batch[0].items()}, batch[1].to(device))
    fns, values, tokens = {}, {}, {}
    for metric in (None, "mix"):
        f, v, t = _setup(model, batch, metric, BUCKETS)
        fns.update(f), values.update(v), tokens.update(t)
    times, cpu, _ = interleaved(fns, reps, device, warmup=1, resources=True)
    out = dict(model=name, reps=reps, times=times, cpu=cpu, values=values, tokens=tokens,
               real_tokens=float(batch[0]["attention_mask"].float().mean()), rows={})
    for metric in ("adaptive", "mix"):
        plain = f"{metric}-plain"
        for k in BUCKETS:
            key = f"{metric}-{k}"
            out["rows"][key] = dict(wall=ratio_stats(times[plain], times[key]), cpu=ratio_stats(cpu[plain], cpu[key]),
                                    tokens=tokens[key],
                                    rel_diff=abs(values[key] - values[plain]) / abs(values[plain]))
    return out


def _med(xs):
    return sorted(xs)[len(xs) // 2]


def _fmt(q):
    return f"{q['median']:.2f} [{q['lo']:.2f}–{q['hi']:.2f}] (best-of {q['best']:.2f})"


def render_length_buckets(r: dict) -> str:
    """The markdown section of :func:`case_length_buckets`'s result."""
    lines = ["## 9. Length buckets: one Auto-PGD iteration's model work on padded text, plain / bucketed", "",
             f"{r['model']}; real tokens {100 * r['real_tokens']:.0f} % of the padded positions.", "",
             "| measure | buckets | tokens evaluated | time (wall) | plain / bucketed, wall | plain / bucketed, CPU | "
             "value rel. diff |", "|---|---|---|---|---|---|---|"]
    for metric in ("adaptive", "mix"):
        lines.append(f"| {metric} | plain | 100 % | {_med(r['times'][f'{metric}-plain']):.2f} s | 1 | 1 | 0 |")
        for k in BUCKETS:
            row = r["rows"][f"{metric}-{k}"]
            lines.append(f"| {metric} | {k} | {100 * row['tokens']:.0f} % | {_med(r['times'][f'{metric}-{k}']):.2f} s "
                         f"| {_fmt(row['wall'])} | {_fmt(row['cpu'])} | {row['rel_diff']:.1e} |")
    return "\n".join(lines)
