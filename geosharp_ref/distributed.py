"""torch.distributed plumbing for population evaluation (torchrun-compatible).

Launch with ``torchrun --nproc_per_node N -m geosharp_ref.cli population evaluate --out DIR`` (or the
``geosharp`` script): :func:`maybe_init` reads torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and initialises the default process group with
``nccl`` when CUDA is available (one GPU per local rank) and ``gloo`` otherwise. Without those
variables (or with ``WORLD_SIZE=1``) everything below is a single-process no-op.

Sharding is by model: rank r takes ``pending[r::world]`` of the models still to evaluate (the same
list on every rank: rank 0 computes it and broadcasts it), so the shards are disjoint and cover the
population. Each rank writes its results to its own append-only file and also sends them to rank 0
(``gather_object``), which merges them into one file in manifest order: the merged result does not
depend on the number of ranks or on the order in which they finished.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist

__all__ = ["rank_world", "is_distributed", "maybe_init", "shard", "barrier", "broadcast_object",
           "gather_objects", "default_device", "backend_for", "COLLECTIVE_TIMEOUT_S", "NCCL_TIMEOUT_S",
           "die_with_parent"]


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank_world():
    """``(rank, world_size)`` of the default group, ``(0, 1)`` when not distributed."""
    if is_distributed():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def backend_for(cuda: bool | None = None) -> str:
    cuda = torch.cuda.is_available() if cuda is None else cuda
    return "nccl" if cuda and dist.is_nccl_available() else "gloo"


def default_device() -> torch.device:
    """``cuda:LOCAL_RANK`` under an NCCL group, else CPU."""
    if is_distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


#: how long a gloo rank waits in a collective (:func:`maybe_init`): at the end of a population evaluation on CPUs a
#: rank that has finished its shard waits for the slowest one, up to a model's evaluation (about an hour for the
#: tweets protocol's MiniLM) and more; a rank that fails ends the others through torchrun, not through this timeout
COLLECTIVE_TIMEOUT_S = 7 * 24 * 3600.0
#: the same for an NCCL group (a GPU evaluates a model in minutes: a hung collective surfaces within the hour)
NCCL_TIMEOUT_S = 3600.0
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Have the kernel send ``sig`` to this process when its parent exits (Linux ``prctl(PR_SET_PDEATHSIG)``), and
    exit now where the parent is already gone. torchrun starts each rank in a session of its own, so a rank whose
    launcher is killed (SIGKILL, a killed sitting) would otherwise run on unseen, beside the next run. True when
    set (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        ok = libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if ok and os.getppid() != parent:  # the parent exited before the request took effect
        os.kill(os.getpid(), sig)
    return ok


@contextlib.contextmanager
def maybe_init(backend: str | None = None, timeout_s: float | None = None):
    """Initialise the default process group from torchrun's environment if ``WORLD_SIZE`` > 1
    (and none exists yet); destroy it on exit. Yields ``(rank, world)``. ``timeout_s``: the collectives' timeout
    (None: :data:`COLLECTIVE_TIMEOUT_S` for gloo, a waiting rank sleeps and does not spin; :data:`NCCL_TIMEOUT_S`
    for NCCL). A rank also dies with its launcher (:func:`die_with_parent`)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    created = False
    if world > 1 and not is_distributed():
        backend = backend or backend_for()
        if timeout_s is None:
            timeout_s = NCCL_TIMEOUT_S if backend == "nccl" else COLLECTIVE_TIMEOUT_S
        die_with_parent()
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
        created = True
    try:
        yield rank_world()
    finally:
        if created:
            dist.destroy_process_group()


def shard(items, rank: int, world: int):
    """Rank ``rank``'s disjoint share of ``items`` (round robin: balanced when costs are similar)."""
    return list(items)[rank::world]


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def broadcast_object(obj, src: int = 0):
    """``obj`` of rank ``src`` on every rank (unchanged when not distributed)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj, dst: int = 0):
    """List of every rank's ``obj`` (rank order) on ``dst``, ``None`` elsewhere; ``[obj]`` when single."""
    if not is_distributed():
        return [obj]
    rank, world = rank_world()
    out = [None] * world if rank == dst else None
    dist.gather_object(obj, out, dst=dst)
    return out
