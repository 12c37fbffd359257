"""When the persistent tier saves: the save policy, preemption and the automatic interval.

``SaveSchedule`` fills the ``save_policy.SaveContext`` of each ``save`` call (the clock,
the last save, whether a preemption signal waits for its checkpoint), asks the policy
(``save_policy``, the Young/Daly interval of ``interval`` among its rules), and, where the
answer may differ between ranks (a clock, a signal), makes every rank agree through
``comm.agreement`` (any rank due: every rank saves). It remembers what a save answered:
the last step started and whether a save followed the signal (``reached_preemption``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..comm.agreement import Agreement
from .interval import AutoInterval
from .options import ManagerOptions
from .preemption import PreemptionWatcher
from .save_policy import SaveContext, save_policy_from_options, varies_between_ranks

log = logging.getLogger("shardsafe")


class SaveSchedule:
    """The persistent tier's save decisions for one manager.

    Args:
        opts: The manager's options.
        agreement: How the ranks agree (decisions, the automatic interval).
        newest_time: The save time of the newest checkpoint (for ``save_interval_seconds``).
    """

    def __init__(self, opts: ManagerOptions, agreement: Agreement, newest_time: Callable[[], float]) -> None:
        self._opts, self._agree = opts, agreement
        self.auto = AutoInterval(opts.expected_mtbf_seconds, self._rank0_value) \
            if opts.expected_mtbf_seconds is not None else None
        self._policy = save_policy_from_options(opts, self.auto)
        self.last_started: int | None = None
        self._saved_after_signal = False
        self._peer_preempted = False  # another rank received a preemption signal
        self._preemption_logged = False
        self._watcher = PreemptionWatcher(opts.preemption_signals)  # main thread check first
        try:
            self._last_save_time = (time.time() if opts.save_interval_seconds is None or opts.read_only
                                    else newest_time())
        except BaseException:
            self._watcher.close()
            raise

    def _rank0_value(self, value: int) -> int:
        """Every rank gets rank 0's ``value`` (the agreed automatic interval)."""
        return int(self._agree.leader_decides(lambda: value, what="agreeing on the save interval"))

    def preempted(self) -> bool:
        """A preemption signal arrived here or on another rank."""
        return self._watcher.received is not None or self._peer_preempted

    def due(self, step: int, latest: Callable[[], int | None]) -> bool:
        """Is ``step`` due? With several ranks, all of them agree (one bounded round when a
        clock or a signal is involved). ``latest`` gives the newest saved step (read only
        for ``initial_save``: a listing costs a request per call on object stores)."""
        ctx = SaveContext(step=step, now=time.time(), last_save_time=self._last_save_time,
                          latest_step=latest() if self._opts.initial_save else None,
                          preempted=self.preempted() and not self._saved_after_signal)
        due = self._policy.should_save(ctx)
        if self._agree.world_size > 1 and varies_between_ranks(self._opts):
            due, peer_signal = self._agree.any_rank([due, self.preempted()])
            if peer_signal and not self.preempted():
                self._peer_preempted = True
        if self.preempted() and not self._preemption_logged:  # logged here: never in the signal handler
            self._preemption_logged = True
            got = self._watcher.received
            log.info("preemption: %s; %s", f"{got.name} received" if got is not None else
                     "another rank received a preemption signal",
                     f"saving step {step}" if due else f"step {step} is not saved (the policy says no)")
        return due

    def started(self, step: int, blocked_s: float) -> None:
        """A persistent save of ``step`` started; it blocked the caller ``blocked_s`` seconds."""
        self.last_started, self._last_save_time = step, time.time()
        self._saved_after_signal = self.preempted()
        if self.auto is not None:
            self.auto.saved(step, blocked_s)

    def rolled_back(self, step: int) -> None:
        """Training continues from ``step``."""
        if self.last_started is not None and self.last_started > step:
            self.last_started = step

    def reached_preemption(self, step: int) -> bool:
        """A signal arrived and a checkpoint answers it (see ``CheckpointManager``)."""
        if not self.preempted() or self.last_started is None:
            return False
        return self._saved_after_signal or step <= self.last_started

    @property
    def interval(self) -> int | None:
        """The step interval in force (None: none, or "auto" before its first measurement)."""
        if self.auto is not None:
            return self.auto.interval
        interval = self._opts.save_interval_steps
        return interval if isinstance(interval, int) else None

    def close(self) -> None:
        """Restores the signal handlers."""
        self._watcher.close()


__all__ = ["SaveSchedule"]
