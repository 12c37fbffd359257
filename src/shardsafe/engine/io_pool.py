"""The engine's I/O pool: the threads that write, read and checksum file ranges.

Storage backends do I/O when called and own no threads; the engine (writers, readers,
in-place loads) and the CLI submit their ranged jobs here. ``io_pool()`` is the one
getter of the process-wide pool; ``SharedThreadPool`` is the one lazily created, fork-safe
pool that the save pipeline's copy and transform pools are made of too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from .. import knobs


class SharedThreadPool:
    """A process-wide thread pool, created on first use with ``threads()`` threads.

    After ``fork`` the child has none of the parent's pool threads, and a job queued on the
    inherited pool would wait forever: the pool (and a lock a parent thread may have held at
    the fork) is forgotten there, and the child's first use creates its own."""

    def __init__(self, threads: Callable[[], int], prefix: str) -> None:
        self._threads = threads
        self._prefix = prefix
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        os.register_at_fork(after_in_child=self._forget)

    def get(self) -> ThreadPoolExecutor:
        """The pool, created now if this process has none yet."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads(), thread_name_prefix=self._prefix)
            return self._pool

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._pool = None


def io_threads() -> int:
    """Threads of the I/O pool (``SHARDSAFE_IO_THREADS``, default 4)."""
    return knobs.io_threads()


_io = SharedThreadPool(io_threads, "shardsafe-io")


def io_pool() -> ThreadPoolExecutor:
    """The process-wide pool for file I/O (created lazily on first use)."""
    return _io.get()


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
