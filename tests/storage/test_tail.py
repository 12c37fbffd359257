"""The pure tail policies: size classes, the latency tracker, hedge delays and budget,
stall limits and progress, with the time passed in (no clock, no sleep)."""

from __future__ import annotations

import pytest

from shardsafe.storage.tail import HedgeBudget, LatencyTracker, Progress, TailPolicy, size_class

MiB = 1 << 20


@pytest.mark.parametrize(("size", "cls"), [(0, 0), (1, 0), (64 << 10, 1), (255 << 10, 1), (256 << 10, 2),
                                           (15 * MiB, 4), (20 * MiB, 5), (32 * MiB, 5), (63 * MiB, 5), (64 * MiB, 6)])
def test_size_classes_are_powers_of_four_from_64_kib(size: int, cls: int) -> None:
    assert size_class(size) == cls


def _tracker(durations: list[float], size: int = 32 * MiB, gaps: list[float] | None = None) -> LatencyTracker:
    t = LatencyTracker(window=64)
    for i, d in enumerate(durations):
        t.record(size, d, None if gaps is None else gaps[i % len(gaps)])
    return t


@pytest.mark.parametrize(("durations", "expected"), [
    ([], 1.0),                                  # no samples: the initial delay
    ([0.3] * 7, 0.9),                           # too few for a quantile: 3 x their median
    ([0.1, 0.2, 5.0], 0.6),
    ([0.5, 0.9], 1.0),                          # ... at most the initial delay
    ([0.3] * 8, 0.3),                           # the quantile of a steady store
    ([0.3] * 19 + [9.0], 0.3),                  # one outlier in 20 stays above the p95
    ([0.3] * 18 + [9.0, 9.0], 9.0),             # two of 20 is the p95
    ([0.01] * 10, 0.05),                        # never below the floor
])
def test_hedge_delay_is_the_recent_p95_of_the_size_class(durations: list[float], expected: float) -> None:
    policy = TailPolicy(min_samples=8, sibling_factor=3.0)
    assert policy.hedge_delay(_tracker(durations), 32 * MiB) == pytest.approx(expected)


def test_hedge_delay_of_another_size_class_is_not_learned_from_this_one() -> None:
    t = _tracker([0.3] * 20, size=32 * MiB)
    assert TailPolicy().hedge_delay(t, 4 << 10) == 1.0
    assert TailPolicy(hedge=False).hedge_delay(t, 32 * MiB) is None


def test_the_window_forgets_old_samples() -> None:
    t = _tracker([9.0] * 64 + [0.3] * 64)
    assert TailPolicy(min_samples=8).hedge_delay(t, 32 * MiB) == pytest.approx(0.3)


@pytest.mark.parametrize(("fraction", "requests", "allowed"), [
    (0.05, 1, 1),     # one duplicate from the start
    (0.05, 19, 1),
    (0.05, 20, 2),    # then one per 20 requests
    (0.05, 100, 6),
    (0.0, 100, 0),    # none at all
])
def test_the_hedge_budget_bounds_duplicates(fraction: float, requests: int, allowed: int) -> None:
    b = HedgeBudget(fraction, burst=1)
    for _ in range(requests):
        b.started()
    assert sum(b.take() for _ in range(50)) == allowed
    assert b.hedges == allowed


def test_the_hedge_burst_adds_to_the_budget() -> None:
    b = HedgeBudget(0.05, burst=3)
    for _ in range(20):
        b.started()
    assert sum(b.take() for _ in range(10)) == 4


@pytest.mark.parametrize(("gaps", "cap", "expected"), [
    ([], 30.0, 30.0),               # nothing learned: the fixed timeout
    ([0.05] * 20, 30.0, 2.0),       # quick store: the floor
    ([1.0] * 20, 30.0, 4.0),        # k x the p99 gap
    ([0.1] * 19 + [3.0], 30.0, 12.0),
    ([20.0] * 20, 30.0, 30.0),      # never beyond the cap
    ([1.0] * 20, 3.0, 3.0),
])
def test_stall_limit_is_k_times_the_usual_gap_within_floor_and_cap(gaps: list[float], cap: float,
                                                                    expected: float) -> None:
    t = _tracker([0.5] * len(gaps), gaps=gaps) if gaps else LatencyTracker()
    assert TailPolicy(stall_cap=cap).stall_limit(t) == pytest.approx(expected)


@pytest.mark.parametrize(("notes", "now", "limit", "stalled"), [
    ([], 100.0, 2.0, False),                       # a request that reports nothing is never judged
    ([(0.0, 0)], 1.9, 2.0, False),                 # waiting for the first byte, within the limit
    ([(0.0, 0)], 2.0, 2.0, True),                  # no first byte for the limit
    ([(0.0, 0), (1.5, 100), (3.0, 100)], 4.9, 2.0, False),
    ([(0.0, 0), (1.5, 100), (3.0, 100)], 5.0, 2.0, True),
])
def test_progress_counts_a_stall_from_the_last_byte(notes: list[tuple[float, int]], now: float, limit: float,
                                                    stalled: bool) -> None:
    p = Progress(0.0)
    for t, n in notes:
        p.note(t, n)
    assert p.stalled(now, limit) is stalled


def test_progress_keeps_the_longest_gap() -> None:
    p = Progress(10.0)
    for t, n in ((10.0, 0), (10.4, 5), (11.5, 5), (11.6, 5)):
        p.note(t, n)
    assert p.longest_gap == pytest.approx(1.1) and p.bytes == 15


@pytest.mark.parametrize("bad", [dict(hedge_quantile=1.0), dict(hedge_budget=-0.1), dict(stall_floor=0),
                                 dict(stall_floor=40.0), dict(hedge_initial=0.01), dict(min_samples=0),
                                 dict(sibling_factor=0.5)])
def test_bad_policies_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        TailPolicy(**bad)


def test_the_policy_follows_the_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDSAFE_HEDGE", "0")
    monkeypatch.setenv("SHARDSAFE_HEDGE_BUDGET", "0.02")
    monkeypatch.setenv("SHARDSAFE_STALL_FLOOR", "5")
    monkeypatch.setenv("SHARDSAFE_STALL_TIMEOUT", "3")
    p = TailPolicy.from_knobs()
    assert (p.hedge, p.hedge_budget, p.stall_floor, p.stall_cap) == (False, 0.02, 3.0, 3.0)
