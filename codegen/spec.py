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
import contextlib
import math
import os
import runpy
import signal
import threading
import time
from pathlib import Path

from derivations.errors import DeclarationError
from derivations.metric import Metric
from derivations.quotient import derive_geometry

from .generate import GeneratedModule, generate_module

__all__ = ["load_spec", "load_spec_file", "generate_from_spec"]


#: the environment variable that bounds, in seconds, how long a spec file may run when it is loaded
TIMEOUT_ENV = "GEOSHARP_SPEC_TIMEOUT"
#: the bound without it: a spec file declares metrics, it computes nothing
SPEC_TIMEOUT_S = 60.0


def spec_timeout() -> float:
    """Seconds a spec file may run (``$GEOSHARP_SPEC_TIMEOUT``, default :data:`SPEC_TIMEOUT_S`)."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return SPEC_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise DeclarationError(f"{TIMEOUT_ENV}={raw!r} must be a positive number of seconds")
    return value


class _SpecTimeout(BaseException):
    """The spec file ran past its bound (a BaseException, so the file's own ``except Exception`` cannot swallow it)."""


class _CtrlC(BaseException):
    """Ctrl-C while the spec file ran (told apart from a KeyboardInterrupt the file raises itself)."""


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise :class:`_SpecTimeout` in the block after ``seconds`` (SIGALRM), and :class:`_CtrlC` on SIGINT;
    only where SIGALRM exists and in the main thread, else no bound."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise _SpecTimeout()

    def ctrl_c(signum, frame):
        raise _CtrlC()

    previous = signal.signal(signal.SIGALRM, expire), signal.signal(signal.SIGINT, ctrl_c)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _CtrlC:
        raise KeyboardInterrupt from None  # a real Ctrl-C stays one (exit 130), not an error of the file
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in zip((signal.SIGALRM, signal.SIGINT), previous):
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def load_spec(path: Path) -> dict:
    """The ``SPEC`` dict of a spec file (checked)."""
    return load_spec_file(path)[0]


def load_spec_file(path: Path) -> tuple[dict, dict]:
    """``(SPEC, BINDINGS)`` of a spec file, checked; BINDINGS is ``{}`` when the file declares none."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"spec file {path} does not exist")
    limit = spec_timeout()
    with _time_limit(limit):  # Ctrl-C while the file runs leaves it as KeyboardInterrupt (exit 130)
        try:
            namespace = runpy.run_path(str(path))
        except (Exception, SystemExit, KeyboardInterrupt, _SpecTimeout) as exc:
            error = exc
        else:
            error = None
    if error is not None:
        exc = error  # the user's file failed: one line, no traceback
        where = ""
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == str(path):
                where = f" (line {tb.tb_lineno})"
            tb = tb.tb_next
        if isinstance(exc, _SpecTimeout):
            raise DeclarationError(f"spec file {path} did not finish running within {limit:g} s{where}; a spec file "
                                   f"only declares SPEC (and BINDINGS) and should run in well under a second: remove "
                                   f"the loop or the long computation (or raise the bound with "
                                   f"{TIMEOUT_ENV}=SECONDS)") from None
        what = {SystemExit: "called sys.exit", KeyboardInterrupt: "raised KeyboardInterrupt"}.get(type(exc))
        detail = f": {exc}" if str(exc) and not isinstance(exc, (SystemExit, KeyboardInterrupt)) else ""
        raise DeclarationError(f"spec file {path} {what or 'raised ' + type(exc).__name__}{where}{detail}; fix "
                               f"the file (it must define SPEC = {{'module_name': Metric(...)}}, and not exit or "
                               f"stop while it runs)") from None
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
        metric.check_blocks(f"{path}: SPEC[{name!r}]")
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
