"""The built-in geometries: which (symmetry, metric) pairs get a committed kernel module."""
from __future__ import annotations

import time

from derivations.metric import builtin_metric
from derivations.quotient import derive_geometry
from derivations.symmetry import get_symmetry

from .generate import GeneratedModule, generate_module

__all__ = ["BUILTIN_GEOMETRIES", "BUILTIN_JOINT_GEOMETRIES", "generate_builtins"]

#: module name → (symmetry, metric). Diagonal-net metrics (5) and (6) of the paper are the
#: element-wise GL(1) versions of ``inv`` and ``mix``.
BUILTIN_GEOMETRIES = {
    "gl_inv": ("gl_pair", "inv"),
    "gl_mix": ("gl_pair", "mix"),
    "diag_inv": ("elementwise_rescaling", "inv"),
    "diag_mix": ("elementwise_rescaling", "mix"),
    "scaling": ("positive_scaling", "scale_invariant"),
    "translation": ("translation", "euclidean"),
    # Q/K under rotary position embeddings: the subgroup of GL(h) commuting with the rotations (the rotary dimension
    # is a run-time keyword of the kernels, default h; the pairing is the module's)
    "rope_half_inv": ("rope_half", "inv"),
    "rope_half_mix": ("rope_half", "mix"),
    "rope_interleaved_inv": ("rope_interleaved", "inv"),
    "rope_interleaved_mix": ("rope_interleaved", "mix"),
}


#: module name → (joint symmetry, metric) of derivations.joint_builtins: joint geometries (codegen.joint modules:
#: batched CG projection in the joint Lie algebra; a different kernel interface, see docs/guides/invariant-metrics.md)
BUILTIN_JOINT_GEOMETRIES = {
    "norm_qk_inv": ("norm_qk", "inv"),
    "norm_qk_mix": ("norm_qk", "mix"),
}


def generate_builtins(names=None, progress=None) -> tuple[list[GeneratedModule], dict]:
    """Derive and generate the built-in modules (single and joint geometries) in memory; returns (modules, seconds
    per module)."""
    modules, timings = [], {}
    for name in names or [*BUILTIN_GEOMETRIES, *BUILTIN_JOINT_GEOMETRIES]:
        t0 = time.perf_counter()
        if name in BUILTIN_JOINT_GEOMETRIES:
            modules.append(_joint_module(name))
        else:
            sym_name, metric_name = BUILTIN_GEOMETRIES[name]
            geo = derive_geometry(builtin_metric(get_symmetry(sym_name), metric_name))
            modules.append(generate_module(geo, name, origin=f"derivations.builtin: {sym_name} / {metric_name}"))
        timings[name] = time.perf_counter() - t0
        if progress:
            progress(name, timings[name])
    return modules, timings


def _joint_module(name: str) -> GeneratedModule:
    from derivations.joint_builtins import joint_builtin_metric
    from derivations.joint_geometry import derive_joint_geometry

    from .joint import generate_joint_module

    joint_name, metric_name = BUILTIN_JOINT_GEOMETRIES[name]
    geo = derive_joint_geometry(joint_builtin_metric(joint_name, metric_name))
    return GeneratedModule(name, generate_joint_module(
        geo, name, origin=f"derivations.joint_builtins: {joint_name} / {metric_name}"))
