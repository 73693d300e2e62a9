"""The measured setups of the geosharp benchmarks (``benchmarks/run.py``): the models and one function
per case, each returning the raw results (a dict) that :func:`benchmarks.report.render` turns into text.

1. :func:`case_iteration` — one Auto-PGD iteration on BERT-base / ViT-B-sized random models
   (:func:`make_model`, :func:`iteration_setup`), with the fast GL factor and with the fast hooks off
   (``build_space(..., symmetries=[...], fast=False)``: attention pairs alone, and with every applicable
   symmetry, :func:`all_symmetries`);
2., 3. the geometry alone and the generated kernels vs hand-written torch: :mod:`benchmarks.geometry_cases`;
4. :func:`case_derive` — cold derivation + code generation of all built-ins (subprocess);
5. :func:`case_memory` — peak memory of geodesic vs adaptive evaluation (each in its own process:
   ``run.py --memory-child`` runs :func:`memory_child`);
6. :func:`case_cuda_full` — a full geodesic-sharpness evaluation of a ViT-B/32-sized model (CUDA).
"""
from __future__ import annotations

import json
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
MODEL_NAMES = dict(bert="BERT-base (batch 8, seq 128)", vit="ViT-B/16 (batch 8, 224²)",
                   llama="Llama-shaped, SmolLM2-135M layer shape, 6 layers, vocab 8192 (batch 8, seq 128)")
#: the Llama-shaped model of case 1c (``make_model("llama", ...)``, full mode): SmolLM2-135M's layer shape
#: (hidden 576, 9 query heads over 3 KV heads of dimension 64, SwiGLU 1536, RoPE rotate-half, RMSNorm) with
#: 6 of its 30 layers and a vocabulary of 8192 instead of 49152, so that the embedding holds about the share
#: of the parameters it holds in the 30-layer model (18 % here, 21 % there) and one iteration stays a few
#: seconds of CPU time; a sequence-classification head (2 labels, last token) on batch 8 × seq 128
LLAMA_CONFIG = dict(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                    intermediate_size=1536, num_hidden_layers=6, vocab_size=8192, max_position_embeddings=2048,
                    rms_norm_eps=1e-5, rope_theta=100000.0)
#: its tiny version (quick mode): 6 query heads over 2 KV heads of dimension 4
LLAMA_QUICK_CONFIG = dict(hidden_size=24, num_attention_heads=6, num_key_value_heads=2, head_dim=4,
                          intermediate_size=40, num_hidden_layers=2, vocab_size=100, max_position_embeddings=64)


# ------------------------------------------------------------------------------------------------
# models
# ------------------------------------------------------------------------------------------------

def make_model(kind: str, quick: bool, batch: int, seed: int = 0, vit_patch: int | None = None):
    """Random-weight BERT-base / ViT-B / a Llama-shaped decoder (:data:`LLAMA_CONFIG`; tiny versions in quick
    mode) and one batch."""
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
    elif kind == "llama":  # GQA, RoPE (rotate-half), SwiGLU, RMSNorm; eager attention, built offline from config
        from transformers import LlamaConfig, LlamaForSequenceClassification
        cfg = LlamaConfig(**(LLAMA_QUICK_CONFIG if quick else LLAMA_CONFIG), num_labels=2, pad_token_id=0,
                          bos_token_id=1, eos_token_id=2)
        cfg._attn_implementation = "eager"
        model = LlamaForSequenceClassification(cfg)
        seq = 128 if not quick else 16
        x = {"input_ids": torch.randint(3, cfg.vocab_size, (batch, seq), generator=g)}  # no padding token
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


#: the measures of case 1: adaptive, the fast GL factor (``geodesic-<metric>``, ``-perturbed``: the paper's
#: gradient at the perturbed weights), and the ProductSpace with the fast hooks off (``fast=False``):
#: ``generic-mix`` with ``symmetries=[]`` (the attention pairs as generic ``gl_mix`` factors, one per group),
#: ``generic-mix-all`` with ``symmetries=all_symmetries(model, batch)`` (every applicable symmetry quotiented)
ITERATION_MEASURES = ("adaptive", "geodesic-mix", "geodesic-inv", "geodesic-mix-perturbed", "generic-mix",
                      "generic-mix-all")
#: the per-iteration cost targets of case 1 (ratio to adaptive in the same run)
ITERATION_TARGETS = {"geodesic-mix": 1.10, "geodesic-inv": 1.25, "geodesic-mix-perturbed": 1.10,
                     "generic-mix": 1.25, "generic-mix-all": 1.5, "geodesic-mix-all": 1.25}
#: the measures of case 1c (the Llama-shaped decoder, :func:`case_iteration_llama`): adaptive; ``geodesic-mix``,
#: the attention pairs alone (V/O through the fast GL factor, RoPE Q/K as generic ``rope_half_mix`` factors);
#: ``geodesic-mix-all``, ``geodesic_sharpness(..., symmetries="all")``'s space (the pairs plus every built-in
#: the library finds and checks on the model: SwiGLU unit rescaling per layer, the head's softmax translation,
#: and the weights of every norm, quotiented jointly with those symmetries by folding them into their readers)
LLAMA_MEASURES = ("adaptive", "geodesic-mix", "geodesic-mix-all")
#: the per-iteration target of case 1c (issue 30): everything quotiented / adaptive
LLAMA_TARGET = 1.25


def iteration_setup(model, batch, measure, rho=0.05, seed=0):
    """(space, f_and_grad, x, g) exactly as ``geosharp_ref.sharpness.pipeline.evaluate`` builds them: the
    space from :func:`geosharp_ref.sharpness.build_space`. ``generic-<metric>`` rows: every factor generic
    (``fast=False``: one generated ``gl_<metric>`` factor per pair group, no GL fast hooks), with
    ``symmetries=[]`` or, for ``-all``, every symmetry the library binds. ``geodesic-mix-all``: the space of
    ``geodesic_sharpness(..., metric="mix", symmetries="all")`` (:meth:`Quotient.resolve
    <geosharp_ref.symmetry.Quotient.resolve>` with ``"all"``, checked on the first two examples as in
    :func:`all_symmetries`; fast hooks on)."""
    from geosharp_ref.sharpness import build_space, default_loss, model_loss, prepare_inputs
    from geosharp_ref.symmetry import symmetry_map

    params, batches, _, _ = prepare_inputs(model, [batch])
    batch = batches[0]
    if measure.startswith("generic-"):  # geodesic_sharpness(..., metric, symmetries=[...]) without fast hooks
        metric = measure.split("-")[1]
        symmetries = all_symmetries(model, batch) if measure.endswith("-all") else []
        space = build_space(params, symmetry_map(model), metric, symmetries, fast=False)
    elif measure == "adaptive":
        space = build_space(params, None)
    elif measure.endswith("-all"):  # geodesic_sharpness(..., symmetries="all"): the pairs + every built-in found
        from geosharp_ref.symmetry import Quotient
        inputs, targets = batch  # checked on 2 examples (token inputs: their first 32 tokens; the checks run
        # in float64 on a copy of the model, and a symmetry of the model is one on any input)
        small = ({k: v[:2, :32] if k in _TOKEN_INPUTS else v[:2] for k, v in inputs.items()}
                 if isinstance(inputs, dict) else inputs[:2], targets[:2])
        quotient = Quotient.resolve(model, small, metric=measure.split("-")[1], symmetries="all",
                                    smap=symmetry_map(model))
        space = build_space(params, quotient=quotient)
    else:
        space = build_space(params, symmetry_map(model), measure.split("-")[1],
                            gradient="perturbed" if measure.endswith("-perturbed") else "exact")
    f_and_grad = space.value_and_grad(lambda params: model_loss(model, params, batch, default_loss))
    gen = torch.Generator().manual_seed(seed)
    x = space.project(space.random(rho, gen), rho)
    return space, f_and_grad, x, rho


#: the token inputs whose sequence dimension the symmetry checks of ``geodesic-mix-all`` shorten
_TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


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
                              ("generic-mix-all", "generic_all"), ("geodesic-mix-all", "mix_all"))
            if m in measures}
    out = {}
    for kind in kinds:
        model, batch = make_model(kind, quick, batch=8 if not quick else 2)
        model = model.to(device)
        batch = ({k: v.to(device) for k, v in batch[0].items()}, batch[1].to(device))
        states, splits, factors, quotiented, joint = {}, {}, {}, {}, {}
        for m in measures:
            space, fg, x, rho = iteration_setup(model, batch, m)
            _, g = fg(x)
            states[m] = [space, fg, x, rho, g, space.inner(x, x)]
            splits[m] = []
            if m != "adaptive":  # which groups each measure quotients, and their share of the parameters
                factors[m] = space.factor_keys
                quotiented[m] = _quotiented_fraction(space, model)
                # the norms quotiented jointly with their readers (symmetries="all": norm weights folded)
                joint[m] = [norm for norm, _ in space.quotient.joint]
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
            quotiented=quotiented,
            joint=joint,
        )
        if "generic-mix" in measures and "geodesic-mix" in measures:  # the generic path vs the fast path
            out[kind]["generic_over_mix"] = ratio_stats(times["generic-mix"], times["geodesic-mix"])
        del states, model
    return out


def _quotiented_fraction(space, model) -> float:
    """The share of the model's parameters that some quotiented symmetry covers (1 − the adaptive share)."""
    masks = space.quotient.adaptive_masks
    named = dict(model.named_parameters())
    adaptive = sum(named[k].numel() if m is None else int(m.sum()) for k, m in masks.items() if k in named)
    return 1.0 - adaptive / sum(p.numel() for p in named.values())


def case_iteration_llama(quick: bool, device, reps: int) -> dict:
    """Case 1c: one Auto-PGD iteration on the Llama-shaped decoder (:data:`LLAMA_CONFIG`) for
    :data:`LLAMA_MEASURES`, timed like case 1 (:func:`case_iteration`)."""
    return case_iteration(quick, device, reps, kinds=("llama",), measures=LLAMA_MEASURES)


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
        print(f"[bench] cuda {rows[-1]}", flush=True)  # each measure reaches the log, even if a time limit cuts the rest
    return dict(inputs=n_inputs, batch=bs, n_iter=n_iter, device=str(device), rows=rows)
