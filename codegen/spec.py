"""User declarations: ``geosharp derive --spec FILE.py``.

The spec file is ordinary Python that builds metrics with :mod:`derivations` and exposes them as
``SPEC = {"module_name": metric, ...}``. Example (LoRA's GL(r) with a hybrid metric)::

    from sympy import Inverse, Trace
    from derivations import Metric, gl_pair

    lora = gl_pair("B", "At", n="d_out", m="d_in", h="r")      # ΔW = B A = B (Aᵀ)ᵀ
    B, At = lora.blocks
    (xB, xA), (eB, eA) = lora.tangent("xi"), lora.tangent("eta")
    SPEC = {"lora_hybrid": Metric(lora, Trace(Inverse(B.T*B)*xB.T*eB) + Trace(B.T*B*xA.T*eA), "hybrid")}
"""
from __future__ import annotations

import runpy
import time
from pathlib import Path

from derivations.errors import DeclarationError
from derivations.metric import Metric
from derivations.quotient import derive_geometry

from .generate import GeneratedModule, generate_module

__all__ = ["load_spec", "generate_from_spec"]


def load_spec(path: Path) -> dict:
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
    return spec


def generate_from_spec(path: Path, progress=None) -> tuple[list[GeneratedModule], dict]:
    """Derive and generate every module of a spec file, in memory (nothing written on failure)."""
    spec = load_spec(path)
    modules, timings = [], {}
    for name, metric in spec.items():
        t0 = time.perf_counter()
        geo = derive_geometry(metric)
        modules.append(generate_module(geo, name, origin=f"spec {Path(path).name}"))
        timings[name] = time.perf_counter() - t0
        if progress:
            progress(name, timings[name])
    return modules, timings
