"""Retention as pure policy: which committed checkpoints to keep.

A policy looks at plain step records (step, save time, metrics), oldest first, and answers
one bool per record: preserve it or not. Policies combine with ``AnyPreservationPolicy``
(a record survives if any policy preserves it). ``steps_to_delete`` applies a policy and
the one rule no configuration can override: the newest committed step is always kept.

Nothing here touches a filesystem, a clock or a thread, so the rules are tested with
tables (tests/manager/test_retention.py); the manager only applies the answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .options import BestFn, BestMode, ManagerOptions


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What retention knows about one committed checkpoint.

    Attributes:
        step: The training step.
        time: Unix time at which the save started.
        metrics: The metrics given to ``save``, or None.
    """

    step: int
    time: float
    metrics: Mapping[str, Any] | None = None


class PreservationPolicy(Protocol):
    """Decides, for records sorted by step (oldest first), which ones to keep."""

    def should_preserve(self, records: Sequence[StepRecord]) -> list[bool]:
        """One bool per record, in the same order: True keeps the checkpoint."""
        ...


@dataclass(frozen=True, slots=True)
class KeepAll:
    """Preserves every checkpoint (no ``max_to_keep``)."""

    def should_preserve(self, records: Sequence[StepRecord]) -> list[bool]:
        return [True] * len(records)


@dataclass(frozen=True, slots=True)
class LatestN:
    """Preserves the ``n`` newest checkpoints."""

    n: int

    def should_preserve(self, records: Sequence[StepRecord]) -> list[bool]:
        cut = len(records) - self.n
        return [i >= cut for i in range(len(records))]


@dataclass(frozen=True, slots=True)
class EveryNSteps:
    """Preserves every checkpoint whose step is divisible by ``period``."""

    period: int

    def should_preserve(self, records: Sequence[StepRecord]) -> list[bool]:
        return [r.step % self.period == 0 for r in records]


@dataclass(frozen=True, slots=True)
class EveryNSeconds:
    """Preserves one checkpoint per ``interval`` seconds.

    Walking from the oldest, a checkpoint is preserved when it was saved at least
    ``interval`` after the previously preserved one (the oldest is preserved). Deleting
    unpreserved records never changes which records are preserved, so the answer is stable
    from one retention pass to the next.
    """

    interval: float

    def should_preserve(self, records: Sequence[StepRecord]) -> list[bool]:
        out, last = [], None
        for r in records:
            keep = last is None or r.time >= last + self.interval
            if keep:
                last = r.time
            out.append(keep)
        return out


@dataclass(frozen=True, slots=True)
class BestN:
    """Preserves the ``n`` best checkpoints by ``best_fn(metrics)``.

    Ties prefer the newer step; a NaN score ranks worst. Checkpoints saved without metrics
    are preserved iff ``keep_without_metrics``. ``n=None`` preserves every checkpoint that
    has metrics.
    """

    best_fn: BestFn
    mode: BestMode = "max"
    n: int | None = None
    keep_without_metrics: bool = True

    def score(self, record: StepRecord) -> float:
        """``best_fn`` of the record's metrics, oriented so that larger is better."""
        if record.metrics is None:
            raise ValueError(f"step {record.step} has no metrics to rank")
        try:
            value = float(self.best_fn(record.metrics))
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise ValueError(f"best_fn failed on the metrics of step {record.step} "
                             f"({dict(record.metrics)!r}): {e!r}") from e
        if math.isnan(value):
            return -math.inf
        return value if self.mode == "max" else -value

    def should_preserve(self, records: Sequence[StepRecord]) -> list[bool]:
        scored = [(self.score(r), r.step, i) for i, r in enumerate(records) if r.metrics is not None]
        scored.sort(reverse=True)  # best first; equal scores: newer step first
        kept = {i for _, _, i in (scored if self.n is None else scored[: self.n])}
        return [i in kept if r.metrics is not None else self.keep_without_metrics
                for i, r in enumerate(records)]


@dataclass(frozen=True, slots=True)
class AnyPreservationPolicy:
    """Preserves a checkpoint when any of ``policies`` preserves it."""

    policies: tuple[PreservationPolicy, ...]

    def should_preserve(self, records: Sequence[StepRecord]) -> list[bool]:
        out = [False] * len(records)
        for p in self.policies:
            out = [a or b for a, b in zip(out, p.should_preserve(records))]
        return out


def policy_from_options(opts: ManagerOptions) -> PreservationPolicy:
    """The retention policy that ``CheckpointManager`` options describe.

    Without ``max_to_keep`` nothing is deleted (``keep_period`` and ``keep_time_interval``
    only add to what ``max_to_keep`` keeps, as in Orbax).
    """
    if opts.max_to_keep is None:
        return KeepAll()
    parts: list[PreservationPolicy] = []
    if opts.best_fn is not None:
        parts.append(BestN(opts.best_fn, opts.best_mode, opts.max_to_keep,
                           opts.keep_checkpoints_without_metrics))
    else:
        parts.append(LatestN(opts.max_to_keep))
    if opts.keep_period is not None:
        parts.append(EveryNSteps(opts.keep_period))
    if opts.keep_time_interval is not None:
        parts.append(EveryNSeconds(opts.keep_time_interval))
    return parts[0] if len(parts) == 1 else AnyPreservationPolicy(tuple(parts))


def steps_to_delete(records: Sequence[StepRecord], policy: PreservationPolicy) -> list[int]:
    """Steps the policy does not preserve, oldest first; the newest step is always kept."""
    ordered = sorted(records, key=lambda r: r.step)
    keep = policy.should_preserve(ordered)
    if len(keep) != len(ordered):
        raise ValueError(f"{type(policy).__name__}.should_preserve returned {len(keep)} answers "
                         f"for {len(ordered)} records")
    return [r.step for r, k in zip(ordered[:-1], keep[:-1]) if not k]


def best_step(records: Sequence[StepRecord], best_fn: BestFn, mode: BestMode = "max") -> int | None:
    """The step with the best ``best_fn(metrics)`` (newest on ties); None if none has metrics."""
    ranker = BestN(best_fn, mode)
    scored = [(ranker.score(r), r.step) for r in records if r.metrics is not None]
    return max(scored)[1] if scored else None
