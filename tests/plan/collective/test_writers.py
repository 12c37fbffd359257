"""The write planner (``plan.collective.writers``): table-driven cases and properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsafe.plan.collective.writers import PlanError, RankReport, SharedBoxes, WriterPlan, plan_writers


def reports(world: int, own: list[int] | None = None,
            led: dict[int, list[SharedBoxes]] | None = None) -> list[RankReport]:
    own = own or [0] * world
    led = led or {}
    return [RankReport(r, own[r], tuple(led.get(r, ()))) for r in range(world)]


def everyone(world: int, sizes: list[int]) -> dict[int, list[SharedBoxes]]:
    """Plain tensors every rank holds: one holder set of all ranks, led by rank 0."""
    return {0: [SharedBoxes(tuple(range(world)), tuple(range(len(sizes))), tuple(sizes))]} if sizes else {}


def written_by(plan: WriterPlan, rank: int) -> set[int]:
    """Item ids of the shared boxes that ``rank`` writes, from the plan's columns."""
    return {i for _, items, writers in plan.shared for i in items[writers == rank].tolist()}


def test_own_bytes_need_no_decision() -> None:
    plan = plan_writers(3, reports(3, own=[10, 20, 30]))
    assert plan.shared == ()
    assert plan.loads == (10, 20, 30)
    assert written_by(plan, 1) == set()


def test_replicated_items_go_to_the_least_loaded_rank() -> None:
    sizes = [100, 60, 50, 40, 30, 20]
    plan = plan_writers(2, reports(2, led=everyone(2, sizes)))
    # LPT: 100->0, 60->1, 50->1, 40->0, 30->1, 20->0 (tie goes to the lower rank)
    [(holders, items, writers)] = plan.shared
    assert holders == (0, 1) and items.tolist() == [0, 1, 2, 3, 4, 5]
    assert writers.tolist() == [0, 1, 1, 0, 1, 0]
    assert plan.loads == (160, 140) and plan.imbalance() <= 1.10
    assert written_by(plan, 0) == {0, 3, 5} and written_by(plan, 1) == {1, 2, 4}


def test_fixed_loads_are_taken_into_account() -> None:
    # rank 0 already writes a big shard: the replicated tensors go elsewhere
    plan = plan_writers(2, reports(2, own=[100, 0], led=everyone(2, [40, 40])))
    assert written_by(plan, 1) == {0, 1}
    assert plan.loads == (100, 80)


def test_shared_boxes_go_to_one_of_their_holders() -> None:
    # a 2x2 mesh (Replicate, Shard): ranks {0,2} hold box 0 of each item, {1,3} box 1
    led = {0: [SharedBoxes((0, 2), (7, 8), (64, 64))], 1: [SharedBoxes((1, 3), (7, 8), (64, 64))]}
    plan = plan_writers(4, reports(4, led=led))
    assert plan.loads == (64, 64, 64, 64)
    written = [written_by(plan, r) for r in range(4)]
    assert written[0] | written[2] == {7, 8} and not written[0] & written[2]
    assert written[1] | written[3] == {7, 8} and not written[1] & written[3]


@pytest.mark.parametrize("world", [2, 3, 4, 7])
def test_replicated_state_is_balanced_within_ten_percent(world: int) -> None:
    # a model kept replicated on every rank (DDP-style): 40 tensors of mixed sizes
    sizes = [(1 << 20) * (1 + (i * 7) % 13) for i in range(40)]
    plan = plan_writers(world, reports(world, led=everyone(world, sizes)))
    assert sum(plan.loads) == sum(sizes)
    assert plan.imbalance() <= 1.10


@pytest.mark.parametrize("led, match", [
    ({0: [SharedBoxes((0, 5), (1,), (8,))]}, "holders"),
    ({0: [SharedBoxes((0,), (1,), (8,))]}, "holders"),
    ({1: [SharedBoxes((0, 1), (1,), (8,))]}, "led by the reporter"),
    ({0: [SharedBoxes((0, 1), (1,), (8,)), SharedBoxes((0, 1), (2,), (8,))]}, "twice"),
    ({0: [SharedBoxes((0, 1), (1, 1), (8, 8))]}, "distinct"),
])
def test_bad_boxes_are_rejected(led: dict[int, list[SharedBoxes]], match: str) -> None:
    with pytest.raises(PlanError, match=match):
        plan_writers(2, reports(2, led=led))


def test_missing_report_is_rejected() -> None:
    with pytest.raises(PlanError, match="one report per rank"):
        plan_writers(3, reports(2))


@settings(max_examples=60, deadline=None)
@given(world=st.integers(2, 9),
       own=st.lists(st.integers(0, 1000), min_size=9, max_size=9),
       sizes=st.lists(st.integers(0, 500), max_size=40),
       groups=st.lists(st.sets(st.integers(0, 8), min_size=2, max_size=4), max_size=6))
def test_every_box_written_once_by_a_holder(world: int, own: list[int], sizes: list[int],
                                            groups: list[set[int]]) -> None:
    led = everyone(world, sizes)
    seen, expected = {tuple(range(world))}, sum(own[:world]) + sum(sizes)
    for g in groups:
        holders = tuple(sorted({h % world for h in g}))
        if len(holders) < 2 or holders in seen:
            continue
        seen.add(holders)
        n = tuple(10 * k for k in range(len(holders) + 1))
        led.setdefault(holders[0], []).append(SharedBoxes(holders, tuple(range(100, 100 + len(n))), n))
        expected += sum(n)
    plan = plan_writers(world, reports(world, own=own[:world], led=led))
    for boxes in led.values():
        for b in boxes:
            _, items, writers = next(s for s in plan.shared if s[0] == b.holders)
            assert items.tolist() == list(b.items) and all(w in b.holders for w in writers.tolist())
    assert sum(plan.loads) == expected  # every byte written exactly once
    if len(seen) == 1 and sizes:
        # list scheduling bound: nobody exceeds max(its fixed load, mean + largest unit)
        mean = sum(plan.loads) / world
        assert max(plan.loads) <= max(max(own[:world]), mean + max(sizes))
