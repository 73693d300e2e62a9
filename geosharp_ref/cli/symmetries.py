"""``geosharp symmetries``: the parameter symmetries found in a saved model, bound or refused, and why."""
from __future__ import annotations

import json
from pathlib import Path

from ..io.models import check_model_dir, load_model
from .common import symmetry_map_quiet

__all__ = ["run"]


def run(args) -> int:
    """Print the model's symmetry map (and with ``--json`` write it); a head-less backbone is fine here."""
    check_model_dir(args.model_dir)
    model = load_model(args.model_dir)
    smap = symmetry_map_quiet(model)
    heads = sum(g.num_heads for g in smap.groups)
    print(f"symmetries of {type(model).__name__} ({args.model_dir})\n")
    print(smap)
    print(f"\nbound: {len(smap.groups)} GL(h) groups ({heads} heads); refused: {len(smap.refused)}; "
          f"adaptive geometry: {len(smap.adaptive)} parameters or parts")
    for key, why in smap.refused:
        print(f"  refused {key}: {why}")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = dict(model_dir=str(Path(args.model_dir).resolve()), model_class=type(model).__name__,
                   groups=[dict(key=g.key, layer=g.layer, kind=g.kind, heads=g.num_heads, head_dim=g.head_dim,
                                n=g.n, m=g.m, params=list(g.param_names), pieces=g.pieces(), source=g.source)
                           for g in smap.groups],
                   refused=[dict(key=k, reason=r) for k, r in smap.refused], adaptive=list(smap.adaptive))
        out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"json: {out}")
    return 0
