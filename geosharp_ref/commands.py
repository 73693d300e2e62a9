"""Implementation of ``geosharp evaluate`` and ``geosharp verify`` (see :mod:`geosharp_ref.cli`).

Run-time only: this module imports torch, transformers (lazily) and geosharp_ref; never SymPy, the
derivation engine or the code generator.  (transformers itself imports ``torch._dynamo``, which
pulls in SymPy as a torch dependency; geosharp does not use it.)

Data file format (``--data``)::

    torch.save({"inputs": tensor_or_dict_of_tensors, "targets": tensor}, "data.pt")

Every tensor has the examples on its leading dimension.  ``inputs`` is passed to the model as the
first positional argument (a tensor) or as keyword arguments (a dict, e.g. ``{"input_ids": ...,
"attention_mask": ...}`` or ``{"pixel_values": ...}``; non-tensor values are passed unchanged to
every batch).  ``targets`` are integer class indices for the model's logits: shape (examples,)
for a classifier, (examples, L) for per-token logits.  The loss is the mean cross-entropy.
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
import time
import warnings
from pathlib import Path

import torch

from .sharpness import (PerturbationSpace, _call, _logits, adaptive_sharpness, geodesic_sharpness,
                        model_loss)
from .symmetry_map import symmetry_map as build_symmetry_map

__all__ = ["load_model", "load_data", "split_batches", "random_batch", "draw_orbit_elements",
           "evaluate", "verify", "INVARIANCE_TOL"]

INVARIANCE_TOL = 1e-6
_NO_GROUPS = r"(symmetry_map: no GL\(h\) attention pair recognised|no GL\(h\) attention pairs found)"


# ------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet_transformers():
    """No weight-loading progress bars while loading (restored afterwards)."""
    from transformers.utils import logging as hf_logging

    enabled = getattr(hf_logging, "is_progress_bar_enabled", lambda: False)()
    if enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _loader_for(config):
    """The transformers class to load with, from ``config.architectures``."""
    import transformers

    archs = list(getattr(config, "architectures", None) or [])
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return transformers.AutoModelForSequenceClassification
    if any("ForImageClassification" in a for a in archs):
        return transformers.AutoModelForImageClassification
    for a in archs:  # another head the config names (e.g. GPT2LMHeadModel): load exactly that class
        cls = getattr(transformers, a, None)
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
            return cls
    if not archs:
        seq = transformers.AutoModelForSequenceClassification
        if type(config) in getattr(seq, "_model_mapping", {}):
            return seq
    return transformers.AutoModel


def _check_model_dir(model_dir) -> Path:
    path = Path(model_dir)
    hint = ("MODEL_DIR must be a local Hugging Face-format directory (config.json and weights, as "
            "written by save_pretrained); hub names are never downloaded")
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {str(model_dir)!r} does not exist; {hint}")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model directory {str(path)!r} has no config.json; {hint}")
    return path


def load_model(model_dir):
    """Load a model from a local Hugging Face-format directory (eager attention, no downloads)."""
    path = _check_model_dir(model_dir)
    import transformers

    try:
        with _quiet_transformers():
            config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
            loader = _loader_for(config)
            model = loader.from_pretrained(path, attn_implementation="eager", local_files_only=True)
    except (OSError, KeyError) as exc:  # missing weights, unknown model type: one clear line
        raise ValueError(f"could not load a model from {str(path)!r}: {exc}") from exc
    return model.eval()


def load_data(path):
    """``(inputs, targets, n_examples)`` from a file written by ``torch.save({"inputs", "targets"})``."""
    p = Path(path)
    fmt = 'torch.save({"inputs": tensor or dict of tensors, "targets": tensor}, FILE)'
    if not p.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist (expected a file written with {fmt})")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"could not read data file {str(p)!r} ({exc}); expected a file written with {fmt}") from exc
    if not (isinstance(obj, dict) and "inputs" in obj and "targets" in obj):
        got = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise ValueError(f"data file {str(p)!r} must hold a dict with keys 'inputs' and 'targets' "
                         f"(written with {fmt}); got {got}")
    inputs, targets = obj["inputs"], obj["targets"]
    if not torch.is_tensor(targets) or targets.dim() == 0:
        raise ValueError(f"data file {str(p)!r}: 'targets' must be a tensor with the examples on dim 0")
    n = targets.shape[0]
    if isinstance(inputs, dict):
        tensors = {k: v for k, v in inputs.items() if torch.is_tensor(v)}
        if not tensors:
            raise ValueError(f"data file {str(p)!r}: 'inputs' is a dict without tensors")
    elif torch.is_tensor(inputs):
        tensors = {"inputs": inputs}
    else:
        raise ValueError(f"data file {str(p)!r}: 'inputs' must be a tensor or a dict of tensors, "
                         f"got {type(inputs).__name__}")
    for k, v in tensors.items():
        if v.dim() == 0 or v.shape[0] != n:
            raise ValueError(f"data file {str(p)!r}: inputs {k!r} has shape {tuple(v.shape)} but targets have "
                             f"{n} examples; every tensor needs the examples on its leading dimension")
    return inputs, targets, n


def _slice(x, a, b):
    if isinstance(x, dict):
        return {k: (v[a:b] if torch.is_tensor(v) else v) for k, v in x.items()}
    return x[a:b]


def split_batches(inputs, targets, n_batches, batch_size, source="data file"):
    """The first ``n_batches · batch_size`` examples, in order, as ``n_batches`` (inputs, targets) pairs."""
    n = targets.shape[0]
    need = n_batches * batch_size
    if n < need:
        raise ValueError(f"{source} has only {n} examples; {n_batches} batches × {batch_size} = {need} needed "
                         f"(lower --batches or --batch-size)")
    return [(_slice(inputs, i * batch_size, (i + 1) * batch_size), targets[i * batch_size:(i + 1) * batch_size])
            for i in range(n_batches)]


def random_batch(model, batch_size=4, seq_len=8, seed=0):
    """A random (inputs, targets) batch that fits ``model``: ``input_ids`` over ``config.vocab_size``
    for text models, ``pixel_values`` of ``config.image_size``/``num_channels`` for vision models;
    targets uniform over the logits' last dimension (``config.num_labels`` for a classifier)."""
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    name = getattr(model, "main_input_name", "input_ids")
    if name == "input_ids":
        vocab = getattr(cfg, "vocab_size", None)
        if not vocab:
            raise ValueError(f"{type(model).__name__}: config has no vocab_size; pass --data")
        max_pos = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        L = seq_len if not max_pos else max(1, min(seq_len, max_pos - 2))  # RoBERTa offsets positions by 2
        inputs = {"input_ids": torch.randint(vocab, (batch_size, L), generator=gen)}
    elif name == "pixel_values":
        size = getattr(cfg, "image_size", None)
        if size is None:
            raise ValueError(f"{type(model).__name__}: config has no image_size; pass --data")
        hw = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
        c = getattr(cfg, "num_channels", 3)
        dtype = next(model.parameters()).dtype
        inputs = {"pixel_values": torch.randn((batch_size, c) + hw, generator=gen, dtype=dtype)}
    else:
        raise ValueError(f"cannot build a random batch for a model whose main input is {name!r}; pass --data")
    with torch.no_grad():
        logits = _logits(_call(model, dict(model.named_parameters()), inputs))
    num_labels = logits.shape[-1]
    targets = torch.randint(num_labels, tuple(logits.shape[:-1]), generator=gen)
    return inputs, targets


# ------------------------------------------------------------------------------------------------
# evaluate
# ------------------------------------------------------------------------------------------------

def _positive(name, value, allow_zero=False):
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} finite number, "
                         f"got {value!r}")


def _symmetry_map_quiet(model):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_GROUPS)
        return build_symmetry_map(model)


def _describe_symmetry(smap, out=None):
    out = out or sys.stdout
    heads = sum(g.num_heads for g in smap.groups)
    print(f"  symmetry  : {len(smap.groups)} GL(h) groups ({heads} heads), {len(smap.refused)} refused",
          file=out)
    for key, why in smap.refused:
        print(f"    refused {key}: {why}", file=out)


def evaluate(args) -> int:
    """``geosharp evaluate``: adaptive or geodesic sharpness of a saved model on a saved data set."""
    _positive("rho", args.rho)
    _positive("--eps", args.eps, allow_zero=True)
    if args.iters < 1:
        raise ValueError(f"--iters must be at least 1, got {args.iters}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.batches is not None and args.batches < 1:
        raise ValueError(f"--batches must be at least 1, got {args.batches}")
    _check_model_dir(args.model_dir)
    inputs, targets, n = load_data(args.data)
    n_batches = args.batches if args.batches is not None else max(1, n // args.batch_size)
    batches = split_batches(inputs, targets, n_batches, args.batch_size, f"data file {args.data!r}")
    model = load_model(args.model_dir)
    dtype = torch.float64 if args.float64 else None
    common = dict(n_iter=args.iters, seed=args.seed, dtype=dtype, progress=True)

    name = type(model).__name__
    print(f"{args.metric} sharpness of {name} ({args.model_dir})")
    print(f"  data      : {args.data}, {n_batches} batches × {args.batch_size} (first "
          f"{n_batches * args.batch_size} of {n} examples)")
    smap = None
    if args.metric == "adaptive":
        result = adaptive_sharpness(model, batches, args.rho, **common)
    else:
        smap = _symmetry_map_quiet(model)
        _describe_symmetry(smap)
        if not smap.groups:
            print(f"geosharp: warning: no recognised GL(h) attention in {name}: geodesic sharpness equals "
                  f"adaptive sharpness for this model", file=sys.stderr)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_NO_GROUPS)
            result = geodesic_sharpness(model, batches, args.rho, metric=args.metric, eps=args.eps,
                                        geodesic_correction=not args.no_geodesic_correction,
                                        metric_norm=not args.no_metric_norm, gradient=args.gradient,
                                        symmetry_map=smap, **common)
    cfg = result.config
    opts = f"APGD {cfg['n_iter']} iterations, {cfg['dtype'].replace('torch.', '')}"
    if smap is not None:
        opts += (f", eps {cfg['eps']:g}, geodesic correction {'on' if cfg['geodesic_correction'] else 'off'}, "
                 f"metric norm {'on' if cfg['metric_norm'] else 'off'}, gradient {cfg['gradient']}")
    print(f"  measure   : {result.measure}")
    print(f"  rho       : {result.rho:g} ({opts})")
    print(f"  mean      : {result.mean:.6g}")
    print(f"  per batch : {', '.join(f'{v:.6g}' for v in result.per_batch)}")
    print(f"  seconds   : {result.seconds:.2f}")

    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        d = result.to_dict()
        d.update(model_dir=str(Path(args.model_dir).resolve()), model_class=name,
                 data=str(Path(args.data).resolve()), batches=n_batches, batch_size=args.batch_size,
                 examples_available=n)
        if smap is not None:
            d["refused"] = [list(r) for r in smap.refused]
        out.write_text(json.dumps(d, indent=2) + "\n")
        print(f"  json      : {out}")
    return 0


# ------------------------------------------------------------------------------------------------
# verify
# ------------------------------------------------------------------------------------------------

def draw_orbit_elements(smap, scale, generator, dtype=torch.float64):
    """Per group, A = a·Ã of shape (heads, h, h) with Ã = Q·diag(u), Q orthogonal (QR of a Gaussian,
    signs fixed), u ~ uniform[0.5, 2]: condition number ≤ 4 whatever the scale a."""
    As = []
    for g in smap.groups:
        k, h = g.num_heads, g.head_dim
        Q, R = torch.linalg.qr(torch.randn(k, h, h, generator=generator, dtype=dtype))
        Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)
        u = 0.5 + 1.5 * torch.rand(k, h, generator=generator, dtype=dtype)
        As.append(scale * Q * u.unsqueeze(-2))
    return As


def _with_params(model, params):
    m = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(params[n])
    return m.eval()


def _riemannian_grad_norm(model, smap, batch, metric):
    """‖grad L‖_g at θ: the horizontal Riemannian gradient of the loss in the quotient geometry
    (GL(h) pairs, ``metric``) plus the adaptive geometry elsewhere (as the sharpness ascent uses)."""
    params = {n: p.detach() for n, p in model.named_parameters()}
    space = PerturbationSpace(params, smap.groups, smap.adaptive_masks, metric=metric)
    xi = [z.requires_grad_(True) for z in space.zeros()]
    loss = model_loss(model, space.perturbed_params(xi), batch)
    grads = torch.autograd.grad(loss, xi, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(xi, grads)]
    return space.norm(space.ascent_direction([x.detach() for x in xi], grads))


def _measure(model, smap, batch, rho, iters, seed):
    inputs, _ = batch
    with torch.no_grad():
        out = _logits(_call(model, {n: p.detach() for n, p in model.named_parameters()}, inputs))
    kw = dict(n_iter=iters, seed=seed, dtype=torch.float64)
    vals = {"output": out}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_GROUPS)
        for metric in ("inv", "mix"):
            vals[f"geodesic-{metric}"] = geodesic_sharpness(model, [batch], rho, metric=metric,
                                                            symmetry_map=smap, **kw).mean
            vals[f"grad-{metric}"] = _riemannian_grad_norm(model, smap, batch, metric)
    vals["adaptive"] = adaptive_sharpness(model, [batch], rho, **kw).mean
    return vals


def _rel(a, b):
    if torch.is_tensor(a):
        den = float(a.abs().max())
        num = float((b - a).abs().max())
    else:
        den, num = abs(a), abs(b - a)
    if num == 0:
        return 0.0
    return num / den if den > 0 else math.inf


_COLUMNS = ("output", "geodesic-inv", "geodesic-mix", "grad-inv", "grad-mix", "adaptive")
_CHECKED = ("output", "geodesic-inv", "geodesic-mix", "grad-inv", "grad-mix")


def verify(args) -> int:
    """``geosharp verify``: orbit invariance of the output and of geodesic sharpness for a saved model."""
    _positive("rho", args.rho)
    if args.iters < 1:
        raise ValueError(f"--iters must be at least 1, got {args.iters}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    try:
        scales = [float(s) for s in str(args.scales).split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--scales must be comma-separated numbers, got {args.scales!r}") from None
    if not scales:
        raise ValueError("--scales is empty")
    for s in scales:
        _positive("every scale in --scales", s)
    _check_model_dir(args.model_dir)
    data = load_data(args.data) if args.data else None  # fail early on a bad file
    model = load_model(args.model_dir)
    model64 = copy.deepcopy(model).to(torch.float64).eval()
    name = type(model).__name__
    smap = _symmetry_map_quiet(model64)
    print(f"orbit-invariance check of {name} ({args.model_dir})\n")
    print(smap)
    print()
    if not smap.groups:
        print(f"geosharp: warning: no recognised GL(h) attention in {name}: there is no orbit to move along "
              f"and geodesic sharpness equals adaptive sharpness for this model", file=sys.stderr)
    rope = [k for k, why in smap.refused if "rotary" in why]
    if rope:
        print(f"Q/K refused for rotary/relative positions (adaptive instead): {', '.join(rope)}\n")

    if data is not None:
        inputs, targets, n = data
        b = min(args.batch_size, n)
        (batch,) = split_batches(inputs, targets, 1, b, f"data file {args.data!r}")
        source = f"first {b} of {n} examples of {args.data}"
    else:
        batch = random_batch(model64, args.batch_size, seed=args.seed)
        key = next(iter(batch[0]))
        source = f"random batch: {key} {tuple(batch[0][key].shape)}, targets {tuple(batch[1].shape)}"
    print(f"A = a·Q·diag(u) per head (Q orthogonal, u ~ U[0.5, 2], seed {args.seed}), applied with "
          f"SymmetryMap.act to a float64 copy")
    print(f"batch: {source}; rho {args.rho:g}, APGD {args.iters} iterations, float64")
    print("relative change |f(ψ(A, θ)) − f(θ)| / |f(θ)| (output: max-abs over the logits)\n")

    t0 = time.perf_counter()
    params = {n: p.detach() for n, p in model64.named_parameters()}
    base = _measure(model64, smap, batch, args.rho, args.iters, args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    rows, worst = [], {c: 0.0 for c in _COLUMNS}
    for a in scales:
        moved = _with_params(model64, smap.act(params, draw_orbit_elements(smap, a, gen)))
        vals = _measure(moved, smap, batch, args.rho, args.iters, args.seed)
        rel = {c: _rel(base[c], vals[c]) for c in _COLUMNS}
        for c in _COLUMNS:
            worst[c] = max(worst[c], rel[c])
        rows.append((a, rel))

    header = ["scale a"] + list(_COLUMNS)
    cells = [[f"{a:g}"] + [f"{rel[c]:.1e}" + (" varies" if c == "adaptive" and rel[c] > INVARIANCE_TOL else "")
                           for c in _COLUMNS] for a, rel in rows]
    widths = [max(len(h), *(len(r[j]) for r in cells)) for j, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    print(fmt.format(*header).rstrip())
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print(fmt.format(*r).rstrip())
    print(f"\nat θ: geodesic-inv {base['geodesic-inv']:.6g}, geodesic-mix {base['geodesic-mix']:.6g}, "
          f"adaptive {base['adaptive']:.6g}; ‖grad‖ inv {base['grad-inv']:.6g}, mix {base['grad-mix']:.6g} "
          f"({time.perf_counter() - t0:.1f} s)")
    failed = [c for c in _CHECKED if not worst[c] <= INVARIANCE_TOL]
    if failed:
        print(f"FAIL: {', '.join(failed)} changed by more than {INVARIANCE_TOL:g} (relative) along the orbit "
              f"(worst {max(worst[c] for c in failed):.1e})")
        return 1
    adaptive = ("adaptive sharpness varies (max relative change "
                f"{worst['adaptive']:.1e}), as expected" if worst["adaptive"] > INVARIANCE_TOL
                else f"adaptive sharpness changed by at most {worst['adaptive']:.1e} here")
    print(f"PASS: output, geodesic sharpness and Riemannian gradient norms invariant to ≤ {INVARIANCE_TOL:g} "
          f"(worst {max(worst[c] for c in _CHECKED):.1e}); {adaptive}")
    return 0
