"""User declarations: ``geosharp derive --spec FILE.py``.

The spec file is ordinary Python that builds metrics with :mod:`derivations` and exposes them as
``SPEC = {"module_name": metric, ...}``. Example (LoRA's GL(r) with a hybrid metric)::

    from sympy import Inverse, Trace
    from derivations import Metric, gl_pair

    lora = gl_pair("B", "At", n="d_out", m="d_in", h="r")      # ΔW = B A = B (Aᵀ)ᵀ
    B, At = lora.blocks
    (xB, xA), (eB, eA) = lora.tangent("xi"), lora.tangent("eta")
    SPEC = {"lora_hybrid": Metric(lora, Trace(Inverse(B.T*B)*xB.T*eB) + Trace(B.T*B*xA.T*eA), "hybrid")}

Optionally the file also says which parameters of a model form each metric's blocks, as plain data
(``BINDINGS = {"module_name": [{block: parameter-name pattern or {param, transpose, bias, heads}}]}``, see
``geosharp_ref/symmetry/declared.py``). The generator copies it into the generated module as ``BINDINGS``, so
the evaluator reads it without running the spec file.
"""
from __future__ import annotations

import ast
import runpy
import time
from pathlib import Path

from derivations.errors import DeclarationError
from derivations.metric import Metric
from derivations.quotient import derive_geometry

from .generate import GeneratedModule, generate_module

__all__ = ["load_spec", "load_spec_file", "generate_from_spec"]


def load_spec(path: Path) -> dict:
    """The ``SPEC`` dict of a spec file (checked)."""
    return load_spec_file(path)[0]


def load_spec_file(path: Path) -> tuple[dict, dict]:
    """``(SPEC, BINDINGS)`` of a spec file, checked; BINDINGS is ``{}`` when the file declares none."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"spec file {path} does not exist")
    try:
        namespace = runpy.run_path(str(path))
    except Exception as exc:  # the user's file failed: one clear line, not its traceback
        where = ""
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == str(path):
                where = f" (line {tb.tb_lineno})"
            tb = tb.tb_next
        raise DeclarationError(f"spec file {path} raised {type(exc).__name__}{where}: {exc}; fix the file "
                               f"(it must define SPEC = {{'module_name': Metric(...)}})") from exc
    spec = namespace.get("SPEC")
    if not isinstance(spec, dict) or not spec:
        raise DeclarationError(
            f"{path} must define SPEC = {{'module_name': Metric(...), ...}} (a non-empty dict)"
        )
    for name, metric in spec.items():
        if not (isinstance(name, str) and name.isidentifier()):
            raise DeclarationError(f"{path}: SPEC key {name!r} is not a valid Python module name")
        if not isinstance(metric, Metric):
            raise DeclarationError(
                f"{path}: SPEC[{name!r}] is a {type(metric).__name__}, expected derivations.Metric"
            )
    bindings = namespace.get("BINDINGS", {})
    if not isinstance(bindings, dict):
        raise DeclarationError(f"{path}: BINDINGS must be a dict {{module_name: [{{block: pattern}}, ...]}}, got "
                               f"{type(bindings).__name__}")
    for name, decl in bindings.items():
        if name not in spec:
            raise DeclarationError(f"{path}: BINDINGS[{name!r}] names no metric of SPEC ({', '.join(spec)})")
        try:
            plain = ast.literal_eval(repr(decl)) == decl
        except (ValueError, SyntaxError):
            plain = False
        if not plain:
            raise DeclarationError(f"{path}: BINDINGS[{name!r}] must be plain data (dicts, lists, strings, "
                                   f"numbers, booleans), got {decl!r}")
    return spec, bindings


def generate_from_spec(path: Path, progress=None, names=None) -> tuple[list[GeneratedModule], dict]:
    """Derive and generate every module of a spec file (or those in ``names``), in memory (nothing written on
    failure); a metric's ``BINDINGS`` entry is appended to its module's source."""
    spec, bindings = load_spec_file(path)
    if names is not None:
        unknown = [n for n in names if n not in spec]
        if unknown:
            raise DeclarationError(f"{path} declares no metric {', '.join(map(repr, unknown))}; it declares: "
                                   f"{', '.join(spec)}")
        spec = {n: spec[n] for n in names}
    modules, timings = [], {}
    for name, metric in spec.items():
        t0 = time.perf_counter()
        geo = derive_geometry(metric)
        module = generate_module(geo, name, origin=f"spec {Path(path).name}")
        if name in bindings:
            module = GeneratedModule(name, module.source + _bindings_source(bindings[name]))
        modules.append(module)
        timings[name] = time.perf_counter() - t0
        if progress:
            progress(name, timings[name])
    return modules, timings


def _bindings_source(decl) -> str:
    return ("\n\n# which parameters of a model form the blocks (the spec file's BINDINGS entry; see "
            "geosharp_ref/symmetry/declared.py)\n"
            f"BINDINGS = {decl!r}\n")
