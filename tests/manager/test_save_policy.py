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


def test_auto_interval_is_a_policy_asked_on_every_call() -> None:
    from shardsafe.manager.interval import AutoInterval
    from shardsafe.manager.save_policy import AutoIntervalSteps

    t = [0.0]
    auto = AutoInterval(100.0, agree=lambda v: v, clock=lambda: t[0])
    policy = save_policy_from_options(ManagerOptions(save_interval_steps="auto", expected_mtbf_seconds=100.0,
                                                     save_on_steps=[0, 1, 2, 3]), auto)
    assert any(isinstance(p, AutoIntervalSteps) for p in policy.policies)
    for step in range(4):  # another rule says yes first: the interval still sees each call
        t[0] += 1.0
        assert policy.should_save(ctx(step))
        if step == 0:
            auto.saved(0, 2.0)
    assert auto.step_s == pytest.approx(1.0) and auto.interval == round((2 * 2.0 * 100.0) ** 0.5)


@pytest.mark.parametrize("step, committed, force, result", [
    (5, {}, False, True),
    (5, {3: "step_00000003"}, False, True),
    (3, {3: "step_00000003"}, False, False),
    (2, {3: "step_00000003"}, False, False),
    (3, {3: "step_00000003"}, True, "already exists"),
    (2, {3: "step_00000003"}, True, "steps must increase"),
])
def test_is_new_step_table(step, committed, force, result) -> None:
    from shardsafe.errors import CheckpointError
    from shardsafe.manager.save_policy import is_new_step

    if isinstance(result, str):
        with pytest.raises(CheckpointError, match=result):
            is_new_step(step, committed, force=force, where="d")
    else:
        assert is_new_step(step, committed, force=force, where="d") is result
