"""Per-thread reusable byte buffers.

Hot paths that need a temporary of up to a block (a coalesced read, a block's planes to
code, a private copy of a block) take it from a ``ScratchBuffer`` instead of allocating
fresh megabytes, whose pages would be faulted in again on every use. Each user holds its
own instance, so buffers of different users never alias within a thread. Imports nothing
from the package, so any layer may use it.
"""

from __future__ import annotations

import threading

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
