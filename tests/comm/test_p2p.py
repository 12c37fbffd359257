"""``p2p.partners``: which rank holds each rank's copies (a table)."""

from __future__ import annotations

import pytest

from shardsafe.comm.p2p import partners

A, B, C = ("h", "/shm/a"), ("h", "/shm/b"), ("h2", "/shm/a")


@pytest.mark.parametrize("nodes, want", [
    ([A, A, B, B], [2, 3, 0, 1]),
    ([A, B, A, B], [1, 0, 3, 2]),
    ([A, A, A, A], [None] * 4),               # one node: nobody to hold copies
    ([A, B, C], [1, 2, 0]),                    # same path on another host is another node
    ([A, A, A, B], [3, 3, 3, 0]),              # uneven nodes
])
def test_partners(nodes: list, want: list) -> None:
    got = partners(nodes)
    assert got == want
    assert all(h is None or nodes[h] != nodes[r] for r, h in enumerate(got))
