"""Parking tensors in an anonymous temporary file or in host memory (geosharp_ref.parking): values back bit for bit
in the same objects, the memory freed meanwhile, nothing left behind, nothing lost when parking cannot help."""
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st
from torch.multiprocessing.reductions import StorageWeakRef

from geosharp_ref import parking
from geosharp_ref.parking import park


@pytest.fixture
def tmpdir_only(tmp_path, monkeypatch):
    """Temporary files go to an empty directory the test can inspect."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _snapshot(ts):
    return [(t.clone(), t.shape, t.stride(), t.storage_offset(), t.dtype) for t in ts]


def _bits(t):
    return t.contiguous().view(torch.uint8)


def _assert_restored(ts, snap):
    for t, (v, shape, stride, offset, dtype) in zip(ts, snap):
        assert (t.shape, t.stride(), t.storage_offset(), t.dtype) == (shape, stride, offset, dtype)
        assert torch.equal(_bits(t), _bits(v))  # bit patterns (a NaN payload included)


def test_park_frees_the_storages_and_restore_gives_the_same_objects_their_bits_back(tmpdir_only):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(300, 70, generator=g, dtype=torch.float64)
    a[0, 0] = float("nan")  # bit patterns, not values, are compared below
    b = a[5:9].mT  # a view of a's storage, passed as well: one storage, written once
    c = torch.randn(7, generator=g).to(torch.bfloat16)
    d = torch.empty_strided((4, 3), (1, 4), dtype=torch.int64).copy_(torch.arange(12).reshape(4, 3))  # strided
    ts = [a, b, c, d]
    snap = _snapshot(ts)
    refs = [StorageWeakRef(t.untyped_storage()) for t in (a, c, d)]
    handle = park(ts + [None, a])  # None skipped, a repeated once
    assert handle.nbytes == 300 * 70 * 8 + 7 * 2 + 12 * 8
    assert all(r.expired() for r in refs)  # the memory is gone while parked
    assert all(t.numel() == 0 for t in ts)
    assert len(list(tmpdir_only.iterdir())) == 0  # the file has no name
    handle.restore()
    _assert_restored(ts, snap)
    assert b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()  # views share one storage again
    handle.restore()  # a spent handle does nothing
    assert list(tmpdir_only.iterdir()) == []


def test_a_view_not_passed_keeps_its_storage_and_values(tmpdir_only):
    a = torch.randn(1000, dtype=torch.float64)
    outside = a[100:200]
    expected = outside.clone()
    handle = park([a])
    assert torch.equal(outside, expected)  # still readable: the storage lives on through the view
    handle.restore()
    assert torch.equal(a[100:200], expected) and torch.equal(outside, expected)


def test_nothing_is_parked_when_the_file_cannot_be_written(tmpdir_only, monkeypatch):
    class Full:
        def __init__(self):
            self.closed = False

        def tell(self):
            return 0

        def write(self, data):
            raise OSError(28, "No space left on device")

        def close(self):
            self.closed = True
    full = Full()
    monkeypatch.setattr(parking.tempfile, "TemporaryFile", lambda: full)
    a = torch.randn(50, dtype=torch.float64)
    expected = a.clone()
    handle = park([a])
    assert handle.nbytes == 0 and torch.equal(a, expected) and full.closed
    handle.restore()
    assert torch.equal(a, expected)


def test_discard_drops_the_values_and_the_file(tmpdir_only):
    a = torch.randn(64)
    handle = park([a])
    handle.discard()
    assert a.numel() == 0 and handle.nbytes == 0
    handle.restore()  # nothing to restore any more
    assert a.numel() == 0


@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=5),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.float16, torch.int32]),
       chunk=st.sampled_from([7, 4096, 1 << 20]), seed=st.integers(0, 2**16), medium=st.sampled_from(parking.MEDIA))
def test_round_trip_over_chunk_sizes(sizes, dtype, chunk, seed, medium):
    """Every byte passes through a host buffer of CHUNK_BYTES: storages smaller, equal to and many times larger
    than it come back bit for bit (empty tensors are left alone)."""
    old = parking.CHUNK_BYTES
    parking.CHUNK_BYTES = chunk
    try:
        g = torch.Generator().manual_seed(seed)
        ts = [(torch.randn(n, generator=g, dtype=torch.float64) * 100).to(dtype) for n in sizes]
        expected = [np.frombuffer(t.numpy().tobytes(), dtype=np.uint8).copy() for t in ts]
        handle = park(ts, medium=medium)
        assert handle.nbytes == sum(e.size for e in expected)
        handle.restore()
        for t, e in zip(ts, expected):
            assert np.array_equal(np.frombuffer(t.numpy().tobytes(), dtype=np.uint8), e)
    finally:
        parking.CHUNK_BYTES = old


def test_host_parking_frees_the_storages_without_a_file(monkeypatch):
    """``medium="host"`` (an accelerator's default) keeps a host copy: the storages are freed, no file is made,
    the same objects get their bits back and views share one storage again."""
    def no_file():
        raise AssertionError("host parking made a file")
    monkeypatch.setattr(parking.tempfile, "TemporaryFile", no_file)
    g = torch.Generator().manual_seed(3)
    a = torch.randn(200, 30, generator=g, dtype=torch.float64)
    b, c = a[2:5].mT, torch.randn(9, generator=g).to(torch.float16)
    snap = _snapshot([a, b, c])
    refs = [StorageWeakRef(t.untyped_storage()) for t in (a, c)]
    handle = park([a, b, c], medium="host")
    assert handle.nbytes == 200 * 30 * 8 + 9 * 2 and all(r.expired() for r in refs)
    assert all(t.numel() == 0 for t in (a, b, c))
    handle.restore()
    _assert_restored([a, b, c], snap)
    assert b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()


def test_the_default_medium_is_host_memory_for_accelerators_and_the_file_for_the_cpu():
    assert parking.default_medium(torch.device("cpu")) == "file"
    assert parking.default_medium(torch.device("cuda", 0)) == parking.default_medium("meta") == "host"
    with pytest.raises(ValueError, match="unknown parking medium 'disk'"):
        park([torch.zeros(3)], medium="disk")


def test_nothing_is_parked_when_host_memory_cannot_hold_a_copy(monkeypatch):
    def no_memory(nbytes):
        raise parking._NoHostMemory("DefaultCPUAllocator: not enough memory")
    monkeypatch.setattr(parking, "_host_bytes", no_memory)
    a, b = torch.randn(40, dtype=torch.float64), torch.randn(7)
    expected = [a.clone(), b.clone()]
    handle = park([a, b], medium="host")
    assert handle.nbytes == 0 and torch.equal(a, expected[0]) and torch.equal(b, expected[1])


def test_a_restore_without_memory_keeps_what_it_could_not_restore_parked(monkeypatch):
    """A restore that cannot allocate a storage raises and leaves that storage (and those after it) parked; a
    second restore gives them back: no value is lost."""
    a, b = torch.randn(30, dtype=torch.float64), torch.randn(11, dtype=torch.float64)
    expected = [a.clone(), b.clone()]
    handle = park([a, b], medium="host")
    real_empty, calls = torch.empty, []

    def second_fails(*args, **kwargs):
        calls.append(args)
        if sum(1 for c in calls if c and c[0]) == 2:  # the second new storage (not an empty tensor's)
            raise RuntimeError("out of memory")
        return real_empty(*args, **kwargs)
    monkeypatch.setattr(parking.torch, "empty", second_fails)
    with pytest.raises(RuntimeError, match="out of memory"):
        handle.restore()
    monkeypatch.setattr(parking.torch, "empty", real_empty)
    assert torch.equal(a, expected[0]) and b.numel() == 0 and handle.nbytes == 11 * 8
    handle.restore()
    assert torch.equal(b, expected[1]) and handle.nbytes == 0
