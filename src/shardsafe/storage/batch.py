"""A batch of requests with a bounded number in flight, each slot reused as soon as it frees.

The parts of one ranged read or one multipart upload are independent: each lands in its
own range of the destination, or under its own part number. ``as_completed`` sends them
through a ``Runner`` (each with its own retries, hedging, stall detection and the call's
deadline) with at most ``window`` in flight, and sends the next one as soon as *any*
request in flight has finished, not only the oldest: one slow answer then costs one
slot, while the others keep serving the rest of the batch. Results come back in the
order they finish, with the key their caller gave them.

The calls are taken from the caller's iterator only when a slot is free, so a caller
that produces each request's body lazily (a multipart upload copying a part out of the
staged buffers) holds at most ``window`` bodies. On the first error (a request out of
attempts, the deadline, the caller's iterator, an interrupt, or the caller abandoning
the results), the requests still in flight are cancelled and awaited (each for up to
``CLEANUP_SECONDS``) before the error propagates, so none is still running once the
caller handles it.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TypeVar

from .runner import CLEANUP_SECONDS, Pending, Request, Runner

K = TypeVar("K")
T = TypeVar("T")

Call = tuple[K, Request, Callable[[], Awaitable[T]]]


def as_completed(runner: Runner, calls: Iterable[Call[K, T]], window: int) -> Iterator[tuple[K, T]]:
    """Runs ``calls`` (``(key, request, make)``) through ``runner``, at most ``window`` at
    once, and yields ``(key, result)`` for each as it finishes. Close the iterator (or
    iterate it to the end) before relying on no request running: use it in a ``with
    contextlib.closing(...)`` block when the loop body may raise.

    Raises:
        StorageRequestError, CheckpointTimeoutError, OSError: the first request that
            failed for good (the others are cancelled and awaited first).
    """
    window = max(1, window)
    inflight: dict[concurrent.futures.Future[T], tuple[K, Pending[T]]] = {}
    try:
        for key, request, make in calls:
            while len(inflight) >= window:
                yield from _finished(inflight)
            pending = runner.submit(request, make)
            inflight[pending.future] = (key, pending)
        while inflight:
            yield from _finished(inflight)
    finally:
        for _, pending in inflight.values():
            pending.abandon()
        for _, pending in inflight.values():
            pending.wait_stopped(CLEANUP_SECONDS)


def _finished(inflight: dict[concurrent.futures.Future[T], tuple[K, Pending[T]]]) -> Iterator[tuple[K, T]]:
    """Waits until a request in ``inflight`` has finished; yields the result of each that
    has (taking it out), or raises the error of a failed one."""
    done, _ = concurrent.futures.wait(inflight, return_when=concurrent.futures.FIRST_COMPLETED)
    for future in done:
        key, pending = inflight.pop(future)
        yield key, pending.result()


__all__ = ["Call", "as_completed"]
