"""The demo's interruption plan: seeded, between checkpoints, refused without room."""

from __future__ import annotations

import pytest

from shardsafe.demo.plan import plan_interruptions


@pytest.mark.parametrize("steps,every", [(300, 25), (120, 20), (60, 10), (16, 4), (1000, 7)])
@pytest.mark.parametrize("seed", [0, 1, 2, 17])
def test_interruptions_land_between_checkpoints(steps, every, seed) -> None:
    p = plan_interruptions(steps, every, seed)
    assert p == plan_interruptions(steps, every, seed)  # seeded
    for s in (p.crash_at, p.preempt_at):
        assert every < s < steps - every  # after a checkpoint, work left after it
        assert every // 4 <= s % every <= every - every // 4  # the middle of an interval
    assert p.preempt_at // every > p.crash_at // every  # a later interval than the crash


def test_interruptions_depend_on_the_seed() -> None:
    assert len({plan_interruptions(300, 25, seed) for seed in range(20)}) > 5


@pytest.mark.parametrize("steps,every", [(10, 10), (25, 25), (30, 10), (300, 3), (300, 0),
                                         (5, 4)])
def test_plan_rejects_options_without_room(steps, every) -> None:
    with pytest.raises(ValueError):
        plan_interruptions(steps, every, 0)


@pytest.mark.parametrize("every", [4, 5, 10, 25, 99])
def test_the_suggested_minimum_number_of_steps_fits(every) -> None:
    with pytest.raises(ValueError, match=f"use at least {4 * every} steps"):
        plan_interruptions(2 * every, every, 0)
    plan_interruptions(4 * every, every, 0)
