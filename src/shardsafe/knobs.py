"""Tuning knobs: the one library module that reads environment variables.

Every variable is read when its getter is called (not at import), so a test or a
launcher may set it before the first save. docs/reference/environment.md lists
them all; add a new one there and here, nowhere else.
"""

from __future__ import annotations

import os

def environment() -> dict[str, str]:
    """A copy of this process's environment (what a child process starts from)."""
    return dict(os.environ)


def export(**variables: str) -> None:
    """Sets ``variables`` in this process's environment (e.g. the ``env://`` rendezvous
    variables torch.distributed reads when a rank joins a new group)."""
    os.environ.update(variables)


TIMEOUT = "SHARDSAFE_TIMEOUT"
COPY_THREADS = "SHARDSAFE_COPY_THREADS"
IO_THREADS = "SHARDSAFE_IO_THREADS"
DIRECT_IO = "SHARDSAFE_DIRECT_IO"
STALL_TIMEOUT = "SHARDSAFE_STALL_TIMEOUT"
REQUEST_ATTEMPTS = "SHARDSAFE_REQUEST_ATTEMPTS"
STORE_REQUESTS = "SHARDSAFE_STORE_REQUESTS"
HEDGE = "SHARDSAFE_HEDGE"
HEDGE_BUDGET = "SHARDSAFE_HEDGE_BUDGET"
STALL_FLOOR = "SHARDSAFE_STALL_FLOOR"


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


def stall_timeout() -> float:
    """Seconds an object-store request may make no progress before it is abandoned and
    retried, at most (``SHARDSAFE_STALL_TIMEOUT``, default 30); requests that report their
    progress are abandoned sooner, after a limit learned from the store's recent gaps."""
    return max(0.1, float(os.environ.get(STALL_TIMEOUT, "30")))


def request_attempts() -> int:
    """Tries of one object-store request, the first included (``SHARDSAFE_REQUEST_ATTEMPTS``,
    default 10)."""
    return max(1, int(os.environ.get(REQUEST_ATTEMPTS, "10")))


def store_requests() -> int:
    """Object-store requests one process keeps in flight at most (``SHARDSAFE_STORE_REQUESTS``,
    default 16)."""
    return max(1, int(os.environ.get(STORE_REQUESTS, "16")))


def hedge() -> bool:
    """Whether idempotent object-store requests (ranged reads, HEADs, part uploads) are hedged (``SHARDSAFE_HEDGE``;
    ``0`` turns it off)."""
    return os.environ.get(HEDGE, "1") != "0"


def hedge_budget() -> float:
    """Duplicate requests per request made, at most (``SHARDSAFE_HEDGE_BUDGET``, default 0.05)."""
    return min(1.0, max(0.0, float(os.environ.get(HEDGE_BUDGET, "0.05"))))


def stall_floor() -> float:
    """Seconds without progress that never count as a stall (``SHARDSAFE_STALL_FLOOR``, default 2)."""
    return max(0.1, float(os.environ.get(STALL_FLOOR, "2")))
