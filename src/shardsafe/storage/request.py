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
  ``Deadline`` passes, and raises its ``CheckpointTimeoutError``.

The caller's thread waits for the result (``run``) or holds a future (``submit``); the
coroutines run on the loop fsspec already runs for its asynchronous filesystems, so
backends still own no threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..errors import CheckpointError, StorageRequestError
from .deadline import Deadline
from .retry import RetryPolicy, classify, refused
from .stall import StallWatch

log = logging.getLogger("shardsafe")

T = TypeVar("T")

CLEANUP_SECONDS = 5.0  # how long the abort of a failed upload may take after the failure


@dataclass(frozen=True, slots=True)
class Request:
    """What a request does, for logs and errors: ``PUT part 3/8 of bucket/ckpt/data-...``."""

    verb: str
    path: str
    detail: str = ""

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
                 slots: int = 16, endpoint: str | None = None) -> None:
        self.loop = loop
        self.policy = policy
        self.deadline = deadline
        self.watch = watch
        self.slots = slots
        self.endpoint = endpoint
        self.rank = deadline.rank if deadline is not None else None
        self._answered = False  # a request of this runner has succeeded: the endpoint is right

    def for_cleanup(self) -> Runner:
        """A runner for undoing a failed write (aborting its upload): a few attempts within
        a short deadline of its own, so that cleaning up never holds the error back long."""
        return Runner(self.loop, RetryPolicy(attempts=3, stall_timeout=self.policy.stall_timeout,
                                             base_delay=0.1, max_delay=1.0, max_retry_after=1.0),
                      Deadline(CLEANUP_SECONDS, rank=self.rank or 0, what="clean-up"),
                      self.watch, self.slots, self.endpoint)

    # ------------------------------------------------------------------ caller's thread
    def run(self, request: Request, make: Callable[[], Awaitable[T]]) -> T:
        """``call`` from the caller's thread; returns its result or raises its error."""
        return self.submit(request, make).result()

    def submit(self, request: Request, make: Callable[[], Awaitable[T]]) -> Pending[T]:
        """Starts ``call`` on the loop and returns at once (``Pending.result`` waits)."""
        pending: Pending[T] = Pending()

        async def tracked() -> T:
            pending.started.set()
            try:
                return await self.call(request, make)
            finally:
                pending.settled.set()

        pending.future = asyncio.run_coroutine_threadsafe(tracked(), self.loop)
        return pending

    # ------------------------------------------------------------------ on the loop
    async def call(self, request: Request, make: Callable[[], Awaitable[T]]) -> T:
        """Runs ``make()`` until it succeeds, fails for good, runs out of attempts or the
        deadline passes."""
        failures: list[str] = []
        for attempt in range(self.policy.attempts):
            try:
                result = await self._attempt(request, make, failures)
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

    async def _attempt(self, request: Request, make: Callable[[], Awaitable[T]], failures: list[str]) -> T:
        """One attempt, holding a slot; sweeps stalled connections while it waits and
        abandons it at the deadline."""
        task = asyncio.ensure_future(self._in_slot(make))
        tick = min(1.0, self.policy.stall_timeout / 4)
        cut_before = self.watch.cut if self.watch is not None else 0
        try:
            while True:
                wait_s = tick if self.deadline is None else max(0.0, min(tick, self.deadline.remaining()))
                done, _ = await asyncio.wait({task}, timeout=wait_s)
                if done:
                    try:
                        return task.result()
                    except Exception as e:
                        if self.watch is not None and self.watch.cut > cut_before and classify(e) is not None:
                            raise StalledRequestError(f"no progress for {self.policy.stall_timeout:g} s") from e
                        raise
                if self.watch is not None:
                    self.watch.sweep()
                if self.deadline is not None and self.deadline.passed():
                    raise self.deadline.error(str(request), request.path, failures)
        finally:
            if not task.done():
                task.cancel()  # abandon the attempt: aiohttp closes its connection
                await asyncio.wait({task})
            if task.done() and not task.cancelled():
                task.exception()  # retrieved, so asyncio does not log it as never seen

    async def _in_slot(self, make: Callable[[], Awaitable[T]]) -> T:
        async with _slots(self.loop, self.slots):
            return await make()

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


_SEMAPHORES: dict[tuple[int, int], asyncio.Semaphore] = {}


def _slots(loop: asyncio.AbstractEventLoop, n: int) -> asyncio.Semaphore:
    """The semaphore bounding this process's requests on ``loop`` (created on the loop)."""
    key = (id(loop), n)
    sem = _SEMAPHORES.get(key)
    if sem is None:
        sem = _SEMAPHORES[key] = asyncio.Semaphore(n)
    return sem


__all__ = ["CLEANUP_SECONDS", "Pending", "Request", "Runner", "StalledRequestError"]
