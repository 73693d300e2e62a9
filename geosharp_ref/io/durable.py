"""Durable files: atomic replacement, fsync'd appends, torn-line repair.

A long run writes its results so that a kill at any moment loses at most the item in progress and never
leaves a half-written file behind:

* :func:`write_json_atomic`, :func:`save_torch_atomic` — write a temporary file beside the target, fsync
  it, ``os.replace`` it over the target (readers see the old or the new file, never a mix);
* :func:`append_line` — one JSON line appended with a single ``os.write`` and ``os.fsync``;
* :func:`read_jsonl` — the complete lines of a JSON-lines file, optionally truncating a torn last line;
* :func:`fsync_dir`, :func:`fsync_tree` — make renames and new files durable;
* :func:`write_text_atomic` — any text (a command's ``--json`` output), replaced atomically;
* :func:`check_output_path` — refuse an output that would replace one of the run's own inputs;
* :func:`exclusive_lock` — one writer at a time (an advisory ``flock`` held for the duration; the OS
  releases it when the process dies, so a killed run never leaves a stale lock).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
from pathlib import Path

import torch

__all__ = ["exclusive_lock", "write_text_atomic", "check_output_path", "write_json_atomic", "save_torch_atomic", "append_line", "read_jsonl", "fsync_dir", "fsync_tree", "file_digest"]


def _tmp_beside(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_text_atomic(path, text: str) -> None:
    """``text`` in ``path``, replaced atomically (written beside it, fsync'd, then ``os.replace``d): a reader or a
    killed run sees the old file or the new one, never a part."""
    path = Path(path)
    tmp = _tmp_beside(path)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json_atomic(path, obj) -> None:
    """``obj`` as indented, key-sorted JSON in ``path``, replaced atomically (fsync'd first)."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def check_output_path(out, option: str, inputs: dict) -> Path:
    """``out`` (given as ``option``), refused with ValueError when it is a directory or the same file as one of
    ``inputs`` (``{option: path or None}``): writing it would replace the run's own input."""
    out = Path(out)
    if out.is_dir():
        raise ValueError(f"{option} {str(out)!r} is a directory; give a file name such as "
                         f"{str(out / 'out.json')!r}")
    for name, path in inputs.items():
        if path is None:
            continue
        same = out.resolve() == Path(path).resolve()
        if not same and out.exists() and Path(path).exists():
            same = os.path.samefile(out, path)
        if same:
            raise ValueError(f"{option} {str(out)!r} is the input file of {name}; writing it would replace your "
                             f"input: give another output file")
    return out


def file_digest(path) -> str:
    """The SHA-256 of the file at ``path`` (hex), read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_torch_atomic(obj, path) -> None:
    """``torch.save(obj)`` into ``path``, replaced atomically."""
    path = Path(path)
    tmp = _tmp_beside(path)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def append_line(path, record: dict) -> None:
    """Append ``record`` as one key-sorted JSON line with a single write, then fsync."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path, repair: bool = False) -> list:
    """Complete JSON lines of ``path`` ([] if missing); with ``repair`` a torn last line (a killed
    writer) is truncated away on disk."""
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if repair and end < len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
    out = []
    for line in data[:end].splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # only possible after external tampering; recomputed then
                continue
    return out


def fsync_dir(path) -> None:
    """fsync a directory (its entries: renames, new files); a no-op where the OS refuses."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(path) -> None:
    """fsync every file below ``path``."""
    for p in Path(path).rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


@contextlib.contextmanager
def exclusive_lock(path, busy: str = "the resource is in use by another process", enabled: bool = True,
                   wait: bool = False):
    """Hold an exclusive ``flock`` on ``path`` (created if needed) for the ``with`` block; a second holder is
    refused at once with ``ValueError(busy)``, or with ``wait`` waits until the first one is done."""
    if not enabled:
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ValueError(busy) from None
            raise
        yield
    finally:
        os.close(fd)
