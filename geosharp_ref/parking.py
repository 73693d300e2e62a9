"""Park tensors' memory in an anonymous temporary file, or an accelerator's in host memory, while they are not
needed (memory-bound runs).

:func:`park` writes the bytes of the storages under the given tensors to a temporary file that has no name
(``tempfile.TemporaryFile``: nothing is left behind, also when the process dies) and points every one of those
tensor objects at an empty storage (``Tensor.set_()``: shape ``(0,)``), so the memory is freed as soon as no
other tensor shares it, while the objects stay — and with them everything that refers to them: lists,
dictionaries, a space's per-vector state. :meth:`Parked.restore` reads the bytes back into a new storage per old
one and points each object at it with its old offset, shape and strides: the same objects hold exactly their old
values (bit for bit, at new addresses; tensors that shared a storage share one again).

An accelerator's storages wait in host memory instead (``medium`` "host", the default for them): one copy each
way over the bus frees the device's memory, where a file would add a write and a read through the host on top
(a choice made on that count, not yet timed on a GPU: ``benchmarks/profile_cuda.py`` has a row for each medium;
``benchmarks/RESULTS.md``, section 6). The CPU's storages go to the file, where host memory is the memory to
free; ``medium`` chooses either for any storage.

Parking never loses values: a tensor not passed in that shares a parked storage (a view made earlier) keeps
that storage alive and unchanged (memory is then not saved), and when the file cannot be written (e.g. a full
disk) or host memory holds no copy, nothing is parked. Every byte parked in the file goes through one host
buffer of :data:`CHUNK_BYTES` (exporting the storage itself to numpy would pin it; on an accelerator the copy to
the host is needed anyway). Used by Auto-PGD for an older best point (:func:`geosharp_ref.apgd.apgd`) and by
``geosharp verify`` for θ while a moved orbit point is measured
(:func:`geosharp_ref.verification.orbits.parameters_moved_to`).
"""
from __future__ import annotations

import tempfile

import torch

__all__ = ["Parked", "park", "default_medium", "CHUNK_BYTES", "MEDIA"]

#: size of the host buffer every byte parked in the file passes through
CHUNK_BYTES = 64 << 20
#: where parked bytes can wait: an anonymous temporary file, or a host-memory copy
MEDIA = ("file", "host")


def default_medium(device: torch.device) -> str:
    """Where a storage on ``device`` is parked by default: host memory for an accelerator's, the file for the
    CPU's."""
    return "file" if torch.device(device).type == "cpu" else "host"


def _bytes_of(storage) -> torch.Tensor:
    """A uint8 tensor over the whole ``storage`` (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _chunks(view: torch.Tensor):
    for start in range(0, view.numel(), CHUNK_BYTES):
        yield view[start:start + CHUNK_BYTES]


class Parked:
    """Tensors whose storages wait in an anonymous temporary file or in host memory (see the module doc);
    :meth:`restore` once."""

    def __init__(self, file, groups):
        # groups: [(offset in the file or the host copy (a uint8 tensor), nbytes, device,
        #           [(tensor, storage_offset, size, stride)])]
        self._file, self._groups = file, groups

    @property
    def nbytes(self) -> int:
        """The bytes written (0 when nothing was parked)."""
        return sum(n for _, n, _, _ in self._groups)

    def restore(self) -> None:
        """Point every parked tensor at its old values again (a new storage per old one, read from the file or
        copied from host memory). Where a new storage cannot be had (no memory), the error propagates and the
        storages not yet restored stay parked: a second call restores them."""
        if not self._groups:
            return
        in_file = [n for where, n, _, _ in self._groups if not torch.is_tensor(where)]
        stage = torch.empty(min(CHUNK_BYTES, max(in_file)), dtype=torch.uint8) if in_file else None
        while self._groups:
            where, nbytes, device, views = self._groups[0]
            storage = torch.empty(nbytes, dtype=torch.uint8, device=device).untyped_storage()
            if torch.is_tensor(where):  # a host-memory copy
                _bytes_of(storage).copy_(where)
            else:
                self._file.seek(where)
                for part in _chunks(_bytes_of(storage)):
                    host = stage[:part.numel()]
                    if self._file.readinto(memoryview(host.numpy())) != part.numel():
                        raise OSError("parking: the temporary file was truncated")
                    part.copy_(host)
            with torch.no_grad():
                for t, storage_offset, size, stride in views:
                    t.set_(storage, storage_offset, size, stride)
            self._groups.pop(0)
        self.discard()

    def discard(self) -> None:
        """Drop the parked bytes without restoring (the file closed, the host copies released; the parked tensors
        stay empty)."""
        if self._file is not None:
            self._file.close()
        self._file, self._groups = None, []


class _NoHostMemory(Exception):
    """Host memory could not hold a parked storage's copy."""


def _host_bytes(nbytes: int) -> torch.Tensor:
    """A new uint8 host tensor of ``nbytes`` (:class:`_NoHostMemory` where the allocation fails)."""
    try:
        return torch.empty(nbytes, dtype=torch.uint8)
    except RuntimeError as e:  # the CPU allocator's out-of-memory error (torch.OutOfMemoryError included)
        raise _NoHostMemory(str(e)) from e


def park(tensors, medium: str | None = None) -> Parked:
    """Write the storages under ``tensors`` (an iterable; None entries skipped, each object once) to an anonymous
    temporary file or to host memory and empty the tensors; returns the :class:`Parked` handle that restores them.
    ``medium``: "file" or "host" for every storage; None: :func:`default_medium` of each storage's device."""
    if medium is not None and medium not in MEDIA:
        raise ValueError(f"unknown parking medium {medium!r}; choose one of {MEDIA}")
    by_storage, seen = {}, set()
    for t in tensors:
        if t is None or id(t) in seen or t.untyped_storage().nbytes() == 0:
            continue
        seen.add(id(t))
        s = t.untyped_storage()
        entry = by_storage.setdefault((s.device, s.data_ptr()), (s, []))
        entry[1].append((t, t.storage_offset(), tuple(t.shape), t.stride()))
    if not by_storage:
        return Parked(None, [])
    media = [medium or default_medium(s.device) for s, _ in by_storage.values()]
    in_file = [s.nbytes() for (s, _), m in zip(by_storage.values(), media) if m == "file"]
    file, groups = tempfile.TemporaryFile() if in_file else None, []
    try:
        stage = torch.empty(min(CHUNK_BYTES, max(in_file)), dtype=torch.uint8) if in_file else None
        for (s, views), m in zip(by_storage.values(), media):
            if m == "file":
                offset = file.tell()
                for part in _chunks(_bytes_of(s)):
                    host = stage[:part.numel()]
                    host.copy_(part)
                    file.write(memoryview(host.numpy()))
                groups.append((offset, s.nbytes(), s.device, views))
            else:
                copy = _host_bytes(s.nbytes())
                copy.copy_(_bytes_of(s))  # a device's error here propagates: nothing is emptied yet
                groups.append((copy, s.nbytes(), s.device, views))
        if file is not None:
            file.flush()
    except (OSError, _NoHostMemory):  # nothing is emptied before every byte is saved
        if file is not None:
            file.close()
        return Parked(None, [])
    with torch.no_grad():
        for _, _, _, views in groups:
            for t, *_ in views:
                t.set_()
    return Parked(file, groups)
