"""The machine a result was measured on, as the result files state it."""
from __future__ import annotations

import platform

__all__ = ["cpu_name"]


def cpu_name() -> str:
    """The CPU's model name: the first ``model name`` line of ``/proc/cpuinfo`` (Linux); elsewhere, or where that
    file cannot be read or has no such line, ``platform.processor()`` (then ``platform.machine()``, e.g.
    ``x86_64``, where that is empty)."""
    fallback = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), fallback)
    except OSError:
        return fallback
