"""The engine's I/O pool: the threads that write, read and checksum file ranges.

Storage backends do I/O when called and own no threads; the engine (writers, readers,
in-place loads) and the CLI submit their ranged jobs here. ``io_pool()`` is the one
getter of the process-wide pool, so resetting it (e.g. in a forked child) means
dropping one module-level reference.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from .. import knobs

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def io_threads() -> int:
    """Threads of the I/O pool (``SHARDSAFE_IO_THREADS``, default 4)."""
    return knobs.io_threads()


def io_pool() -> ThreadPoolExecutor:
    """The process-wide pool for file I/O (created lazily on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(io_threads(), thread_name_prefix="shardsafe-io")
        return _pool


def _reset_in_child() -> None:
    """After ``fork``: the child has none of the parent's pool threads, and a job queued on
    the inherited pool would wait forever. Forget it (and a lock a parent thread may have
    held at the fork); the child's first I/O creates its own pool."""
    global _pool, _pool_lock
    _pool_lock = threading.Lock()
    _pool = None


os.register_at_fork(after_in_child=_reset_in_child)


def wait_all(futures: Sequence[Future]) -> None:
    """Waits for every future, then re-raises the first error (never leaves one running).

    Callers close descriptors and free buffers after this returns, so no job may still
    be using them: waiting for all before raising is what makes that safe.
    """
    first: BaseException | None = None
    for f in futures:
        exc = f.exception()
        if exc is not None and first is None:
            first = exc
    if first is not None:
        raise first
