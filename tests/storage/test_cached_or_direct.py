"""Reads that take cached pages from the page cache and the rest with direct I/O."""

from __future__ import annotations

import os

import numpy as np
import pytest

from shardsafe.storage import cached_or_direct as cod
from shardsafe.storage.local import LocalStorage

N = (3 << 20) + 12345  # not a multiple of 4096: the last direct read is short


@pytest.fixture
def data_file(tmp_path):
    data = np.random.default_rng(0).integers(0, 255, N, dtype=np.uint8)
    p = tmp_path / "f"
    p.write_bytes(data.tobytes())
    return str(p), data


def _evict(path: str, offset: int = 0, length: int = 0) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.parametrize("offset,length", [(0, N), (1, N - 1), (4096, 1 << 20), (777, 300_001),
                                           (N - 5000, 5000), (123, 10)])
@pytest.mark.parametrize("cache", ["cold", "warm", "half"])
@pytest.mark.parametrize("direct", [True, False])
def test_every_range_reads_exact_bytes(data_file, offset, length, cache, direct):
    path, data = data_file
    if cache == "cold":
        _evict(path)
    elif cache == "half":
        _evict(path, N // 2, 0)
        with open(path, "rb") as f:
            f.read(N // 2)  # first half cached, second half not
    out = np.full(length, 0xEE, dtype=np.uint8)
    cod.read_range(path, offset, memoryview(out), direct=direct)
    assert np.array_equal(out, data[offset : offset + length])


def test_aligned_target_is_read_directly(data_file):
    path, data = data_file
    _evict(path)
    import mmap

    m = mmap.mmap(-1, 1 << 20)
    out = np.frombuffer(m, dtype=np.uint8)
    cod.read_range(path, 8192, memoryview(out), direct=True)
    assert np.array_equal(out, data[8192 : 8192 + (1 << 20)])


@pytest.mark.parametrize("direct", [True, False])
def test_reading_past_the_end_raises_eof(data_file, direct):
    path, _ = data_file
    _evict(path)
    out = np.empty(1 << 20, dtype=np.uint8)
    with pytest.raises(EOFError):
        cod.read_range(path, N - 1000, memoryview(out), direct=direct)
    with pytest.raises(EOFError):
        LocalStorage(direct_io=direct).read_into(path, N - 10, memoryview(out[:11]))


def test_residency_is_asked_of_the_kernel(data_file):
    path, _ = data_file
    fd = os.open(path, os.O_RDONLY)
    try:
        _evict(path)
        if cod.cached(fd, 0, N) is None:
            pytest.skip("mincore is not available")
        assert cod.cached(fd, 4096, 1 << 20) is False
        with open(path, "rb") as f:
            f.read()
        assert cod.cached(fd, 4096, 1 << 20) is True
        assert cod.cached(fd, 777, N - 777) is True
    finally:
        os.close(fd)


def test_cachestat_and_mincore_agree(data_file):
    """The two ways of asking (``cachestat``, used where the kernel has it, and a mapping
    plus ``mincore``) give the same answer, for ranges partly and wholly in the cache."""
    path, _ = data_file
    fd = os.open(path, os.O_RDONLY)
    try:
        _evict(path)
        if cod._cachestat(fd, 0, 4096) is None:
            pytest.skip("no cachestat (Linux before 6.5)")
        os.pread(fd, 1 << 20, 1 << 20)  # bytes [1 MiB, 2 MiB) only
        for offset, length in [(0, 4096), (1 << 20, 1 << 20), ((1 << 20) + 5, 100), ((1 << 20) - 1, 2),
                               ((2 << 20) - 10, 20), (1 << 20, (1 << 20) + 1), (2 << 20, 12345)]:
            by_stat = cod._cachestat(fd, offset, length)
            cod._has_cachestat = False
            try:
                by_map = cod.cached(fd, offset, length)
            finally:
                cod._has_cachestat = True
            assert by_stat == by_map, (offset, length)
    finally:
        os.close(fd)
