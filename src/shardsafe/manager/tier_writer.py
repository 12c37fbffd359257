"""One writer per tier: the background worker, the error carried to the next call.

Both tiers of a manager, the persistent directory and the local tier, save through a
``TierWriter``. The engine stages a step once for every due tier and gives each tier a
handle of its own (``engine.save.handle.SaveHandle``); ``TierWriter.start(step, job)`` then

1. waits, on the tier's worker thread, for the handle (the tier's commit);
2. runs the tier's ``after_save(step, error, seq)``: retention by the tier's policy
   (``retention.steps_to_delete`` for both tiers, applied by ``steps.StepDirectory.drop``)
   and what the tier does after a save (the local tier's peer copy, which also runs
   after a failed save so that peers stay paired);
3. keeps the first error of 1 or 2 (a ``CheckpointError`` naming the tier, step and
   path) until ``wait`` raises it, once. An error nobody collected is logged when the
   manager is garbage-collected (``report_uncollected``).

Without ``background`` the same steps run on the caller's thread before ``start``
returns. One save per tier is in flight; the manager waits for it (``wait``) before
starting the next one, and decides when to raise what it waited for.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from ..errors import CheckpointError, CheckpointTimeoutError
from .lock import DirectoryLock

log = logging.getLogger("shardsafe")


class SaveJob(Protocol):
    """A started save of one tier (the part of ``SaveHandle`` a writer relies on)."""

    def result(self, timeout: float | None = None) -> None:
        """Blocks until committed and durable; re-raises the save's error."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes this process wrote."""
        ...

    @property
    def timings(self) -> dict[str, float]:
        """Seconds from the start to ``"staged"`` (async) and ``"durable"``."""
        ...


class TierHooks(Protocol):
    """What a tier tells its writer."""

    def describe(self, step: int) -> str:
        """The save of ``step``, for error messages (``"saving step 3 to 'ckpt/step_...'"``)."""
        ...

    def after_save(self, step: int, error: CheckpointError | None, seq: int, job: SaveJob | None) -> None:
        """After the save of ``step`` committed (or failed with ``error``): retention and
        the rest of the tier's work. ``seq`` numbers the manager's saves (the same on every
        rank); ``job`` is the save (its bytes and timings), None when it never started.
        Raises ``CheckpointError`` naming what failed."""
        ...


class _Slot:
    """The save in flight (shared with the garbage-collection reporter, which must not
    hold the manager)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.future: Future | None = None
        self.step: int | None = None


class TierWriter:
    """Runs a tier's saves to their end, one at a time, and carries their errors.

    Args:
        tier: The tier (its messages and its work after a save).
        name: ``"persistent"`` or ``"local"`` (thread and log names).
        background: Finish saves on a worker thread (else on the caller's).
    """

    def __init__(self, tier: TierHooks, name: str, *, background: bool) -> None:
        self.tier = tier
        self.slot = _Slot(name)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"shardsafe-{name}") if background else None

    @property
    def step(self) -> int | None:
        """The step whose save is in flight and not known to have failed (else None)."""
        fut, step = self.slot.future, self.slot.step
        if step is not None and fut is not None and (not fut.done() or fut.exception() is None):
            return step
        return None

    def start(self, step: int, job: SaveJob | BaseException, seq: int) -> None:
        """Finishes the save ``job`` of ``step`` (in the background, or now); ``job`` may be
        the error that kept it from starting (the tier's work after a save still runs).

        Raises:
            CheckpointError: without ``background``, the save or its follow-up failed.
        """
        if self._pool is None:
            self._finish(step, job, seq)
            return
        self.slot.step = step
        self.slot.future = self._pool.submit(self._finish, step, job, seq)

    def _finish(self, step: int, job: SaveJob | BaseException, seq: int) -> None:
        error: CheckpointError | None = None
        try:
            if isinstance(job, BaseException):
                raise job
            job.result()
        except Exception as e:  # noqa: BLE001 - any reason the save failed (or never started)
            if not isinstance(e, (OSError, CheckpointError)) and not isinstance(job, BaseException):
                raise
            kind = CheckpointTimeoutError if isinstance(e, CheckpointTimeoutError) else CheckpointError
            error = kind(f"{self.tier.describe(step)} failed: {e}")
            error.__cause__ = e
        try:
            try:
                self.tier.after_save(step, error, seq, None if isinstance(job, BaseException) else job)
            except (OSError, ValueError) as e:
                raise CheckpointError(f"{self.tier.describe(step)}: {e}") from e
        except CheckpointError as e:
            if error is None:
                raise
            log.warning("%s", e)
        if error is not None:
            raise error

    def wait(self) -> None:
        """Blocks until the save in flight is finished; raises its error (once).

        Raises:
            CheckpointError: That save (or its retention, or its peer copy) failed.
        """
        fut = self.slot.future
        if fut is None:
            return
        try:
            fut.result()
        finally:
            self.slot.future = None
            self.slot.step = None

    def take_error(self) -> CheckpointError | None:
        """``wait``, returning the error instead of raising it."""
        try:
            self.wait()
        except CheckpointError as e:
            return e
        return None

    def close(self) -> None:
        """Stops the worker (after ``wait``: nothing is in flight)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def report_uncollected(slots: Sequence[_Slot], lock: DirectoryLock | None) -> None:
    """At garbage collection of a manager nobody closed: logs failures nobody collected."""
    for slot in slots:
        fut = slot.future
        if fut is not None and fut.done() and fut.exception() is not None:
            log.error("%s checkpoint save of step %s failed and nobody called wait_until_finished() "
                      "or close(): %s", slot.name, slot.step, fut.exception())
    if lock is not None:
        lock.release_quietly()


__all__ = ["SaveJob", "TierHooks", "TierWriter", "report_uncollected"]
