"""The coordinator's coverage check on a real 2-rank gloo group: a lost share never commits.

Rank 1 drops its whole share of the plan (fault injection in its own process, as a
planner bug would), so the chunk entries that reach rank 0 cover only half of ``x``.
The two-phase commit must refuse on both ranks and leave nothing at the path (a phase of
the shared ``cluster`` job).
"""

from __future__ import annotations

import os


def test_lost_share_is_refused_by_the_two_phase_commit(cluster) -> None:  # noqa: ANN001
    out, results = cluster[0], cluster[1][("lost", 2)]
    for r in results:
        assert r is not None and r["error"] == "CheckpointError", r
        assert "chunks of 'x' hold 64 elements" in r["message"] and "needs 128" in r["message"], r
    assert not os.path.exists(os.path.join(out, "lost"))
    assert [n for n in os.listdir(out) if n.startswith(".lost")] == []
