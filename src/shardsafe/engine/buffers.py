"""Page-aligned, pre-faulted host buffers (anonymous mmap), reusable across saves."""

from __future__ import annotations

import mmap

import numpy as np

PAGE = mmap.PAGESIZE


class HostBuffer:
    """A page-aligned host byte buffer, suitable as a direct-I/O source.

    Memory comes from an anonymous mapping, so it is page-aligned and returned to the
    OS on ``close()``. ``prefault()`` touches every page once so later copies run at
    memcpy speed instead of paying a page fault per 4 KiB.
    """

    def __init__(self, nbytes: int, *, prefault: bool = True) -> None:
        self.nbytes = nbytes
        self._map = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.array = np.frombuffer(self._map, dtype=np.uint8, count=nbytes)
        if prefault and nbytes:
            self.array[::PAGE] = 0

    def view(self, start: int = 0, stop: int | None = None) -> memoryview:
        return memoryview(self.array)[start:stop]

    def close(self) -> None:
        self.array = np.empty(0, dtype=np.uint8)
        try:
            self._map.close()
        except BufferError:  # a view is still alive somewhere; the GC frees it later
            pass
