"""Case 8 of the geosharp benchmarks (``benchmarks/run.py --cases curvature``): the cost of one Hessian-vector
product on the quotient (issue 27 item 5).

On a random-weight model of all-MiniLM-L6-v2's shape (22.7 M parameters, batch 8 × 64; ``kind="bert"`` for
BERT-base as in case 1, which needs more memory than a shared 2-core CPU machine gives one job), timed in one
interleaved loop:

* ``gradient`` — one forward + backward (∇L over the perturbed parameters);
* ``euclidean-hvp`` — ∇²L v (:class:`~geosharp_ref.sharpness.hessian.EuclideanHessian`, forward-over-reverse);
* ``quotient-hvp-mix`` / ``quotient-hvp-inv`` — Hess L[ξ] = P 𝔾⁻¹(∇²L ξ + ½(Dγ̈(ξ))ᵀ∇L) on a horizontal ξ
  (:meth:`QuotientHessian.matvec <geosharp_ref.sharpness.hessian.QuotientHessian.matvec>`: the same HVP, the
  acceleration VJP, metric inverse and projection of every factor, and the tangent ↔ parameter placement).

Ratios per repetition (median [min–max]) and of the best times, of wall time and of this process's CPU time
(on a shared machine other tenants stretch the wall time of single calls several-fold): quotient / Euclidean
HVP (target ≤ 1.3) and HVP / gradient (the published anchor for Euclidean HVPs is 2.8–4.9×).
"""
from __future__ import annotations

import torch

from benchmarks.cases import MODEL_NAMES, make_model
from benchmarks.harness import interleaved, ratio_stats

__all__ = ["case_curvature", "render_curvature", "CURVATURE_TARGET"]

#: quotient HVP / Euclidean HVP
CURVATURE_TARGET = 1.3


def _setup(model, batch):
    from geosharp_ref.sharpness import build_space, model_loss, prepare_inputs
    from geosharp_ref.sharpness.hessian import EuclideanHessian, QuotientHessian
    from geosharp_ref.symmetry import symmetry_map

    params, batches, _, _ = prepare_inputs(model, [batch])
    batch = batches[0]
    model.eval()
    loss = lambda p: model_loss(model, p, batch)  # noqa: E731
    smap = symmetry_map(model)
    gen = torch.Generator().manual_seed(0)
    ops = {m: QuotientHessian(build_space(params, smap, m), loss, hvp="forward") for m in ("mix", "inv")}
    tangents = {m: op.space.random(1.0, gen) for m, op in ops.items()}
    euclid = EuclideanHessian(params, loss, ops["mix"].names, hvp="forward")
    v = euclid.to_params(torch.randn(euclid.dim, generator=gen, dtype=euclid.dtype).to(next(model.parameters()).device))
    names = euclid.names

    def gradient():
        leaves = {n: params[n].detach().requires_grad_(True) for n in names}
        value = loss({**params, **leaves})
        return torch.autograd.grad(value, list(leaves.values()))

    fns = {"gradient": gradient, "euclidean-hvp": lambda: euclid.matvec_params(v)}
    for m, op in ops.items():
        fns[f"quotient-hvp-{m}"] = lambda op=op, x=tangents[m]: op.matvec(x)
    return fns, euclid.dim


#: all-MiniLM-L6-v2's shape (hidden 384, 6 layers, 12 heads of 32, MLP 1536, BERT vocabulary): 22.7 M parameters
MINILM_SHAPE = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)


def _minilm_shaped(batch: int, seq: int = 64, seed: int = 0):
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    cfg = BertConfig(**MINILM_SHAPE, num_labels=5)
    cfg._attn_implementation = "eager"
    x = {"input_ids": torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)}
    return BertForSequenceClassification(cfg), (x, torch.randint(0, 5, (batch,), generator=g))


def case_curvature(quick: bool, device, reps: int, kind: str = "minilm", batch_size: int = 8) -> dict:
    """The four variants on ``kind``, interleaved: "minilm" (default; a random-weight model of
    :data:`MINILM_SHAPE`, batch 8 × 64) or a model of :func:`benchmarks.cases.make_model` ("bert": BERT-base; its
    two operators hold several parameter-sized buffers each); tiny in quick mode."""
    if kind == "minilm" and not quick:
        model, batch = _minilm_shaped(batch_size)
    else:
        model, batch = make_model("bert" if kind == "minilm" else kind, quick, batch=batch_size if not quick else 2)
    model = model.to(device)
    batch = ({k: t.to(device) for k, t in batch[0].items()}, batch[1].to(device))
    fns, dim = _setup(model, batch)
    times, cpu, _ = interleaved(fns, reps, device, warmup=1, resources=True)
    name = f"MiniLM-shaped BERT (batch {batch_size}, seq 64)" if kind == "minilm" and not quick else \
        MODEL_NAMES.get("bert" if kind == "minilm" else kind, kind)
    out = dict(model=name, batch=batch_size if not quick else 2, reps=reps, dim=dim, times=times,
               params=sum(p.numel() for p in model.parameters()),
               cpu=cpu)
    for clock, t in (("", times), ("cpu_", cpu)):  # wall time, and this process's CPU time (robust to tenants)
        out[f"{clock}euclidean_hvp_over_gradient"] = ratio_stats(t["euclidean-hvp"], t["gradient"])
        for m in ("mix", "inv"):
            out[f"{clock}{m}_over_euclidean"] = ratio_stats(t[f"quotient-hvp-{m}"], t["euclidean-hvp"])
            out[f"{clock}{m}_over_gradient"] = ratio_stats(t[f"quotient-hvp-{m}"], t["gradient"])
    return out


def _med(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _fmt(q):
    return f"{q['median']:.2f} [{q['lo']:.2f}–{q['hi']:.2f}] (best-of {q['best']:.2f})"


def render_curvature(r: dict) -> str:
    """The markdown section of :func:`case_curvature`'s result."""
    lines = [f"## 8. One Hessian-vector product on the quotient vs Euclidean (issue 27; target quotient / Euclidean "
             f"≤ {CURVATURE_TARGET})", "",
             "| model | clock | gradient | Euclidean HVP | quotient HVP mix | quotient HVP inv | Euclidean HVP / "
             "gradient | mix / Euclidean | inv / Euclidean | mix / gradient |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    verdict = lambda q: "met" if q["median"] <= CURVATURE_TARGET else "NOT met"  # noqa: E731
    for clock, key, prefix in (("wall", "times", ""), ("CPU", "cpu", "cpu_")):
        t = r[key]
        lines.append(f"| {r['model']}, {r['params'] / 1e6:.1f} M | {clock} | {_med(t['gradient']):.2f} s | "
                     f"{_med(t['euclidean-hvp']):.2f} s | {_med(t['quotient-hvp-mix']):.2f} s | "
                     f"{_med(t['quotient-hvp-inv']):.2f} s | {_fmt(r[prefix + 'euclidean_hvp_over_gradient'])} | "
                     f"{_fmt(r[prefix + 'mix_over_euclidean'])} {verdict(r[prefix + 'mix_over_euclidean'])} | "
                     f"{_fmt(r[prefix + 'inv_over_euclidean'])} {verdict(r[prefix + 'inv_over_euclidean'])} | "
                     f"{_fmt(r[prefix + 'mix_over_gradient'])} |")
    return "\n".join(lines)
