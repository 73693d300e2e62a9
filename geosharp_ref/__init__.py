"""geosharp reference evaluator: geodesic vs adaptive sharpness of whole models (never imports SymPy).

The public API, by layer (every name is importable from ``geosharp_ref`` directly):

core (the mathematics, as it reads)
    :func:`load_kernels` (:mod:`.kernels`: the one place that loads generated kernel modules),
    :func:`gl_pair`, :class:`GLPairGeometry`, :class:`AdaptiveGeometry` (:mod:`.geometry`),
    :func:`apgd` (:mod:`.apgd`), :class:`GramTable` (:mod:`.lazy_blocks`)
symmetry
    :class:`Binding` (the protocol every symmetry bound to parameters implements), :class:`Quotient` (which
    symmetries are quotiented), :func:`symmetry_map`, :class:`SymmetryMap`, :class:`PairGroup`,
    :class:`PairSpec`, :func:`find_symmetries`, :func:`declared_bindings`, :func:`check_binding` and the
    built-in bindings (:mod:`.symmetry`)
sharpness
    :func:`adaptive_sharpness`, :func:`geodesic_sharpness`, :class:`SharpnessResult`, :class:`ProductSpace`
    (the one perturbation space), :class:`Factor`, :func:`build_space`, :class:`EvaluationOptions`,
    :func:`get_measure` (:mod:`.sharpness`); calling a model: :func:`call_model`, :func:`model_loss`
    (:mod:`.forward`)
verification
    :func:`orbit_invariance`, :func:`riemannian_gradient_norm`, :func:`draw_orbit_elements`,
    :func:`verification_table` (:mod:`.verification`)
io
    :func:`load_model`, :func:`load_data`, :func:`split_batches` (:mod:`.io`)
statistics and plots
    :func:`kendall_with_ci` (:mod:`.stats`), :mod:`.plots`
studies (experiments built on the core)
    :mod:`.studies.toy`, :mod:`.studies.diagnet`, :mod:`.studies.population`
command line
    :mod:`.cli`

Names are loaded on first use (PEP 562), so ``import geosharp_ref`` (and the command line's help) does
not import torch.
"""
from __future__ import annotations

import importlib

#: public name -> the module that defines it
_API = {
    "load_kernels": "kernels", "BUILTIN_MODULES": "kernels", "module_from_source": "kernels",
    "gl_pair": "geometry", "GLPairGeometry": "geometry", "AdaptiveGeometry": "geometry",
    "apgd": "apgd", "GramTable": "lazy_blocks",
    "symmetry_map": "symmetry", "SymmetryMap": "symmetry", "PairGroup": "symmetry", "PairSpec": "symmetry",
    "find_symmetries": "symmetry", "declared_bindings": "symmetry", "check_binding": "symmetry",
    "check_symmetry": "symmetry",
    "HeadTranslationBinding": "symmetry", "ReLUUnitsBinding": "symmetry", "LoRABinding": "symmetry",
    "NormScalingBinding": "symmetry", "lora_bindings": "symmetry",
    "ProductSpace": "sharpness", "Factor": "sharpness",
    "adaptive_sharpness": "sharpness", "geodesic_sharpness": "sharpness", "SharpnessResult": "sharpness",
    "build_space": "sharpness", "EvaluationOptions": "sharpness", "get_measure": "sharpness", "MEASURES": "sharpness",
    "default_loss": "forward", "model_loss": "forward", "call_model": "forward",
    "Binding": "symmetry", "Quotient": "symmetry", "NoAttentionPairsWarning": "symmetry",
    "orbit_invariance": "verification.orbits", "riemannian_gradient_norm": "verification.orbits",
    "draw_orbit_elements": "sampling", "verification_table": "verification.kernel_checks",
    "load_model": "io.models", "load_data": "io.data", "split_batches": "io.data",
    "kendall_with_ci": "stats",
}

__all__ = sorted(_API)


def __getattr__(name):
    if name in _API:
        value = getattr(importlib.import_module(f"{__name__}.{_API[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API))
