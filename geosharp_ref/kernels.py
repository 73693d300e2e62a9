"""The one place that loads generated kernel modules (no SymPy: generated modules need only torch).

A kernel module is what ``geosharp derive`` writes for one quotient geometry: ``BLOCKS``,
``BLOCK_SHAPES`` and batched functions (``inner``, ``horizontal_projection``, ``riemannian_gradient``,
``geodesic_acceleration``, ``second_order_geodesic``, ``act``, …). :func:`load_kernels` returns

* a built-in module by name (:data:`BUILTIN_MODULES`: ``"gl_inv"``, ``"gl_mix"``, ``"diag_inv"``, ``"diag_mix"``,
  ``"scaling"``, ``"translation"``, and for Q/K under rotary position embeddings ``"rope_half_inv"``,
  ``"rope_half_mix"``, ``"rope_interleaved_inv"``, ``"rope_interleaved_mix"``: ``codegen/generated/<name>.py``),
* a module written by ``geosharp derive --spec`` from its file path (``generated_kernels/lora.py``),
* or a module object, passed through.

:func:`module_from_source` builds a module from generated source text in memory (``geosharp evaluate --spec``
derives a spec file's geometry and uses it without writing a file); :func:`kernel_name` is the name a
module was generated under (``lora_hybrid``), for keys and messages.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["load_kernels", "module_from_source", "kernel_name", "gl_kernels", "check_metric", "check_kernel_module",
           "BUILTIN_MODULES", "METRICS", "REQUIRED"]

#: the kernel modules generated from the built-in geometries (``codegen/generated``)
BUILTIN_MODULES = ("gl_inv", "gl_mix", "diag_inv", "diag_mix", "scaling", "translation", "rope_half_inv", "rope_half_mix",
                   "rope_interleaved_inv", "rope_interleaved_mix")
#: what every generated kernel module defines (a module missing one is truncated or not generated)
REQUIRED = ("BLOCKS", "BLOCK_SHAPES", "inner", "horizontal_projection", "riemannian_gradient", "geodesic_acceleration",
            "second_order_geodesic", "act")
_REGENERATE = "regenerate it with `geosharp derive --spec FILE.py --out DIR` (generated modules are never edited)"

#: the built-in quotient metrics of a GL(h) pair (paper Eqs. (5)/(6) lifted to matrices): ``gl_<metric>``
METRICS = ("inv", "mix")


def check_metric(metric) -> str:
    """``metric`` if it is one of :data:`METRICS`, else ValueError (the one place a metric name is checked)."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {METRICS}")
    return metric


def gl_kernels(metric) -> str:
    """The built-in kernel module of a GL(h) pair under ``metric`` (``"inv"`` → ``"gl_inv"``); a kernel module
    object (a metric declared in a spec file for ``gl_pair``) is returned as it is."""
    if isinstance(metric, ModuleType):
        return metric
    return f"gl_{check_metric(metric)}"


def load_kernels(name) -> ModuleType:
    """The generated kernel module ``name``: a built-in name, a ``.py`` path, or a module (returned)."""
    if isinstance(name, ModuleType):
        return name
    if isinstance(name, Path) or (isinstance(name, str) and name.endswith(".py")):
        return _load_file(Path(name))
    if name not in BUILTIN_MODULES:
        raise ValueError(f"unknown kernel module {name!r}; choose one of {list(BUILTIN_MODULES)} or give the "
                         f"path of a module written by `geosharp derive --spec`")
    return importlib.import_module(f"codegen.generated.{name}")


def kernel_name(module: ModuleType) -> str:
    """The name the module was generated under: ``gl_mix``, ``lora_hybrid``."""
    return getattr(module, "KERNEL_NAME", module.__name__.rsplit(".", 1)[-1])


def module_from_source(name: str, source: str) -> ModuleType:
    """Execute generated kernel source (``codegen.generate.GeneratedModule.source``) as module ``name``,
    in memory; the module is not registered in ``sys.modules``."""
    mod = ModuleType(f"geosharp_user_kernels.{name}")
    mod.__file__ = f"<generated {name}>"
    mod.KERNEL_NAME = name
    try:
        exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    except Exception as exc:
        raise ValueError(f"generated kernel module {name!r} does not run ({_reason(exc)}); {_REGENERATE}") from None
    return check_kernel_module(mod, f"generated kernel module {name!r}")


def _reason(exc) -> str:
    line = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
    first = (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}{line}: {first}"


def check_kernel_module(mod: ModuleType, where: str) -> ModuleType:
    """``mod`` if it defines everything a generated kernel module does (:data:`REQUIRED`: ``BLOCKS`` as a tuple
    of names, ``BLOCK_SHAPES`` one shape per block, the kernels as functions), else ValueError."""
    missing = [k for k in REQUIRED if not hasattr(mod, k)]
    if missing:
        raise ValueError(f"{where} lacks {missing}: it is truncated or not a module `geosharp derive` wrote; "
                         f"{_REGENERATE}")
    blocks, shapes = mod.BLOCKS, mod.BLOCK_SHAPES
    if not (isinstance(blocks, (tuple, list)) and blocks and all(isinstance(b, str) for b in blocks)
            and isinstance(shapes, (tuple, list)) and len(shapes) == len(blocks)):
        raise ValueError(f"{where}: BLOCKS must be a tuple of block names and BLOCK_SHAPES one shape per block, got "
                         f"{blocks!r} and {shapes!r}; {_REGENERATE}")
    not_callable = [k for k in REQUIRED[2:] if not callable(getattr(mod, k))]
    if not_callable:
        raise ValueError(f"{where}: {not_callable} are not functions; {_REGENERATE}")
    return mod


def _load_file(path: Path) -> ModuleType:
    path = path.resolve()
    if not path.is_file():
        raise FileNotFoundError(f"kernel module {str(path)!r} does not exist; write it with "
                                f"`geosharp derive --spec FILE.py --out DIR`")
    key = f"geosharp_user_kernels.{path.stem}_{abs(hash(str(path))):x}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, path)
    mod = importlib.util.module_from_spec(spec)
    mod.KERNEL_NAME = path.stem
    sys.modules[key] = mod
    try:
        spec.loader.exec_module(mod)
        check_kernel_module(mod, f"kernel module {str(path)!r}")
    except Exception as exc:
        del sys.modules[key]
        if isinstance(exc, ValueError):
            raise
        raise ValueError(f"kernel module {str(path)!r} does not run ({_reason(exc)}); {_REGENERATE}") from None
    return mod
