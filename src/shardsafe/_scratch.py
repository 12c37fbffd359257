"""Reusable byte buffers.

Hot paths that need a temporary of up to a block (a coalesced read, a block's planes to
code, a private copy of a block) take it from a ``ScratchBuffer`` (one per thread) or a
``ScratchPool`` (one per call in progress) instead of allocating fresh megabytes, whose
pages would be faulted in again on every use. Each user holds its own instance, so
buffers of different users never alias. Imports nothing from the package, so any layer
may use it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np


class ScratchBuffer:
    """A grow-only uint8 buffer per thread; ``get(n)`` is a view of its first ``n`` bytes,
    valid until the same thread's next ``get``. ``minimum`` is the smallest size allocated."""

    def __init__(self, minimum: int = 0) -> None:
        self._local = threading.local()
        self._minimum = minimum

    def get(self, nbytes: int) -> np.ndarray:
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.size < nbytes:
            buf = self._local.buf = np.empty(max(nbytes, self._minimum), dtype=np.uint8)
        return buf[:nbytes]


class ScratchPool:
    """Grow-only uint8 buffers shared by threads: ``with pool.get(n) as buf`` lends a
    buffer of ``n`` bytes for the block. It keeps as many buffers as were ever lent at
    once, so a temporary of megabytes costs its callers' concurrency, not every thread
    that ever ran one (a pool of 4 threads coding 2 blocks at a time holds 2)."""

    def __init__(self) -> None:
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    @contextmanager
    def get(self, nbytes: int) -> Iterator[np.ndarray]:
        with self._lock:
            buf = self._free.pop() if self._free else None
        if buf is None or buf.size < nbytes:
            buf = np.empty(nbytes, dtype=np.uint8)
        try:
            yield buf[:nbytes]
        finally:
            with self._lock:
                self._free.append(buf)
