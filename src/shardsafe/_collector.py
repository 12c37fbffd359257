"""Pausing Python's cyclic garbage collector around per-tensor bookkeeping.

Flattening a state, planning it and building or decoding its index allocate a few
container objects per tensor. With 100,000 tensors that is enough allocations to trigger
several full collections, each of which walks every object of the process (the caller's
model and optimizer included): measured on a 100,000-tensor flatten, two thirds of its
time. Nothing those phases allocate forms reference cycles, so collection can wait until
they are done. Imports nothing from the package, so any layer may use it.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def paused() -> Iterator[None]:
    """Disables automatic collection inside the block (nested and threaded uses count:
    the collector is re-enabled, if it was enabled before, when the last block exits)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
