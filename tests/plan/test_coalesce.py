"""coalesce: the one grouping of byte ranges into reads (reader and ``shardsafe verify``)."""

from __future__ import annotations

import pytest

from shardsafe.plan.load_plan import coalesce


def _groups(spans: list[tuple[str, int, int]], limit: int, max_gap: int = 0) -> list[list[tuple]]:
    names = sorted({f for f, _, _ in spans})  # file ids in name order
    order, bounds = coalesce([names.index(f) for f, _, _ in spans], [o for _, o, _ in spans],
                             [n for _, _, n in spans], limit, max_gap)
    assert bounds[0] == 0 and bounds[-1] == len(spans) and all(a < b for a, b in zip(bounds, bounds[1:]))
    return [[spans[i] for i in order[a:b]] for a, b in zip(bounds.tolist(), bounds[1:].tolist())]


@pytest.mark.parametrize(("spans", "limit", "max_gap", "want"), [
    ([], 100, 0, []),
    # neighbours join; a gap splits unless max_gap allows it
    ([("a", 0, 10), ("a", 10, 10), ("a", 25, 5)], 100, 0, [[0, 10], [25]]),
    ([("a", 0, 10), ("a", 10, 10), ("a", 25, 5)], 100, 5, [[0, 10, 25]]),
    ([("a", 0, 10), ("a", 10, 10), ("a", 25, 5)], 100, 4, [[0, 10], [25]]),
    # the limit bounds the span of a group from its first byte
    ([("a", 0, 10), ("a", 10, 10), ("a", 20, 10)], 20, 0, [[0, 10], [20]]),
    ([("a", 0, 10), ("a", 10, 10), ("a", 20, 10)], 30, 0, [[0, 10, 20]]),
    # taken in (file, offset) order; files never share a group
    ([("b", 0, 10), ("a", 10, 10), ("a", 0, 10)], 100, 0, [[0, 10], [0]]),
    # an empty range at the group's end joins it; an overlap starts a new group
    ([("a", 0, 10), ("a", 10, 0), ("a", 10, 5)], 100, 0, [[0, 10, 10]]),
    ([("a", 0, 10), ("a", 5, 10)], 100, 0, [[0], [5]]),
    # a long run of neighbours is cut greedily, each read as long as the limit allows
    ([("a", o, 10) for o in range(0, 100, 10)], 35, 0, [[0, 10, 20], [30, 40, 50], [60, 70, 80], [90]]),
    # a range longer than the limit is a read of its own
    ([("a", 0, 5), ("a", 5, 50), ("a", 55, 5)], 20, 0, [[0], [5], [55]]),
])
def test_coalesce(spans: list, limit: int, max_gap: int, want: list[list[int]]) -> None:
    got = _groups(spans, limit, max_gap)
    assert [[s[1] for s in g] for g in got] == want
    assert sorted(s for g in got for s in g) == sorted(spans)  # every range exactly once
