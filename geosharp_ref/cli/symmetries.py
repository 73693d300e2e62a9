"""``geosharp symmetries``: the parameter symmetries found in a saved model, bound or refused, and why."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..forward import batch_to_device, float64_inputs
from ..io.data import check_inputs_fit, load_data, random_batch, split_batches
from ..io.durable import check_output_path, write_text_atomic
from ..io.models import check_model_dir, load_model, resolve_model_dir
from ..symmetry import find_symmetries
from .common import resolve_device, check_symmetry_options, declared_symmetries, load_model_with_head

__all__ = ["run"]


def run(args) -> int:
    """Print the model's attention pairs and every further symmetry bound or refused (``--json``: write it);
    a head-less backbone is fine here (the head's translation is then simply not found)."""
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    spec = check_symmetry_options(args, args.metric) if args.spec else None
    if args.json:
        check_output_path(args.json, "--json", {"--data": args.data, "--spec": args.spec})
    device = resolve_device(args)
    check_model_dir(args.model_dir)
    data = load_data(args.data) if args.data else None
    if args.num_labels is not None:
        model, _ = load_model_with_head(args.model_dir, args.num_labels, data, args.seed)
    else:
        model = load_model(args.model_dir)
        if data is not None:
            check_inputs_fit(model, data[0], f"data file {args.data!r}")
    model_class = type(model).__name__
    model64 = model.to(device=device, dtype=torch.float64).eval()  # in place: no second copy of the weights
    del model
    if data is not None:
        inputs, targets, n = data
        (batch,) = split_batches(inputs, targets, 1, min(args.batch_size, n), f"data file {args.data!r}")
        batch = batch_to_device((float64_inputs(batch[0]), batch[1]), device)  # float64 images, model's device
    else:
        batch = random_batch(model64, args.batch_size, seed=args.seed)
    report = find_symmetries(model64, batch, seed=args.seed)
    smap = report.smap
    print(f"symmetries of {model_class} ({args.model_dir})\n")
    print(smap)
    print()
    print(report)
    declared = []
    if spec is not None:
        module, decl = spec
        print(f"\nspec {args.spec}:")
        declared = declared_symmetries(module, decl, model64, batch, args.spec, args.seed)
    print(f"\nbound: {len(smap.groups)} GL(h) attention groups, {len(report.bindings)} further built-in "
          f"symmetries" + (f", {len(declared)} declared" if spec is not None else "")
          + f"; refused: {len(smap.refused) + len(report.refused)}; adaptive geometry: {len(smap.adaptive)} "
            f"parameters or parts outside the attention pairs")
    print("quotient them all: geodesic_sharpness(model, batches, rho, symmetries='all') or "
          "`geosharp evaluate --all-symmetries`")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = dict(model_dir=str(resolve_model_dir(args.model_dir).resolve()), model_class=model_class,
                   groups=[dict(key=g.key, layer=g.layer, kind=g.kind, heads=g.num_heads, head_dim=g.head_dim,
                                n=g.n, m=g.m, params=list(g.param_names), pieces=g.pieces(), source=g.source,
                                group=g.group_name, kernels=str(g.kernels))
                           for g in smap.groups],
                   refused=[dict(key=k, reason=r) for k, r in smap.refused], adaptive=list(smap.adaptive),
                   further=report.to_dict()["entries"], joint=report.to_dict()["joint"],
                   declared=[dict(key=b.key, params=list(b.param_names)) for b in declared])
        write_text_atomic(out, json.dumps(doc, indent=2) + "\n")
        print(f"json: {out}")
    return 0
