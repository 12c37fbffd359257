"""What the parent learns from a training process: its JSON events, gathered into a log.

The worker (``worker.py``) prints one JSON object per line; ``WorkerLog.handle`` folds
them into what the report needs. Unknown events and stray non-JSON lines are ignored,
so a library printing to stdout cannot break the demo.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class SaveEvent:
    """A checkpoint a training process started.

    Attributes:
        step: The step saved.
        stall_s: Seconds ``CheckpointManager.save`` held the training loop up.
        reason: ``"schedule"``, ``"preemption"`` or ``"final"``.
        durable_s: Seconds from the ``save`` call until the step was committed and
            durable (None if the process ended first, e.g. killed).
    """

    step: int
    stall_s: float
    reason: str
    durable_s: float | None = None


@dataclass(slots=True)
class WorkerLog:
    """What one training process reported, and how it ended."""

    name: str
    start_step: int = 0
    resumed_from: int | None = None
    last_step: int = 0
    saves: list[SaveEvent] = field(default_factory=list)
    preempted_step: int | None = None
    preempt_wait_s: float | None = None
    fingerprint: str | None = None
    returncode: int | None = None
    signal_sent_at: int | None = None  # the last step reported when the parent signalled
    ready_at: float | None = None  # parent's perf_counter() when the start event arrived
    wall_s: float = 0.0

    @property
    def steps_run(self) -> int:
        """Steps this process trained (as far as it reported)."""
        return self.last_step - self.start_step

    def handle(self, ev: dict[str, Any]) -> None:
        """Folds one event into the log."""
        kind = ev.get("event")
        if kind == "start":
            self.start_step = self.last_step = int(ev["step"])
            self.resumed_from = None if ev.get("resumed_from") is None else int(ev["resumed_from"])
        elif kind == "step":
            self.last_step = int(ev["step"])
        elif kind == "save":
            self.saves.append(SaveEvent(int(ev["step"]), float(ev["stall_s"]), str(ev["reason"])))
        elif kind == "durable":
            for s in self.saves:
                if s.step == int(ev["step"]):
                    s.durable_s = float(ev["after_s"])
        elif kind == "preempted":
            self.preempted_step = int(ev["step"])
            self.preempt_wait_s = float(ev["wait_s"])
        elif kind == "done":
            self.fingerprint = str(ev["fingerprint"])
