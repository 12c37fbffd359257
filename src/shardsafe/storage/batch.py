"""A batch of requests with a bounded number in flight, each slot reused as soon as it frees.

The parts of one ranged read or one multipart upload are independent: each lands in its
own range of the destination, or under its own part number. ``as_completed`` sends them
through a ``Runner`` (each with its own retries, hedging, stall detection and the call's
deadline) with at most ``window`` in flight, and sends the next one as soon as *any*
request in flight has finished, not only the oldest: one slow answer then costs one
slot, while the others keep serving the rest of the batch. Results come back in the
order they finish, with the key their caller gave them. Once nothing is left to send and
a slot is idle, the requests still in flight are what the caller waits for: they are
marked draining (``Pending.drain``), which hedges them sooner.

A batch ends with its slowest last answers, so ``split`` cuts a read that takes more than
one round of the window into parts that shrink towards its end (the *factoring* rule of
loop scheduling): full parts while plenty remain, then each part ``1 / (2 x window)`` of
what is left, down to ``SMALLEST_PART``. The last answers are then small ones, and one
slow answer among them holds the batch up for a fraction of what a full part would. A
read of one round (``window`` full parts or fewer) keeps its full parts: they are all in
flight at once, and smaller ones would mean more requests for every read of a few
hundred MiB.

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

MiB = 1 << 20
SMALLEST_PART = 8 * MiB
"""The smallest part ``split`` cuts a long read into (a ranged GET of 8 MiB still moves
bytes for longer than it waits for its first one)."""


def split(start: int, end: int, part: int, window: int, smallest: int = SMALLEST_PART) -> list[tuple[int, int]]:
    """The ranges ``[s, e)`` in which a read of ``[start, end)`` is asked for, with
    ``window`` in flight: parts of ``part`` bytes (all of them if the read is at most
    ``window`` parts) while more than ``2 x window`` of them remain, then ``1 / (2 x
    window)`` of what remains, in whole MiB, at least ``smallest`` (or ``part`` if that is
    smaller); a remainder under half of ``smallest`` joins the part before it when that
    part stays within ``part`` bytes."""
    one_round = end - start <= window * part
    smallest = min(smallest, part)
    out = []
    s = start
    while s < end:
        left = end - s
        size = part if one_round else min(part, max(smallest, left // (2 * window) // MiB * MiB))
        if left - size < smallest // 2 and left <= part:
            size = left
        out.append((s, s + size))
        s += size
    return out


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
            if len(inflight) < window:  # nothing left to send and a slot idle
                for _, pending in inflight.values():
                    pending.drain()
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


__all__ = ["SMALLEST_PART", "Call", "as_completed", "split"]
