"""Pausing Python's cyclic garbage collector while the caller's thread does per-tensor bookkeeping.

Flattening a state, planning it and building or decoding its index allocate a few
container objects per tensor. With 100,000 tensors that is enough allocations to trigger
several full collections, each of which walks every object of the process (the caller's
model and optimizer included): measured on a 100,000-tensor flatten, two thirds of its
time. Nothing those phases allocate forms reference cycles, so collection can wait until
they are done.

CPython's collector is process-wide: ``gc.disable()`` stops collections for every thread,
the training thread's included, and there is no per-thread switch. So the library pauses
it only around work that runs on the caller's own thread while that thread is blocked in
the call anyway (a save's flatten and planning, a load), and never from a background
thread: an async save's writer thread writes and commits with collection on, so the
training thread is never without collection for longer than one save's planning.
Imports nothing from the package, so any layer may use it.
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
    the collector is re-enabled, if it was enabled before, when the last block exits).
    Only for work on the caller's own thread (see the module docstring)."""
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
