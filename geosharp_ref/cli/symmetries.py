"""``geosharp symmetries``: the parameter symmetries found in a saved model, bound or refused, and why."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from ..io.data import load_data, random_batch, split_batches
from ..io.models import check_model_dir, load_model
from ..symmetry import find_symmetries
from .common import check_symmetry_options, declared_symmetries, load_model_with_head

__all__ = ["run"]


def run(args) -> int:
    """Print the model's attention pairs and every further symmetry bound or refused (``--json``: write it);
    a head-less backbone is fine here (the head's translation is then simply not found)."""
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    spec = check_symmetry_options(args, args.metric) if args.spec else None
    check_model_dir(args.model_dir)
    data = load_data(args.data) if args.data else None
    if args.num_labels is not None:
        model, _ = load_model_with_head(args.model_dir, args.num_labels, data, args.seed)
    else:
        model = load_model(args.model_dir)
    model64 = copy.deepcopy(model).to(torch.float64).eval()
    if data is not None:
        inputs, targets, n = data
        (batch,) = split_batches(inputs, targets, 1, min(args.batch_size, n), f"data file {args.data!r}")
    else:
        batch = random_batch(model64, args.batch_size, seed=args.seed)
    report = find_symmetries(model64, batch, seed=args.seed)
    smap = report.smap
    print(f"symmetries of {type(model).__name__} ({args.model_dir})\n")
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
        doc = dict(model_dir=str(Path(args.model_dir).resolve()), model_class=type(model).__name__,
                   groups=[dict(key=g.key, layer=g.layer, kind=g.kind, heads=g.num_heads, head_dim=g.head_dim,
                                n=g.n, m=g.m, params=list(g.param_names), pieces=g.pieces(), source=g.source,
                                group=g.group_name, kernels=str(g.kernels))
                           for g in smap.groups],
                   refused=[dict(key=k, reason=r) for k, r in smap.refused], adaptive=list(smap.adaptive),
                   further=report.to_dict()["entries"],
                   declared=[dict(key=b.key, params=list(b.param_names)) for b in declared])
        out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"json: {out}")
    return 0
