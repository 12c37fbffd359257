"""One writer per tier: the tier's work after a save, the error carried to the next call.

Both tiers of a manager, the persistent directory and the local tier, save through a
``TierWriter``. The engine stages a step once for every due tier and gives each tier a
handle of its own (``engine.save.handle.SaveHandle``); ``TierWriter.start(step, job)`` then
runs, as a background job of the engine (``engine.save.background``: the machinery an
async save's writer thread runs on too, so its outcome reaches the caller the same way
and the exit hook finishes it and logs a failure nobody collected):

1. waits for the handle (the tier's commit);
2. runs the tier's ``after_save(step, error, seq)``: retention by the tier's policy
   (``retention.steps_to_delete`` for both tiers, applied by ``steps.StepDirectory.drop``)
   and what the tier does after a save (the local tier's peer copy, which also runs
   after a failed save so that peers stay paired);
3. keeps the first error of 1 or 2 (a ``CheckpointError`` naming the tier, step and
   path) until ``wait`` raises it, once. An error nobody collected is logged when the
   manager is garbage-collected (``report_uncollected``), else at exit.

It is a job of its own, not a stage at the end of the save's run: the local tier's peer
copy must run while the persistent save still uploads (a step due on both tiers is one
run, which ends with the persistent commit), and a tier's work runs also when its save
never started.

Without ``background`` the same steps run on the caller's thread before ``start``
returns. One save per tier is in flight; the manager waits for it (``wait``) before
starting the next one, and decides when to raise what it waited for.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from ..engine.save import background
from ..engine.save.handle import SaveProgress
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
    hold the manager): the progress of the tier's job."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.job: SaveProgress | None = None
        self.step: int | None = None


class TierWriter:
    """Runs a tier's saves to their end, one at a time, and carries their errors.

    Args:
        tier: The tier (its messages and its work after a save).
        name: ``"persistent"`` or ``"local"`` (thread and log names).
        background: Finish saves as background jobs (else on the caller's thread).
    """

    def __init__(self, tier: TierHooks, name: str, *, background: bool) -> None:
        self.tier = tier
        self.slot = _Slot(name)
        self.background = background

    @property
    def step(self) -> int | None:
        """The step whose save is in flight and not known to have failed (else None)."""
        job, step = self.slot.job, self.slot.step
        if step is not None and job is not None and (not job.settled.is_set() or job.error is None):
            return step
        return None

    def start(self, step: int, job: SaveJob | BaseException, seq: int) -> None:
        """Finishes the save ``job`` of ``step`` (in the background, or now); ``job`` may be
        the error that kept it from starting (the tier's work after a save still runs).

        Raises:
            CheckpointError: without ``background``, the save or its follow-up failed.
        """
        if not self.background:
            self._finish(step, job, seq)
            return
        what = self.tier.describe(step)
        progress = SaveProgress(what, label=f"the {self.slot.name} tier's work after {what}")
        self.slot.step, self.slot.job = step, progress
        background.start(self.slot.name, lambda: self._finish(step, job, seq), progress)

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
        job = self.slot.job
        if job is None:
            return
        try:
            job.handle.result()
        finally:
            self.slot.job = None
            self.slot.step = None

    def take_error(self) -> CheckpointError | None:
        """``wait``, returning the error instead of raising it."""
        try:
            self.wait()
        except CheckpointError as e:
            return e
        return None


def report_uncollected(slots: Sequence[_Slot], lock: DirectoryLock | None) -> None:
    """At garbage collection of a manager nobody closed: logs failures nobody collected."""
    for slot in slots:
        job = slot.job
        err = job.take_failure() if job is not None and job.settled.is_set() else None
        if err is not None:  # now seen: the exit hook does not log it again
            log.error("%s checkpoint save of step %s failed and nobody called wait_until_finished() "
                      "or close(): %s", slot.name, slot.step, err)
    if lock is not None:
        lock.release_quietly()


__all__ = ["SaveJob", "TierHooks", "TierWriter", "report_uncollected"]
