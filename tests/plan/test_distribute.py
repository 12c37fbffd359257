"""The distributed write planner: table-driven cases, properties, and scale."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsafe.plan.distribute import (
    PlanError,
    RankReport,
    SharedBoxes,
    decode_plan,
    decode_report,
    encode_plan,
    encode_report,
    plan_writers,
    table_digest,
)

D = "digest"


def reports(world: int, own: list[int] | None = None,
            led: dict[int, list[SharedBoxes]] | None = None) -> list[RankReport]:
    own = own or [0] * world
    led = led or {}
    return [RankReport(r, D, own[r], tuple(led.get(r, ()))) for r in range(world)]


def test_own_bytes_need_no_decision() -> None:
    plan = plan_writers(3, reports(3, own=[10, 20, 30]))
    assert plan.shared == () and plan.everywhere == ((), ())
    assert plan.loads == (10, 20, 30)
    assert plan.items_written_by(1) == set()


def test_everywhere_items_go_to_the_least_loaded_rank() -> None:
    sizes = [100, 60, 50, 40, 30, 20]
    plan = plan_writers(2, reports(2), list(enumerate(sizes)))
    # LPT: 100->0, 60->1, 50->1, 40->0, 30->1, 20->0 (tie goes to the lower rank)
    assert plan.everywhere == ((0, 1, 2, 3, 4, 5), (0, 1, 1, 0, 1, 0))
    assert plan.loads == (160, 140) and plan.imbalance() <= 1.10
    assert plan.items_written_by(0) == {0, 3, 5} and plan.items_written_by(1) == {1, 2, 4}


def test_fixed_loads_are_taken_into_account() -> None:
    # rank 0 already writes a big shard: the replicated tensors go elsewhere
    plan = plan_writers(2, reports(2, own=[100, 0]), [(0, 40), (1, 40)])
    assert plan.items_written_by(1) == {0, 1}
    assert plan.loads == (100, 80)


def test_shared_boxes_go_to_one_of_their_holders() -> None:
    # a 2x2 mesh (Replicate, Shard): ranks {0,2} hold box 0 of each item, {1,3} box 1
    led = {0: [SharedBoxes((0, 2), (7, 8), (64, 64))], 1: [SharedBoxes((1, 3), (7, 8), (64, 64))]}
    plan = plan_writers(4, reports(4, led=led))
    assert plan.loads == (64, 64, 64, 64)
    written = [plan.items_written_by(r) for r in range(4)]
    assert written[0] | written[2] == {7, 8} and not written[0] & written[2]
    assert written[1] | written[3] == {7, 8} and not written[1] & written[3]


@pytest.mark.parametrize("world", [2, 3, 4, 7])
def test_replicated_state_is_balanced_within_ten_percent(world: int) -> None:
    # a model kept replicated on every rank (DDP-style): 40 tensors of mixed sizes
    sizes = [(1 << 20) * (1 + (i * 7) % 13) for i in range(40)]
    plan = plan_writers(world, reports(world), list(enumerate(sizes)))
    assert sum(plan.loads) == sum(sizes)
    assert plan.imbalance() <= 1.10


def test_inconsistent_states_are_rejected() -> None:
    rs = reports(3)
    rs[2] = RankReport(2, "other", 0)
    with pytest.raises(PlanError, match=r"rank\(s\) \[2\]"):
        plan_writers(3, rs)


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


def test_wire_format_round_trips() -> None:
    r = RankReport(1, "abc", 123, (SharedBoxes((1, 3), (2, 5), (8, 16)),))
    assert decode_report(encode_report(r)) == r
    plan = plan_writers(4, reports(4, led={1: list(r.led)}), [(0, 4)])
    assert decode_plan(encode_plan(plan)) == plan
    with pytest.raises(PlanError, match="malformed"):
        decode_report(b"[1, 2]")
    with pytest.raises(PlanError, match="malformed"):
        decode_plan(b"{}")


def test_table_digest_sees_every_field() -> None:
    rows = [[["model", "w"], "torch", "float32", [4, 4]]]
    assert table_digest(rows) == table_digest([list(r) for r in rows])
    assert table_digest(rows) != table_digest([[["model", "w"], "torch", "float32", [4, 5]]])


@settings(max_examples=60, deadline=None)
@given(world=st.integers(2, 9),
       own=st.lists(st.integers(0, 1000), min_size=9, max_size=9),
       sizes=st.lists(st.integers(0, 500), max_size=40),
       groups=st.lists(st.sets(st.integers(0, 8), min_size=2, max_size=4), max_size=6))
def test_every_box_written_once_by_a_holder(world: int, own: list[int], sizes: list[int],
                                            groups: list[set[int]]) -> None:
    led: dict[int, list[SharedBoxes]] = {}
    seen, expected = set(), sum(own[:world]) + sum(sizes)
    for g in groups:
        holders = tuple(sorted({h % world for h in g}))
        if len(holders) < 2 or holders in seen:
            continue
        seen.add(holders)
        n = tuple(10 * k for k in range(len(holders) + 1))
        led.setdefault(holders[0], []).append(SharedBoxes(holders, tuple(range(100, 100 + len(n))), n))
        expected += sum(n)
    plan = plan_writers(world, reports(world, own=own[:world], led=led), list(enumerate(sizes)))
    for boxes in led.values():
        for b in boxes:
            _, items, writers = next(s for s in plan.shared if s[0] == b.holders)
            assert items == b.items and all(w in b.holders for w in writers)
    assert sorted(plan.everywhere[0]) == list(range(len(sizes)))
    assert sum(plan.loads) == expected  # every byte written exactly once
    if not led and sizes:
        # list scheduling bound: nobody exceeds max(its fixed load, mean + largest unit)
        mean = sum(plan.loads) / world
        assert max(plan.loads) <= max(max(own[:world]), mean + max(sizes))


# ----------------------------------------------------------------------------- scale
RANKS, TENSORS = 1024, 1000
Case = tuple[list[bytes], list[tuple[int, int]]]


def _fsdp() -> Case:
    """1-D FSDP: 990 tensors sharded over all ranks (unique boxes), 10 replicated."""
    blobs = [encode_report(RankReport(r, D, 990 * (4 << 20))) for r in range(RANKS)]
    return blobs, [(i, 1 << 16) for i in range(990, TENSORS)]


def _hsdp() -> Case:
    """2-D HSDP mesh 8 x 128 (Replicate, Shard): each box held by 8 ranks."""
    blobs = []
    for r in range(RANKS):
        led: tuple[SharedBoxes, ...] = ()
        if r < 128:  # mesh row 0 leads; the holders are the same column of every row
            led = (SharedBoxes(tuple(r + 128 * k for k in range(8)), tuple(range(TENSORS)),
                               tuple((256 << 10) + 4096 * (i % 5) for i in range(TENSORS))),)
        blobs.append(encode_report(RankReport(r, D, 0, led)))
    return blobs, []


def _replicated() -> Case:
    """No sharding: 1,000 plain tensors every rank holds."""
    blobs = [encode_report(RankReport(r, D, 0)) for r in range(RANKS)]
    return blobs, [(i, (1 << 20) + 4096 * i) for i in range(TENSORS)]


@pytest.mark.parametrize("make", [_fsdp, _hsdp, _replicated], ids=["fsdp", "hsdp-8x128", "replicated"])
def test_planning_1024_ranks_by_1000_tensors_under_a_second(make: Callable[[], Case]) -> None:
    blobs, everywhere = make()
    t0 = time.perf_counter()  # what rank 0 does (decode, plan, encode) and then every rank
    plan = plan_writers(RANKS, [decode_report(b) for b in blobs], everywhere)
    received = decode_plan(encode_plan(plan))
    mine = received.items_written_by(RANKS - 1)
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, f"planning took {elapsed:.3f} s"
    assert mine == plan.items_written_by(RANKS - 1)
    # every rank reads its own share from the broadcast plan, and each box has exactly one writer
    shares = [received.items_written_by(r) for r in range(RANKS)]
    assert shares == [plan.items_written_by(r) for r in range(RANKS)]
    assert sum(map(len, shares)) == len(everywhere) + sum(len(items) for _, items, _ in plan.shared)
    # within 10% of the mean, unless one tensor alone is bigger (then one tensor per rank)
    largest = max((n for _, n in everywhere), default=0)
    assert max(plan.loads) <= max(1.10 * sum(plan.loads) / RANKS, largest)
