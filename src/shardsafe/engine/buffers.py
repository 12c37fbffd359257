"""Page-aligned, pre-faulted host buffers (anonymous mmap), reusable across saves.

Why mmap and pre-faulting: a copy into freshly allocated memory runs at page-fault
speed (~2 GB/s on the project machine) while a copy into memory whose pages already
exist runs at memcpy speed (~15 GB/s). Staging buffers are therefore allocated once
per state layout (``StagingArena``) and touched once up front; alignment lets the
writers hand them to ``O_DIRECT`` without a bounce copy, and huge pages (see
``storage.memory``) make both the pre-faulting and the direct I/O cheaper.
"""

from __future__ import annotations

import logging
import mmap
import threading
from collections.abc import Sequence

import numpy as np

from .._numbers import ceil_div
from ..format.datafile import ALIGN
from ..storage.memory import anonymous
from . import cuda

log = logging.getLogger("shardsafe")

PAGE = mmap.PAGESIZE


def round_up(n: int, to: int = ALIGN) -> int:
    """``n`` rounded up to a multiple of ``to`` (buffers are padded to ALIGN so that the
    last range of a file goes through direct I/O too)."""
    return ceil_div(n, to) * to


class HostBuffer:
    """A page-aligned host byte buffer, suitable as a direct-I/O source.

    Memory comes from an anonymous mapping, so it is page-aligned and returned to the
    OS on ``close()``. ``array`` has exactly ``nbytes`` bytes; the mapping is padded to
    a multiple of 4096 (``capacity``) so a writer may send the last range padded.

    Args:
        nbytes: Usable size.
        prefault: Touch every page now so later copies run at memcpy speed.
        pin: Register the memory with CUDA (page-locked) for asynchronous device copies;
            ignored without CUDA.
    """

    def __init__(self, nbytes: int, *, prefault: bool = True, pin: bool = False) -> None:
        self.nbytes = nbytes
        self.capacity = max(round_up(nbytes), ALIGN)
        self._map, self._full = anonymous(self.capacity)
        self.array = self._full[:nbytes]
        if prefault:
            self._full[::PAGE] = 0
        self.pinned = bool(pin and cuda.available() and cuda.pin(self._full))

    def view(self, start: int = 0, stop: int | None = None) -> memoryview:
        """A memoryview of ``[start, stop)``; ``stop`` may reach into the padding."""
        return memoryview(self._full)[start:stop]

    @property
    def closed(self) -> bool:
        return self._map.closed

    def close(self) -> None:
        """Returns the memory to the OS (if no view of it is alive, else when they die)."""
        if self._map.closed:
            return
        if self.pinned:
            cuda.unpin(self._full)
            self.pinned = False
        self.array = self._full = np.empty(0, dtype=np.uint8)
        try:
            self._map.close()
        except BufferError:  # a view is still alive somewhere; the GC frees it later
            pass


class StagingArena:
    """Staging buffers kept for reuse: one set per state layout (a list of file sizes).

    ``get(sizes)`` hands out the buffers of the previous save when the layout is the
    same; otherwise it frees them and allocates (and pre-faults) new ones, so at most
    one copy of the state is held. Not a pool for concurrent saves: the Checkpointer
    runs one save at a time and holds its buffers until that save is written.
    """

    def __init__(self, *, pin: bool = False) -> None:
        self.pin = pin
        self._lock = threading.Lock()
        self._sizes: tuple[int, ...] | None = None
        self._buffers: list[HostBuffer] = []
        self.allocations = 0  # how many times buffers were (re)allocated; for tests/benchmarks

    def get(self, sizes: Sequence[int]) -> list[HostBuffer]:
        """Buffers of exactly ``sizes`` bytes, reused when the sizes match the last call."""
        key = tuple(int(s) for s in sizes)
        with self._lock:
            if key != self._sizes:
                self._free()
                log.debug("allocating %d staging buffer(s), %d bytes", len(key), sum(key))
                self._buffers = [HostBuffer(n, pin=self.pin) for n in key]
                self._sizes = key
                self.allocations += 1
            return list(self._buffers)

    @property
    def buffers(self) -> tuple[HostBuffer, ...]:
        """The buffers currently held (the ones the next same-layout save reuses)."""
        return tuple(self._buffers)

    @property
    def nbytes(self) -> int:
        """Bytes currently held."""
        return sum(b.nbytes for b in self._buffers)

    def _free(self) -> None:
        for b in self._buffers:
            b.close()
        self._buffers, self._sizes = [], None

    def release(self) -> None:
        """Frees the buffers (the next ``get`` allocates again)."""
        with self._lock:
            self._free()


class BouncePool:
    """A few fixed-size aligned buffers for streaming writes (sync saves need no full copy).

    ``acquire`` blocks until a buffer is free, so memory stays at ``count * size``.
    """

    def __init__(self, size: int, count: int) -> None:
        self.size = size
        self.count = count
        self._free: list[HostBuffer] = []
        self._made = 0
        self._cond = threading.Condition()

    def acquire(self) -> HostBuffer:
        with self._cond:
            while not self._free and self._made >= self.count:
                self._cond.wait()
            if self._free:
                return self._free.pop()
            self._made += 1
        return HostBuffer(self.size)

    @property
    def nbytes(self) -> int:
        """Bytes allocated (in use or idle)."""
        return self._made * self.size

    def release(self, buf: HostBuffer) -> None:
        with self._cond:
            self._free.append(buf)
            self._cond.notify()

    def close(self) -> None:
        """Frees the idle buffers (buffers still acquired are freed by their holders' GC)."""
        with self._cond:
            for b in self._free:
                b.close()
            self._made -= len(self._free)
            self._free.clear()
