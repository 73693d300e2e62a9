"""What several commands share: argument checks and the one-paragraph symmetry summary."""
from __future__ import annotations

import math
import re
import sys
import warnings

import torch

from ..io.data import check_inputs_fit
from ..io.models import load_model, require_logits_head
from ..kernels import kernel_name
from ..probe import fit_linear_probe
from ..symmetry import NoAttentionPairsWarning, check_symmetry, symmetry_map as build_symmetry_map
from ..symmetry.check import rank_refusal
from ..symmetry.declared import check_declarations, declared_bindings
from ..symmetry.summary import summary_lines
from .derive import spec_kernels

__all__ = ["resolve_device", "check_positive", "symmetry_map_quiet", "describe_symmetry", "load_model_with_head", "spec_module",
           "declared_symmetries", "check_symmetry_options", "requested_symmetries"]


def resolve_device(args):
    """The ``torch.device`` of ``--device`` (:func:`geosharp_ref.cli.parser.add_device_option`): ``cpu``,
    ``cuda`` or ``cuda:N``; absent (None): ``cuda`` when CUDA is available, else ``cpu``. Anything else, CUDA
    asked for on a machine without it, or ``cuda:N`` beyond the devices present is refused (ValueError, one
    line). Call it before loading anything."""
    spec = getattr(args, "device", None)
    if spec is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    text = str(spec).strip().lower()
    if not re.fullmatch(r"cpu|cuda(:\d+)?", text):
        raise ValueError(f"--device {spec!r} is not a device: give cpu, cuda or cuda:N (N the GPU index)")
    if text == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {spec}: CUDA is not available on this machine (torch {torch.__version__}, "
                         f"cuda build {torch.version.cuda or 'none'}); use --device cpu")
    device = torch.device(text)
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ValueError(f"--device {spec}: this machine has {count} CUDA device{'s' if count != 1 else ''} "
                         f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})")
    return device


def check_positive(name, value, allow_zero=False):
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} finite number, "
                         f"got {value!r}")


def symmetry_map_quiet(model):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=NoAttentionPairsWarning)
        return build_symmetry_map(model)


def describe_symmetry(smap, out=None):
    out = out or sys.stdout
    heads = sum(g.num_heads for g in smap.groups)
    print(f"  symmetry  : {len(smap.groups)} GL(h) groups ({heads} heads), {len(smap.refused)} refused",
          file=out)
    for line in summary_lines(smap.refused, indent="    ", status="refused"):  # one line per repeated reason
        print(line, file=out)


def load_model_with_head(model_dir, num_labels, data, seed=0, out=None):
    """The model of ``model_dir``; with ``num_labels`` a fresh seeded head fitted as a linear probe on
    ``data`` (``(inputs, targets, n)`` of a data file), the fit printed and returned. Returns
    ``(model, probe or None)``; a backbone without a head and without ``num_labels`` is refused."""
    out = out or sys.stdout
    model = load_model(model_dir, num_labels=num_labels, seed=seed)
    if data is not None:  # token ids, lengths, dtypes the model takes: refused before any compute
        check_inputs_fit(model, data[0], "the data file")
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


def spec_module(spec, metric):
    """The kernel module of ``metric`` in spec file ``spec`` (derived in memory) and its declarations; a spec
    without ``BINDINGS`` for it is refused before any model is loaded."""
    module = spec_kernels(spec, metric)
    name = kernel_name(module)
    decl = getattr(module, "BINDINGS", None)
    if decl is None:
        raise ValueError(f"{spec} declares no BINDINGS for {name!r}: add BINDINGS = {{{name!r}: [{{block: "
                         f"'parameter-name pattern', ...}}]}} to the spec file, naming the parameters of its blocks "
                         f"{list(module.BLOCKS)} (then re-run `geosharp derive --spec` if you pass the generated "
                         f"module; README: 'Your own symmetry or metric, end to end')")
    check_declarations(module, decl, where=f"{spec}: BINDINGS[{name!r}]")
    return module, decl


def declared_symmetries(module, decl, model, batch, spec, seed=0, out=None, eps=0.0):
    """The bindings ``decl`` makes on ``model``, each checked on ``batch`` (a refused one raises ValueError
    with its measured change, before anything is written); one line printed per binding."""
    out = out or sys.stdout
    bindings = declared_bindings(model, module, decl, where=f"{spec}: BINDINGS[{kernel_name(module)!r}]")
    params = {n: p.detach() for n, p in model.named_parameters()}
    kept, refused = [], []
    for b in bindings:  # a singular Gram matrix (a fresh adapter's B = 0): refused before any compute
        why = rank_refusal(b, params, eps)
        if why:
            refused.append((b.key, why))
            continue
        worst = check_symmetry(model, b, batch, seed)
        print(f"    bound   {b.key}: {len(b.param_names)} parameters, output change {worst:.1e} (float64 check)",
              file=out)
        kept.append(b)
    for line in summary_lines(refused, indent="    ", status="refused"):
        print(line, file=out)
    if refused and not kept:
        print(f"    none of the {len(refused)} declared bindings is usable: their parameters are measured in the "
              f"adaptive geometry (pass --eps > 0 to relax the Gram matrices instead)", file=out)
    return kept


def check_symmetry_options(args, metric):
    """``--metric`` fits ``--spec``; returns ``(module, declarations)`` of the spec (None without one), so a bad
    spec file is refused before any model is loaded."""
    if args.spec:
        return spec_module(args.spec, metric)
    if metric not in (None, "adaptive", "inv", "mix"):
        raise ValueError(f"unknown --metric {metric!r}: choose adaptive, inv or mix, or name a metric of a spec file "
                         f"given with --spec FILE.py")
    return None


def requested_symmetries(args, spec, model, batch, out=None):
    """``--spec``/``--all-symmetries``: the list for ``geodesic_sharpness(symmetries=…)``, or None (the
    attention pairs on the fast path). ``spec``: what :func:`check_symmetry_options` returned."""
    out = out or sys.stdout
    if spec is None and not args.all_symmetries:
        return None
    symmetries = []
    if spec is not None:
        module, decl = spec
        print(f"  spec      : {args.spec}: metric {kernel_name(module)} on blocks {list(module.BLOCKS)}", file=out)
        symmetries += declared_symmetries(module, decl, model, batch, args.spec, args.seed, out,
                                          eps=getattr(args, "eps", 0.0) or 0.0)
    if args.all_symmetries:
        symmetries.append("all")
    return symmetries
