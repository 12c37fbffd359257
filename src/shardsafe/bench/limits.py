"""The machine's own limits, measured in the same run as the systems under test.

All on ``nbytes`` bytes: memcpy into a pre-faulted buffer and into a fresh allocation;
direct-I/O write (+fsync) and cold direct-I/O read of a file in the benchmark
directory with the I/O pool's thread count; buffered write + fsync; buffered cold read.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .._numbers import ceil_div
from ..engine.buffers import HostBuffer
from ..engine.io_pool import io_threads
from ..format.datafile import ALIGN
from .measure import Samples, drop_cache, settle, timed

SEG = 64 << 20


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(o, min(SEG, n - o)) for o in range(0, n, SEG)]


def _direct_write(path: str, buf: HostBuffer, pool: ThreadPoolExecutor) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o644)
    try:
        def one(c: tuple[int, int]) -> None:
            o, n = c
            os.pwrite(fd, buf.view(o, o + ceil_div(n, ALIGN) * ALIGN), o)
        list(pool.map(one, _chunks(buf.nbytes)))
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: str, buf: HostBuffer, pool: ThreadPoolExecutor, direct: bool) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECT", 0) if direct else 0))
    try:
        list(pool.map(lambda c: os.preadv(fd, [buf.view(c[0], c[0] + ceil_div(c[1], ALIGN) * ALIGN)], c[0]),
                      _chunks(buf.nbytes)))
    finally:
        os.close(fd)


def _buffered_write(path: str, src: np.ndarray) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        mv = memoryview(src)
        for o, n in _chunks(src.size):
            os.pwrite(fd, mv[o : o + n], o)
        os.fsync(fd)
    finally:
        os.close(fd)


def measure_limits(nbytes: int, directory: str, repeat: int) -> dict[str, float]:
    """Median GB/s of each machine limit over ``repeat`` runs."""
    nbytes = max(ALIGN, nbytes // ALIGN * ALIGN)
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = HostBuffer(nbytes)
    path = os.path.join(directory, "limits.bin")
    s = Samples()
    with ThreadPoolExecutor(io_threads()) as pool:
        for _ in range(repeat):
            s.add(memcpy_prefaulted=timed(lambda: np.copyto(dst.array, src)))

            def fresh() -> None:
                b = HostBuffer(nbytes, prefault=False)
                np.copyto(b.array, src)
                b.close()
            s.add(memcpy_fresh=timed(fresh))
            settle()
            s.add(direct_write=timed(lambda: _direct_write(path, dst, pool)))
            drop_cache(path)
            s.add(direct_read_cold=timed(lambda: _read(path, dst, pool, True)))
            os.remove(path)  # a fresh file for the buffered write, like the systems get
            settle()
            s.add(buffered_write_fsync=timed(lambda: _buffered_write(path, src)))
            drop_cache(path)
            s.add(buffered_read_cold=timed(lambda: _read(path, dst, pool, False)))
            os.remove(path)
            settle()
    dst.close()
    return {k: nbytes / s.median(k) / 1e9 for k in s.values}


LIMIT_LABELS = {
    "memcpy_prefaulted": "memcpy into a pre-faulted buffer (1 thread)",
    "memcpy_fresh": "memcpy into a fresh allocation (1 thread)",
    "direct_write": "direct-I/O write + fsync",
    "direct_read_cold": "direct-I/O read",
    "buffered_write_fsync": "buffered write + fsync",
    "buffered_read_cold": "buffered read, cold cache",
}
