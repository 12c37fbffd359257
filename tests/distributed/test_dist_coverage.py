"""The coordinator's coverage check on a real 2-rank gloo group: a lost share never commits.

Rank 1 drops its whole share of the plan (fault injection in its own process, as a
planner bug would), so the chunk entries that reach rank 0 cover only half of ``x``.
The two-phase commit must refuse on both ranks and leave nothing at the path.
"""

from __future__ import annotations

import os

from dist_harness import run_ranks


def test_lost_share_is_refused_by_the_two_phase_commit(tmp_path) -> None:  # noqa: ANN001
    out = str(tmp_path)
    results = run_ranks(2, [("lost", 2)], out, timeout=180)[("lost", 2)]
    for r in results:
        assert r is not None and r["error"] == "CheckpointError", r
        assert "chunks of 'x' hold 64 elements" in r["message"] and "needs 128" in r["message"], r
    assert not os.path.exists(os.path.join(out, "lost"))
    assert [n for n in os.listdir(out) if n.startswith(".lost")] == []
