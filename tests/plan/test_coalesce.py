"""coalesce: the one grouping of byte ranges into reads (reader and ``shardsafe verify``)."""

from __future__ import annotations

import pytest

from shardsafe.plan.load_plan import coalesce


def _groups(spans: list[tuple[str, int, int]], limit: int, max_gap: int = 0) -> list[list[tuple]]:
    return coalesce(spans, lambda s: s, limit, max_gap)


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
])
def test_coalesce(spans: list, limit: int, max_gap: int, want: list[list[int]]) -> None:
    got = _groups(spans, limit, max_gap)
    assert [[s[1] for s in g] for g in got] == want
    assert sorted(s for g in got for s in g) == sorted(spans)  # every range exactly once
