"""One request to an object store, carried through throttling, resets, stalls and deadlines.

``Runner.call(request, make)`` runs ``make()`` (a coroutine of the fsspec filesystem:
one HTTP request, or a few for an fsspec call) on fsspec's event loop and

* retries it when it fails transiently (``storage.retry``: throttled, server error,
  connection lost, cut short, timed out), after a jittered backoff that honours
  ``Retry-After``, up to the policy's attempts (the per-request budget); then raises
  ``StorageRequestError`` naming the rank, the file and the request;
* keeps at most ``SHARDSAFE_STORE_REQUESTS`` requests of this process in flight (a slot
  is held during an attempt, not during its backoff), so that a rank's uploads reach
  the store at a bounded rate and throttled ranks back off independently;
* sweeps the stall watch (``storage.stall``) while it waits, cutting connections whose
  uploads stopped;
* abandons the attempt (cancels it, which closes its connection) when the call's
  ``Deadline`` passes, and raises its ``CheckpointTimeoutError``;
* abandons and retries an attempt that reports its progress (``progress()``: an S3
  ranged GET notes every chunk it receives, a HEAD its answer) when it has made none for
  the stall limit learned from this process's recent requests (``storage.tail``), or when
  it moves bytes far slower than the requests beside it (``TailPolicy.crawling``), or
  it has run for the time sized to its bytes (``TailPolicy.attempt_limit``), and cuts
  stalled uploads at the stall limit too;
* hedges an idempotent request (``Request.idempotent``: ranged GETs, HEADs, and the part
  uploads of a multipart upload, which send the same bytes under the same part number):
  when its attempt has received nothing for the silence limit the tail policy learned (a
  likely stall), or it has not finished after the delay learned for its size (uploads
  and reads learned apart), one duplicate is sent (within the hedge budget,
  ``TailPolicy.hedge_now``) and the first answer wins; the other is cancelled (a part
  whose duplicate also lands holds the same bytes, and the completion names the winner's).
  A request the caller waits for alone (``run``, or one its batch marked ``Pending.drain``:
  nothing else is left to send) is hedged sooner.

The caller's thread waits for the result (``run``) or holds a future (``submit``); the
coroutines run on the loop fsspec already runs for its asynchronous filesystems, so
backends still own no threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..errors import CheckpointError, StorageRequestError
from .deadline import Deadline
from .retry import RetryPolicy, classify, refused
from .stall import StallWatch
from .tail import HedgeBudget, LatencyTracker, Progress, TailPolicy

log = logging.getLogger("shardsafe")

T = TypeVar("T")

CLEANUP_SECONDS = 5.0  # how long the abort of a failed upload may take after the failure


@dataclass(frozen=True, slots=True)
class Request:
    """What a request does, for logs and errors: ``PUT part 3/8 of bucket/ckpt/data-...``."""

    verb: str
    path: str
    detail: str = ""
    size: int | None = None
    """Bytes the request moves (its latency is learned by size class); None: not learned."""
    idempotent: bool = False
    """Whether sending it twice is harmless (a read, a part upload): only such requests are hedged."""

    @property
    def uploads(self) -> bool:
        """Whether it sends its bytes (its durations are learned apart from reads')."""
        return self.verb == "PUT"

    def __str__(self) -> str:
        return f"{self.verb} {self.detail}" if self.detail else self.verb


class Runner:
    """Runs requests with retries, stall detection and a deadline (see the module doc).

    Args:
        loop: The event loop of the filesystem's coroutines (fsspec's I/O loop).
        policy: Attempts, backoff and stall timeout.
        deadline: The call's deadline, if any.
        watch: The stall watch of the filesystem's connections, if it has one.
        slots: Requests in flight at most, across every Runner on this loop.
        endpoint: Where the requests go (for error messages), if known.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, policy: RetryPolicy,
                 deadline: Deadline | None = None, watch: StallWatch | None = None,
                 slots: int = 16, endpoint: str | None = None, tail: TailPolicy | None = None) -> None:
        self.loop = loop
        self.policy = policy
        self.deadline = deadline
        self.watch = watch
        self.slots = slots
        self.endpoint = endpoint
        self.rank = deadline.rank if deadline is not None else None
        self._answered = False  # a request of this runner has succeeded: the endpoint is right
        self.tail = _tail_state(loop, tail or TailPolicy(hedge=False, stall_floor=min(2.0, policy.stall_timeout),
                                                        stall_cap=policy.stall_timeout))

    def for_cleanup(self) -> Runner:
        """A runner for undoing a failed write (aborting its upload): a few attempts within
        a short deadline of its own, so that cleaning up never holds the error back long."""
        return Runner(self.loop, RetryPolicy(attempts=3, stall_timeout=self.policy.stall_timeout,
                                             base_delay=0.1, max_delay=1.0, max_retry_after=1.0),
                      Deadline(CLEANUP_SECONDS, rank=self.rank or 0, what="clean-up"),
                      self.watch, self.slots, self.endpoint, self.tail.policy)

    # ------------------------------------------------------------------ caller's thread
    def run(self, request: Request, make: Callable[[], Awaitable[T]]) -> T:
        """``call`` from the caller's thread, which waits for this request alone (it is
        draining, see ``Pending.drain``); returns its result or raises its error."""
        return self.submit(request, make, draining=True).result()

    def submit(self, request: Request, make: Callable[[], Awaitable[T]], draining: bool = False) -> Pending[T]:
        """Starts ``call`` on the loop and returns at once (``Pending.result`` waits);
        ``draining``: see ``Pending.drain``."""
        pending: Pending[T] = Pending()
        pending.draining = draining

        async def tracked() -> T:
            pending.started.set()
            try:
                if request.idempotent and self.tail.policy.hedge:
                    return await self._hedged(request, make, pending)
                return await self.call(request, make)
            finally:
                pending.settled.set()

        pending.future = asyncio.run_coroutine_threadsafe(tracked(), self.loop)
        return pending

    # ------------------------------------------------------------------ on the loop
    async def call(self, request: Request, make: Callable[[], Awaitable[T]],
                   current: list[Progress | None] | None = None) -> T:
        """Runs ``make()`` until it succeeds, fails for good, runs out of attempts or the
        deadline passes. ``current[0]``, if given, is the running attempt's progress (None
        between attempts)."""
        failures: list[str] = []
        for attempt in range(self.policy.attempts):
            try:
                result = await self._attempt(request, make, failures, current)
                self._answered = True
                return result
            except CheckpointError:  # the deadline passed: no retry
                raise
            except Exception as e:  # noqa: BLE001 - classified: transient ones are retried
                transient = classify(e)
                if transient is None:
                    raise
                failures.append(transient.kind)
                if not self._answered and refused(e):  # nothing listens there: retrying cannot help
                    raise self._refused(request, e) from e
                if attempt + 1 == self.policy.attempts:
                    raise self._exhausted(request, failures, e) from e
                delay = self.policy.delay(attempt, transient.retry_after)
                if self.deadline is not None and self.deadline.remaining() < delay:
                    raise self.deadline.error(str(request), request.path, failures, retry_in=delay) from e
                log.info("%s of %s: %s (%r); retrying in %.2f s (attempt %d of %d)", request,
                         request.path, transient.kind, e, delay, attempt + 2, self.policy.attempts)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _hedged(self, request: Request, make: Callable[[], Awaitable[T]], pending: Pending[T]) -> T:
        """``call``, and one duplicate of it once the tail policy says so (``hedge_now``:
        the first's attempt silent, or the request slow, sooner once ``pending`` is
        draining; asked again while it waits, as answers teach the tracker); the first
        answer wins. When both fail, the first one's error is raised."""
        tail, size = self.tail, request.size or 0
        tracker = tail.durations(request)
        tail.budget.started()
        start = time.monotonic()
        current: list[Progress | None] = [None]
        first = asyncio.ensure_future(self.call(request, make, current))
        racers, errors = {first}, {}
        hedged = False
        try:
            while racers:
                wait_s = None if hedged else _until_due(tail.policy, tracker, size, start, current[0],
                                                        pending.draining)
                done, racers = await asyncio.wait(racers, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task.exception() is None:
                        return task.result()
                    errors[task] = task.exception()
                if first in errors and not hedged:
                    break
                now = time.monotonic()
                attempt = current[0]
                if not hedged and racers and tail.policy.hedge_now(
                        tracker, tail.budget, size, now - start, attempt.silence(now) if attempt else None,
                        pending.draining):
                    hedged = True
                    log.debug("%s of %s: no answer after %.2f s; sent a duplicate", request, request.path,
                              now - start)
                    racers.add(asyncio.ensure_future(self.call(request, make)))
            raise errors.get(first) or next(iter(errors.values()))
        finally:
            for task in (first, *racers):
                if not task.done():
                    task.cancel()  # the loser: its connection is closed
            await asyncio.wait({first, *racers})

    async def _attempt(self, request: Request, make: Callable[[], Awaitable[T]], failures: list[str],
                       current: list[Progress | None] | None = None) -> T:
        """One attempt, holding a slot; sweeps stalled connections while it waits, abandons
        it when it reports no progress for the stall limit, and at the deadline."""
        progress = Progress(time.monotonic())
        if current is not None:
            current[0] = progress
        task = asyncio.ensure_future(self._in_slot(make, progress, request.verb == "HEAD"))
        tick = min(_TICK, self.policy.stall_timeout / 4)
        cut_before = self.watch.cut if self.watch is not None else 0
        tail = self.tail
        durations, size = tail.durations(request), request.size or 0
        finished_before = durations.finished(size)
        # sized to its bytes; a request of unknown size (a listing, a completion) has none
        longest = tail.policy.attempt_limit(size) if request.size else float("inf")
        try:
            while True:
                wait_s = tick if self.deadline is None else max(0.0, min(tick, self.deadline.remaining()))
                done, _ = await asyncio.wait({task}, timeout=wait_s)
                limit = tail.policy.stall_limit(tail.tracker)
                if done:
                    try:
                        result = task.result()
                    except Exception as e:
                        if self.watch is not None and self.watch.cut > cut_before and classify(e) is not None:
                            raise StalledRequestError(f"no progress for {limit:g} s") from e
                        raise
                    if request.size is not None or progress.reporting:
                        tail.durations(request).record(request.size or 0, time.monotonic() - progress.started,
                                                       progress.longest_gap if progress.reporting else None)
                    return result
                now = time.monotonic()
                if progress.stalled(now, limit):
                    raise StalledRequestError(f"no progress for {limit:g} s")
                if tail.policy.crawling(durations, size, now - progress.started, progress.bytes,
                                        durations.finished(size) - finished_before):
                    raise StalledRequestError(f"{progress.bytes} of {size} bytes in {now - progress.started:.1f} s, "
                                              "far slower than the requests beside it")
                if now - progress.started >= longest:
                    raise StalledRequestError(f"not done after {longest:.0f} s, the most an attempt of "
                                              f"{size} bytes may take")
                if self.watch is not None:
                    self.watch.sweep(limit)
                if self.deadline is not None and self.deadline.passed():
                    raise self.deadline.error(str(request), request.path, failures)
        finally:
            if current is not None:
                current[0] = None
            if not task.done():
                task.cancel()  # abandon the attempt: aiohttp closes its connection
                await asyncio.wait({task})
            if task.done() and not task.cancelled():
                task.exception()  # retrieved, so asyncio does not log it as never seen

    async def _in_slot(self, make: Callable[[], Awaitable[T]], progress: Progress, answer_is_progress: bool) -> T:
        async with _slots(self.loop, self.slots):
            progress.started = progress.last = time.monotonic()  # the wait for a slot is no stall
            _PROGRESS.set(progress)  # this attempt's task only
            if answer_is_progress:
                progress.note(progress.started, 0)
            result = await make()
            if answer_is_progress:
                progress.note(time.monotonic(), 1)
            return result

    def _exhausted(self, request: Request, failures: list[str], last: BaseException) -> StorageRequestError:
        who = f"rank {self.rank}: " if self.rank is not None else ""
        return StorageRequestError(f"{who}{request} of {request.path} failed {len(failures)} times "
                                   f"({', '.join(failures)}); the last error: {_describe(last)}"
                                   f"{self._where()}", rank=self.rank, file=request.path, request=str(request))

    def _refused(self, request: Request, e: BaseException) -> StorageRequestError:
        who = f"rank {self.rank}: " if self.rank is not None else ""
        return StorageRequestError(
            f"{who}{request} of {request.path} failed: the connection was refused ({_describe(e)})"
            f"{self._where()}; not retried, since it was the first request of the call: is the "
            f"endpoint_url right and the server running?", rank=self.rank, file=request.path,
            request=str(request))

    def _where(self) -> str:
        return f" (endpoint {self.endpoint})" if self.endpoint else ""


def _describe(e: BaseException) -> str:
    """``Type: message`` of an error, on one line."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class StalledRequestError(ConnectionError):
    """An attempt whose connection the stall watch cut (``retry.classify``: "stalled")."""


class Pending(Generic[T]):
    """A request started by ``Runner.submit``: its future, and whether it has begun and
    ended on the loop (so that a failed upload is aborted only once its parts stopped)."""

    def __init__(self) -> None:
        self.future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.started = threading.Event()
        self.settled = threading.Event()
        self.draining = False

    def drain(self) -> None:
        """Says that the caller now waits for this request with nothing else left to send
        (the last requests of a batch, with slots idle): it is hedged sooner
        (``TailPolicy.hedge_delay``). Looked at within a tick."""
        self.draining = True

    def result(self) -> T:
        """Waits for the outcome; an interrupted wait (KeyboardInterrupt) abandons it."""
        try:
            return self.future.result()
        except BaseException:
            self.future.cancel()
            raise

    def abandon(self) -> None:
        """Cancels the request (if still running)."""
        self.future.cancel()

    def wait_stopped(self, timeout: float) -> None:
        """Waits (at most ``timeout``) until a request that began has ended."""
        if self.started.is_set():
            self.settled.wait(timeout)


_TICK = 0.25  # seconds between looks at a waiting request (stalls, hedging, deadline)


def _until_due(policy: TailPolicy, tracker: LatencyTracker, size: int, start: float,
               attempt: Progress | None, draining: bool) -> float | None:
    """Seconds until a request started at ``start`` becomes slow or its attempt silent,
    at most ``_TICK`` (the limits move as answers come in, and a request may become
    draining; once one has passed and the budget said no, the next look is a tick
    later). None: hedging is off."""
    delay, silence = policy.hedge_delay(tracker, size, draining), policy.silence_limit(tracker)
    if delay is None or silence is None:
        return None
    now = time.monotonic()
    due = [start + delay]
    if attempt is not None and attempt.reporting:
        due.append(attempt.last + silence)
    ahead = [d - now for d in due if d > now]
    return min(_TICK, *ahead) if ahead else _TICK
_PROGRESS: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("shardsafe_progress", default=None)


def progress() -> Progress | None:
    """The progress record of the attempt whose coroutine calls this (None outside one):
    a request that can tell when bytes arrive notes them here (``Progress.note``)."""
    return _PROGRESS.get()


@dataclass(slots=True)
class TailState:
    """This process's learned latencies and hedge budget for one event loop's requests.

    Attributes:
        policy: When to hedge, when a request is stalled.
        tracker: Reads' durations and longest gaps without progress (the stall limit).
        uploads: Uploads' durations (an upload of a size takes longer than a read of it).
        budget: The duplicates sent, against the requests made.
    """

    policy: TailPolicy
    tracker: LatencyTracker
    uploads: LatencyTracker
    budget: HedgeBudget

    def durations(self, request: Request) -> LatencyTracker:
        """The tracker that learns ``request``'s duration and sets its hedge delay."""
        return self.uploads if request.uploads else self.tracker


_TAILS: dict[tuple[int, TailPolicy], TailState] = {}


def _tail_state(loop: asyncio.AbstractEventLoop, policy: TailPolicy) -> TailState:
    key = (id(loop), policy)
    state = _TAILS.get(key)
    if state is None:
        state = _TAILS[key] = TailState(policy, LatencyTracker(), LatencyTracker(),
                                        HedgeBudget(policy.hedge_budget, policy.hedge_burst))
    return state


_SEMAPHORES: dict[tuple[int, int], asyncio.Semaphore] = {}


def _slots(loop: asyncio.AbstractEventLoop, n: int) -> asyncio.Semaphore:
    """The semaphore bounding this process's requests on ``loop`` (created on the loop)."""
    key = (id(loop), n)
    sem = _SEMAPHORES.get(key)
    if sem is None:
        sem = _SEMAPHORES[key] = asyncio.Semaphore(n)
    return sem


__all__ = ["CLEANUP_SECONDS", "Pending", "Request", "Runner", "StalledRequestError", "TailState", "progress"]
