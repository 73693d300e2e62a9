"""What several commands share: argument checks and the one-paragraph symmetry summary."""
from __future__ import annotations

import math
import sys
import warnings

from ..io.models import load_model, require_logits_head
from ..probe import fit_linear_probe
from ..symmetry import symmetry_map as build_symmetry_map
from ..verification.orbits import NO_GROUPS_WARNING

__all__ = ["check_positive", "symmetry_map_quiet", "describe_symmetry", "load_model_with_head"]


def check_positive(name, value, allow_zero=False):
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} finite number, "
                         f"got {value!r}")


def symmetry_map_quiet(model):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=NO_GROUPS_WARNING)
        return build_symmetry_map(model)


def describe_symmetry(smap, out=None):
    out = out or sys.stdout
    heads = sum(g.num_heads for g in smap.groups)
    print(f"  symmetry  : {len(smap.groups)} GL(h) groups ({heads} heads), {len(smap.refused)} refused",
          file=out)
    for key, why in smap.refused:
        print(f"    refused {key}: {why}", file=out)


def load_model_with_head(model_dir, num_labels, data, seed=0, out=None):
    """The model of ``model_dir``; with ``num_labels`` a fresh seeded head fitted as a linear probe on
    ``data`` (``(inputs, targets, n)`` of a data file), the fit printed and returned. Returns
    ``(model, probe or None)``; a backbone without a head and without ``num_labels`` is refused."""
    out = out or sys.stdout
    model = load_model(model_dir, num_labels=num_labels, seed=seed)
    if num_labels is None:
        require_logits_head(model, model_dir)
        return model, None
    if data is None:
        raise ValueError("--num-labels fits the new head on the data: pass --data FILE as well")
    inputs, targets, n = data
    probe = fit_linear_probe(model, inputs, targets, num_labels)
    print(f"  probe     : fresh {num_labels}-class head (seed {seed}) fitted on {probe['examples']} examples with "
          f"the backbone frozen: accuracy {probe['accuracy']:.4f}, loss {probe['loss']:.4g}", file=out)
    return model, probe
