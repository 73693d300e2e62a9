"""Timing machinery of the geosharp benchmarks (``benchmarks/run.py``), independent of what is timed.

* :func:`interleaved` — wall time (and optionally CPU time and minor page faults) of several callables
  in interleaved repetitions, the order rotating each repetition;
* :func:`ratio_stats` — per-repetition ratios of two such series (median, min, max) and the best-of ratio;
* :func:`flop_counter` — matrix-product FLOP counting (``FlopCounterMode`` that also counts ``baddbmm_``);
* :func:`maxrss_bytes` — peak resident set of this process;
* :func:`machine_info` — the machine and library versions a report states;
* :func:`sync` — wait for a device's queued work (no-op on CPU).
"""
from __future__ import annotations

import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

from geosharp_ref.io.machine import cpu_name


def sync(device):
    """Wait for the work queued on ``device`` (CUDA); nothing to wait for on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(fns: dict, reps: int, device=torch.device("cpu"), warmup: int = 1, resources: bool = False):
    """Time each callable ``reps`` times after ``warmup`` untimed rounds, interleaved (rotating order);
    returns name -> [seconds] of wall time. With ``resources``, returns (wall, cpu, faults): also
    name -> [seconds] of this process's CPU time (time.process_time: excludes the time the process
    waits while other tenants run) and name -> [minor page faults] (getrusage: pages the kernel had to
    map and zero during the call, e.g. while the heap still grows)."""
    def minflt():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    times, cpu, faults = ({n: [] for n in names} for _ in range(3))
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            sync(device)
            f, c, t = minflt(), time.process_time(), time.perf_counter()
            fns[n]()
            sync(device)
            times[n].append(time.perf_counter() - t)
            cpu[n].append(time.process_time() - c)
            faults[n].append(minflt() - f)
    return (times, cpu, faults) if resources else times


def ratio_stats(num: list, den: list) -> dict:
    """Per-repetition ratios (median, min, max) and the ratio of the best (minimum) times.

    On a shared machine other tenants only ever add time, so min(num)/min(den) estimates the ratio
    of the intrinsic costs; the per-repetition median also carries the interference."""
    rs = [a / b if b else float("nan") for a, b in zip(num, den)]
    best = min(num) / min(den) if min(den) else float("nan")
    return dict(median=statistics.median(rs), lo=min(rs), hi=max(rs), n=len(rs), best=best)


def flop_counter():
    """``torch.utils.flop_counter.FlopCounterMode`` that also counts the in-place ``baddbmm_`` (the
    accumulated products of :meth:`geosharp_ref.lazy_blocks.Span.materialize`; torch registers only
    the out-of-place op)."""
    from torch.utils.flop_counter import FlopCounterMode

    def baddbmm_flops(self_shape, a_shape, b_shape, out_shape=None, **kwargs):
        (batch, rows, inner), cols = a_shape, b_shape[-1]
        return 2 * batch * rows * inner * cols  # as torch counts bmm/baddbmm (the accumulation not counted)
    return FlopCounterMode(display=False, custom_mapping={torch.ops.aten.baddbmm_: baddbmm_flops})


def maxrss_bytes() -> int:
    """Peak resident set of this process. Linux: VmHWM of /proc/self/status (per address space;
    ru_maxrss would carry the parent's peak across fork + exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def machine_info(device) -> dict:
    """The machine, thread count and library versions (torch, python, transformers; the GPU on CUDA)."""
    info = dict(cpu=cpu_name(), cores=os.cpu_count(), torch_threads=torch.get_num_threads(),
                torch=torch.__version__, python=platform.python_version(), platform=platform.platform(),
                device=str(device))
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info
