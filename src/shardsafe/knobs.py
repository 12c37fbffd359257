"""Tuning knobs: the one library module that reads environment variables.

Every variable is read when its getter is called (not at import), so a test or a
launcher may set it before the first save. docs/reference/environment.md lists
them all; add a new one there and here, nowhere else.
"""

from __future__ import annotations

import os

TIMEOUT = "SHARDSAFE_TIMEOUT"
COPY_THREADS = "SHARDSAFE_COPY_THREADS"
IO_THREADS = "SHARDSAFE_IO_THREADS"
DIRECT_IO = "SHARDSAFE_DIRECT_IO"


def timeout() -> float:
    """Seconds a rank waits for the others in collective work (``SHARDSAFE_TIMEOUT``, default 600)."""
    return float(os.environ.get(TIMEOUT, "600"))


def copy_threads() -> int:
    """Threads that copy during staging (``SHARDSAFE_COPY_THREADS``, default: CPUs, at most 4)."""
    env = os.environ.get(COPY_THREADS)
    if env:
        return max(1, int(env))
    return max(1, min(4, os.cpu_count() or 1))


def io_threads() -> int:
    """Threads of the engine's I/O pool (``SHARDSAFE_IO_THREADS``, default 4)."""
    return max(1, int(os.environ.get(IO_THREADS, "4")))


def direct_io() -> bool:
    """Whether local files may use ``O_DIRECT`` (``SHARDSAFE_DIRECT_IO``; ``0`` turns it off)."""
    return os.environ.get(DIRECT_IO, "1") != "0"
