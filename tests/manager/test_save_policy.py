"""Save decisions as pure policies: tables of (policy, context) -> due."""

from __future__ import annotations

import pytest

from shardsafe.manager.options import ManagerOptions
from shardsafe.manager.save_policy import (AnySavePolicy, FixedIntervalSteps, InitialSave,
                                           IntervalSeconds, PreemptionSave, SaveContext,
                                           SpecificSteps, save_policy_from_options,
                                           varies_between_ranks)


def ctx(step: int, *, now: float = 100.0, last: float = 100.0, latest: int | None = 0,
        preempted: bool = False) -> SaveContext:
    return SaveContext(step=step, now=now, last_save_time=last, latest_step=latest,
                       preempted=preempted)


@pytest.mark.parametrize("policy, context, due", [
    (FixedIntervalSteps(10), ctx(0), True),
    (FixedIntervalSteps(10), ctx(10), True),
    (FixedIntervalSteps(10), ctx(15), False),
    (FixedIntervalSteps(1), ctx(7), True),
    (IntervalSeconds(5.0), ctx(1, now=104.9, last=100.0), False),
    (IntervalSeconds(5.0), ctx(1, now=105.0, last=100.0), True),
    (IntervalSeconds(5.0), ctx(1, now=200.0, last=100.0), True),
    (SpecificSteps(frozenset({3, 8})), ctx(3), True),
    (SpecificSteps(frozenset({3, 8})), ctx(4), False),
    (SpecificSteps(frozenset()), ctx(0), False),
    (PreemptionSave(), ctx(5), False),
    (PreemptionSave(), ctx(5, preempted=True), True),
    (InitialSave(), ctx(5, latest=None), True),
    (InitialSave(), ctx(5, latest=4), False),
    (AnySavePolicy(()), ctx(0, preempted=True), False),
    (AnySavePolicy((FixedIntervalSteps(10), SpecificSteps(frozenset({7})))), ctx(7), True),
    (AnySavePolicy((FixedIntervalSteps(10), SpecificSteps(frozenset({7})))), ctx(8), False),
    (AnySavePolicy((FixedIntervalSteps(10), PreemptionSave())), ctx(8, preempted=True), True),
])
def test_policy_table(policy, context, due) -> None:
    assert policy.should_save(context) is due


@pytest.mark.parametrize("kwargs, context, due", [
    ({}, ctx(3), True),  # default: every step
    ({"save_interval_steps": 5}, ctx(3), False),
    ({"save_interval_steps": 5}, ctx(3, preempted=True), True),  # preemption always counts
    ({"save_interval_steps": 5, "save_on_steps": [3]}, ctx(3), True),
    ({"save_interval_steps": None}, ctx(5), False),
    ({"save_interval_steps": None, "save_interval_seconds": 2}, ctx(5, now=101.0), False),
    ({"save_interval_steps": None, "save_interval_seconds": 2}, ctx(5, now=102.0), True),
    ({"save_interval_steps": None, "initial_save": True}, ctx(5, latest=None), True),
    ({"save_interval_steps": None, "initial_save": True}, ctx(6, latest=5), False),
    ({"save_interval_steps": None}, ctx(5, latest=None), False),  # no initial save unless asked
])
def test_policy_from_options_table(kwargs, context, due) -> None:
    assert save_policy_from_options(ManagerOptions(**kwargs)).should_save(context) is due


@pytest.mark.parametrize("kwargs, varies", [
    ({}, False),
    ({"save_on_steps": [1], "initial_save": True}, False),
    ({"save_interval_seconds": 1}, True),
    ({"preemption_signals": [15]}, True),
])
def test_only_clocks_and_signals_need_agreement(kwargs, varies) -> None:
    assert varies_between_ranks(ManagerOptions(**kwargs)) is varies


def test_initial_save_through_the_manager(tmp_path) -> None:
    from shardsafe import CheckpointManager

    with CheckpointManager(tmp_path, save_interval_steps=None, initial_save=True,
                           async_save=False) as mgr:
        assert mgr.save(3, {"x": 1}) and not mgr.save(4, {"x": 2})
        assert mgr.all_steps() == [3]
