"""The coordinator's coverage check on real gloo groups: a lost share never commits;
entries too large for the store reach the coordinator through the working directory.

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


def test_entries_too_large_for_the_store_travel_as_files(cluster) -> None:  # noqa: ANN001
    out, results = cluster[0], cluster[1][("entries_in_files", 3)]
    for rank, r in enumerate(results):
        assert r is not None and r["equal"], r
        assert r["sent"] == ([] if rank == 0 else ["F"]), r  # rank 0 keeps its own entries
        assert not [n for n in r["files"] if n.startswith("entries-")], r["files"]
    assert not [n for n in os.listdir(os.path.join(out, "entries_in_files")) if n.startswith("entries-")]
