"""The demo job's checkpointing: a per-step hook around ``shardsafe.CheckpointManager``.

The training loop (``train.DemoTrainer``) calls the hook after every step. The hook asks
the manager to save (the manager decides whether the step is due: the schedule, or a
preemption signal that arrived), times how long ``save`` held the loop up, and stops
the loop once the manager says a preemption has been answered by a checkpoint.

Time to durable: with ``async_save`` the write and the commit finish on the manager's
background thread, which logs ``"committed step %d in %s: %s"`` on the ``shardsafe``
logger at the moment a step is committed. ``CommitClock`` is a logging handler that
notes those moments, so the demo measures time to durable without waiting for it
(waiting would block the loop and defeat the point of saving asynchronously).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import shardsafe

Emit = Callable[..., None]
"""Reports one event: ``emit("save", step=25, stall_s=0.001)``."""

_COMMITTED = "committed step %d in %s: %s"  # manager.persistent_tier's log record of a finished commit


class CommitClock(logging.Handler):
    """Notes the wall-clock time at which the manager committed each step.

    Install with ``CommitClock.install()``; it raises the ``shardsafe`` logger to INFO
    (the records it needs) without printing anything.
    """

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self._lock_times = threading.Lock()
        self._times: dict[int, float] = {}

    @classmethod
    def install(cls) -> CommitClock:
        """A clock attached to the ``shardsafe`` logger."""
        clock = cls()
        logger = logging.getLogger("shardsafe")
        logger.addHandler(clock)
        if not logger.isEnabledFor(logging.INFO):
            logger.setLevel(logging.INFO)
        return clock

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == _COMMITTED and isinstance(record.args, tuple) and record.args:
            with self._lock_times:
                self._times[int(record.args[0])] = record.created

    def take(self) -> dict[int, float]:
        """Commit times (``time.time()``) noted since the last call, by step."""
        with self._lock_times:
            out, self._times = self._times, {}
        return out


class CheckpointHook:
    """The step hook of a training process that checkpoints through ``mgr``.

    Args:
        mgr: A writable manager (created with ``preemption_signals`` to honour SIGTERM).
        emit: Where events go (the worker prints them as JSON lines).
        clock: Commit times of the steps (time to durable); None does not report them.
    """

    def __init__(self, mgr: shardsafe.CheckpointManager, emit: Emit,
                 clock: CommitClock | None = None) -> None:
        self.mgr = mgr
        self.emit = emit
        self.clock = clock
        self.preempted_at: int | None = None
        self.last_saved: int | None = None
        self._started: dict[int, float] = {}  # step -> time.time() when save() was called

    def __call__(self, step: int, state: Mapping[str, Any]) -> bool:
        """Saves ``step`` if due; returns True (stop training) once a preemption is answered."""
        self.emit("step", step=step)
        self._save(step, state, force=False)
        self.report_durable()
        if self.mgr.reached_preemption(step):
            self.preempted_at = step
            return True
        return False

    def _save(self, step: int, state: Mapping[str, Any], *, force: bool) -> None:
        started = time.time()
        t0 = time.perf_counter()
        saved = self.mgr.save(step, state, force=force)
        stall = time.perf_counter() - t0
        if not saved:
            return
        self._started[step] = started
        self.last_saved = step
        reason = ("preemption" if self.mgr.reached_preemption(step) else
                  "final" if force else "schedule")
        self.emit("save", step=step, stall_s=stall, reason=reason)

    def finish(self, step: int, state: Mapping[str, Any]) -> None:
        """After the last step: saves it (if the schedule did not) and waits until durable."""
        if self.last_saved != step:
            self._save(step, state, force=True)
        self.wait()

    def wait(self) -> float:
        """Waits for the save in flight to be committed; returns the seconds waited."""
        t0 = time.perf_counter()
        self.mgr.wait_until_finished()
        waited = time.perf_counter() - t0
        self.report_durable()
        return waited

    def report_durable(self) -> None:
        """Emits a ``durable`` event for every step committed since the last call."""
        if self.clock is None:
            return
        for step, when in sorted(self.clock.take().items()):
            started = self._started.pop(step, None)
            if started is not None:
                self.emit("durable", step=step, after_s=max(0.0, when - started))
