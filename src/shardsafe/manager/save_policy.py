"""Save decisions as pure policy: is this step due for a checkpoint?

A policy looks at a ``SaveContext`` (the step, the clock, the last save, the newest saved
step, whether a preemption signal waits for an answer) and answers one bool. Policies
combine with ``AnySavePolicy`` (due if any policy says so). ``save_policy_from_options``
builds the manager's policy from its options; ``AutoIntervalSteps`` is the Young/Daly
interval of ``save_interval_steps="auto"``, whose measurements live in
``interval.AutoInterval``. ``is_new_step`` is the last rule of every save: steps only
increase.

Nothing here reads a clock, a signal or a file: the manager fills the context, applies
the answer and, with several ranks, makes them agree (``comm.agreement``). The rules are
tested with tables (tests/manager/test_save_policy.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..errors import CheckpointError
from .interval import AutoInterval
from .options import ManagerOptions

log = logging.getLogger("shardsafe")


@dataclass(frozen=True, slots=True)
class SaveContext:
    """What a save decision may look at.

    Attributes:
        step: The step asked about.
        now: The current Unix time.
        last_save_time: Unix time of the last save this run started (or of the newest
            checkpoint, before the first one).
        latest_step: The newest committed (or in-flight) step, None when there is none
            (the manager reads the listing only for ``InitialSave``).
        preempted: A preemption signal arrived and no save has answered it yet.
    """

    step: int
    now: float = 0.0
    last_save_time: float = 0.0
    latest_step: int | None = None
    preempted: bool = False


class SaveDecisionPolicy(Protocol):
    """Decides whether ``context.step`` should be saved."""

    def should_save(self, context: SaveContext) -> bool:
        """True when the step is due."""
        ...


@dataclass(frozen=True, slots=True)
class FixedIntervalSteps:
    """Due every ``interval`` steps (``step % interval == 0``)."""

    interval: int

    def should_save(self, context: SaveContext) -> bool:
        return context.step % self.interval == 0


@dataclass(frozen=True, slots=True)
class IntervalSeconds:
    """Due once ``seconds`` have passed since the last save."""

    seconds: float

    def should_save(self, context: SaveContext) -> bool:
        return context.now - context.last_save_time >= self.seconds


@dataclass(frozen=True, slots=True)
class SpecificSteps:
    """Due at the listed steps."""

    steps: frozenset[int]

    def should_save(self, context: SaveContext) -> bool:
        return context.step in self.steps


@dataclass(frozen=True, slots=True)
class PreemptionSave:
    """Due when a preemption signal waits for its checkpoint."""

    def should_save(self, context: SaveContext) -> bool:
        return context.preempted


@dataclass(frozen=True, slots=True)
class InitialSave:
    """Due when nothing has been saved yet (the first step of a fresh run)."""

    def should_save(self, context: SaveContext) -> bool:
        return context.latest_step is None


@dataclass(frozen=True, slots=True)
class AutoIntervalSteps:
    """Due by the interval ``measure`` computes from the measured save cost and step time
    (Young/Daly). ``measure`` counts the calls: ask once per ``save`` call."""

    measure: AutoInterval

    def should_save(self, context: SaveContext) -> bool:
        return self.measure.due(context.step)


@dataclass(frozen=True, slots=True)
class AnySavePolicy:
    """Due when any of ``policies`` says so (never, with none). Every policy is asked,
    even after one said yes: a policy that measures (``AutoIntervalSteps``) sees every call."""

    policies: Sequence[SaveDecisionPolicy]

    def should_save(self, context: SaveContext) -> bool:
        answers = [p.should_save(context) for p in self.policies]
        return any(answers)


def save_policy_from_options(opts: ManagerOptions, auto: AutoInterval | None = None) -> AnySavePolicy:
    """The save policy ``opts`` describe (interval, steps, seconds, initial, preemption);
    ``auto`` measures the interval of ``save_interval_steps="auto"``."""
    policies: list[SaveDecisionPolicy] = []
    if isinstance(opts.save_interval_steps, int):
        policies.append(FixedIntervalSteps(opts.save_interval_steps))
    elif auto is not None:
        policies.append(AutoIntervalSteps(auto))
    if opts.save_on_steps:
        policies.append(SpecificSteps(opts.save_on_steps))
    if opts.save_interval_seconds is not None:
        policies.append(IntervalSeconds(opts.save_interval_seconds))
    if opts.initial_save:
        policies.append(InitialSave())
    policies.append(PreemptionSave())  # without signals ``preempted`` is never True
    return AnySavePolicy(tuple(policies))


def varies_between_ranks(opts: ManagerOptions) -> bool:
    """Whether ranks may answer differently (clocks and signals are per process)."""
    return opts.save_interval_seconds is not None or bool(opts.preemption_signals)


def is_new_step(step: int, committed: Mapping[int, str], *, force: bool, where: str) -> bool:
    """Whether ``step`` may be saved next to the ``committed`` steps (step -> directory
    name): only steps newer than the newest one. Without ``force`` an older step is
    skipped (False); with it, it is an error.

    Raises:
        CheckpointError: ``force`` and ``step`` exists or is not newer than the newest step.
    """
    latest = max(committed, default=None)
    if latest is None or step > latest:
        return True
    if not force:
        log.info("not saving step %d in %s: the newest step there is %d", step, where, latest)
        return False
    if step in committed:
        raise CheckpointError(f"step {step} already exists in {where!r} "
                              f"({committed[step]}); delete it first to save it again")
    raise CheckpointError(f"refusing to save step {step} in {where!r}: the newest "
                          f"step there is {latest} and steps must increase (restore an "
                          f"older step with rollback=True to continue from it)")
