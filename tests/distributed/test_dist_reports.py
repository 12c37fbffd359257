"""Columnar rank reports with real gloo processes: 4 ranks with different trees (stage
keys), DTensors on 1-D and 2-D meshes (shared boxes), plain tensors and PerRank values
save their union and load on 3 ranks; a second save with new PerRank values exchanges
the values only (see dist_worker.s_many; 16 ranks in test_dist_elastic.py)."""

from __future__ import annotations

import os

import shardsafe


def test_ranks_with_different_trees_save_their_union_and_load_elsewhere(cluster) -> None:  # noqa: ANN001
    out, results = cluster
    for r in results[("many", 4)]:
        assert not r["again_full"] and r["again"] < r["first"], r
    for rank, r in enumerate(results[("many_load", 3)]):
        assert r["equal"] == {"row": True, "col": True, "grid": True} and r["plain"], rank
        assert r["stage"] == [[float(s)] * 2 for s in range(4)]
        assert r["mine"] == [rank + 100, [float(rank)] * 3]
    whole = shardsafe.load(os.path.join(out, "many"))  # one process: every rank's entry
    assert sorted(whole["mine"], key=int) == ["0", "1", "2", "3"]
    assert [whole["mine"][str(r)]["rank"] for r in range(4)] == [100, 101, 102, 103]
    assert sorted(whole["stage"]) == ["s0", "s1", "s2", "s3"]
