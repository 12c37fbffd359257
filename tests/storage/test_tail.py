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
    assert t.samples(32 * MiB) == 64 and t.finished(32 * MiB) == 128  # kept, and ever finished
    assert t.finished(4 << 10) == 0


@pytest.mark.parametrize(("durations", "min_samples", "expected", "draining"), [
    ([], 32, 1.0, 1.0),              # nothing learned: the initial delay either way
    ([0.3] * 20, 32, 1.0, 0.75),     # few samples: 3.5 x 0.3 capped at 1.0; draining: 2.5 x the median
    ([0.3] * 20, 8, 0.3, 0.3),       # the p95 is sooner than 2.5 x the median: it stays
    ([0.1] * 18 + [3.0, 3.0], 8, 3.0, 0.25),
    ([0.01] * 20, 8, 0.05, 0.05),    # never below the floor
])
def test_a_draining_request_is_hedged_after_a_multiple_of_the_median(durations: list[float], min_samples: int,
                                                                     expected: float, draining: float) -> None:
    policy = TailPolicy(min_samples=min_samples, sibling_factor=3.5, drain_factor=2.5)
    t = _tracker(durations)
    assert policy.hedge_delay(t, 32 * MiB) == pytest.approx(expected)
    assert policy.hedge_delay(t, 32 * MiB, draining=True) == pytest.approx(draining)
    b = HedgeBudget(0.05, burst=4)
    b.started()
    assert policy.hedge_now(t, b, 32 * MiB, draining - 0.01, None, draining=True) is False
    assert policy.hedge_now(t, b, 32 * MiB, draining, None, draining=True) is True


# 32 MiB reads whose median is 0.3 s (crawl_factor 8: on course for more than 2.4 s is far slower)
@pytest.mark.parametrize(("elapsed", "moved_mib", "finished_since", "crawling"), [
    (2.5, 8, 3, True),       # on course for 10 s, 7.5 s to go, siblings finish: stalled
    (1.9, 4, 3, False),      # before the stall floor (2 s), never
    (2.5, 8, 0, False),      # nothing else of its class finished meanwhile: the store is slow for all
    (2.5, 0, 3, False),      # no byte yet: that is the silence the stall limit judges
    (2.2, 28, 3, False),     # on course for 2.51 s but 0.31 s to go: a new attempt would not be sooner
    (2.0, 28, 3, False),     # on course for 2.29 s: not 8 x the median
    (2.0, 24, 3, True),      # on course for 2.67 s, 0.67 s to go (more than 2 x the median)
])
def test_an_attempt_far_slower_than_its_siblings_is_stalled(elapsed: float, moved_mib: int, finished_since: int,
                                                            crawling: bool) -> None:
    t = _tracker([0.3] * 20)
    assert TailPolicy().crawling(t, 32 * MiB, elapsed, moved_mib * MiB, finished_since) is crawling


def test_an_attempt_is_not_judged_against_siblings_it_does_not_have() -> None:
    few = _tracker([0.3] * 7)  # fewer than min_gaps durations
    assert TailPolicy().crawling(few, 32 * MiB, 5.0, MiB, 3) is False
    assert TailPolicy().crawling(_tracker([0.3] * 20, size=4 << 10), 32 * MiB, 5.0, MiB, 3) is False


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


@pytest.mark.parametrize(("requests", "taken", "reserve", "allowed"), [
    (20, 0, 0, True),     # budget 0.05 x 20 + 1 = 2
    (20, 1, 0, True),
    (20, 2, 0, False),
    (20, 0, 1, True),     # a reserve of 1 leaves one of the 2 untaken
    (20, 1, 1, False),
    (20, 0, 2, False),
    (40, 1, 1, True),     # the budget grew to 3
])
def test_a_reserve_leaves_part_of_the_budget_untaken(requests: int, taken: int, reserve: int,
                                                     allowed: bool) -> None:
    b = HedgeBudget(0.05, burst=1)
    for _ in range(requests):
        b.started()
    b.hedges = taken
    assert b.take(reserve) is allowed
    assert b.hedges == taken + allowed


def _gaps(gaps: list[float]) -> LatencyTracker:
    t = LatencyTracker(window=64)
    for g in gaps:
        t.record(4 << 10, 0.05, g)
    return t


@pytest.mark.parametrize(("gaps", "expected"), [
    ([], 0.5),                      # nothing learned: the initial silence limit
    ([0.03, 0.05], 0.25),           # a few gaps: 4 x the largest, at least the floor...
    ([0.03, 0.1], 0.4),
    ([0.03, 0.5], 0.5),             # ... at most the initial limit
    ([0.03] * 20, 0.25),            # learned: 4 x the p99 gap, at least the floor
    ([0.1] * 19 + [0.2], 0.8),
    ([1.0] * 20, 4.0),              # a slow store: beyond the initial delay once learned
])
def test_silence_limit_is_k_times_the_usual_gap(gaps: list[float], expected: float) -> None:
    assert TailPolicy().silence_limit(_gaps(gaps)) == pytest.approx(expected)
    assert TailPolicy(hedge=False).silence_limit(_gaps(gaps)) is None


# A tracker whose 32 MiB reads take 0.3 s (so a read is slow after 0.3 s) and whose gaps
# are 0.03 s (so a read is silent after 0.25 s); the budget has had 20 requests (0.05 x 20
# + 3 = 4 duplicates, of which a slow request leaves 1).
@pytest.mark.parametrize(("elapsed", "silent", "taken", "hedged"), [
    (0.2, 0.2, 0, False),    # neither slow nor silent
    (0.2, None, 0, False),   # a request that reports no progress
    (0.28, 0.26, 0, True),   # silent before it is slow: the likely stall is hedged at once
    (0.28, None, 0, False),  # ... which only progress shows
    (0.5, 0.0, 0, True),     # slow, still receiving bytes
    (0.5, None, 0, True),
    (0.5, 0.0, 2, True),
    (0.5, 0.0, 3, False),    # slow: the last duplicate is kept for a silent request
    (0.5, 0.3, 3, True),     # silent: it takes it
    (0.5, 0.3, 4, False),    # the budget is spent
    (9.0, 9.0, 4, False),
])
def test_silent_requests_are_hedged_first_and_may_use_the_reserve(elapsed: float, silent: float | None,
                                                                  taken: int, hedged: bool) -> None:
    policy = TailPolicy(min_samples=8, hedge_burst=3, hedge_reserve=1)
    t = _tracker([0.3] * 20, gaps=[0.03])
    b = HedgeBudget(policy.hedge_budget, policy.hedge_burst)
    for _ in range(20):
        b.started()
    b.hedges = taken
    assert policy.hedge_now(t, b, 32 * MiB, elapsed, silent) is hedged
    assert b.hedges == taken + hedged
    assert TailPolicy(hedge=False).hedge_now(t, b, 32 * MiB, elapsed, silent) is False


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


@pytest.mark.parametrize(("notes", "now", "silence"), [
    ([], 5.0, None),                               # reports nothing
    ([(0.0, 0)], 0.7, 0.7),                        # no first byte yet
    ([(0.0, 0), (1.5, 100)], 1.6, 0.1),            # since the last byte
])
def test_progress_tells_how_long_an_attempt_has_been_silent(notes: list[tuple[float, int]], now: float,
                                                            silence: float | None) -> None:
    p = Progress(0.0)
    for t, n in notes:
        p.note(t, n)
    assert p.silence(now) == (None if silence is None else pytest.approx(silence))


def test_progress_keeps_the_longest_gap() -> None:
    p = Progress(10.0)
    for t, n in ((10.0, 0), (10.4, 5), (11.5, 5), (11.6, 5)):
        p.note(t, n)
    assert p.longest_gap == pytest.approx(1.1) and p.bytes == 15


@pytest.mark.parametrize("bad", [dict(hedge_quantile=1.0), dict(hedge_budget=-0.1), dict(stall_floor=0),
                                 dict(stall_floor=40.0), dict(hedge_initial=0.01), dict(min_samples=0),
                                 dict(sibling_factor=0.5), dict(silence_factor=0), dict(silence_floor=0),
                                 dict(silence_floor=2.0), dict(silence_initial=0.1), dict(hedge_reserve=-1),
                                 dict(drain_factor=0.5), dict(crawl_factor=0.9), dict(slowest_rate=0)])
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
