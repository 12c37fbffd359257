"""Collective saves and loads are bounded by ``timeout``, and repeat saves reuse their plan
(a real 2-process gloo group; rank 1 skips the collective calls of part 1)."""

from __future__ import annotations

import json
import os

from dist_harness import run_script

TIMEOUT = 3.0  # as in bounded_worker.py
SLACK = 4.0


def _run(tmp_path) -> list[dict]:  # noqa: ANN001
    run_script("bounded_worker.py", 2, str(tmp_path))
    out = []
    for rank in range(2):
        with open(tmp_path / f"r{rank}.json") as f:
            out.append(json.load(f))
    return out


def test_missing_rank_times_out_and_repeat_saves_skip_the_plan_exchange(tmp_path) -> None:  # noqa: ANN001
    r0, r1 = _run(tmp_path)
    part1 = r0["part1"]
    for step in ("save", "load"):
        got = part1[step]
        assert got["error"] == "CheckpointTimeoutError", got
        assert "rank(s) 1 of 2" in got["message"], got
        assert TIMEOUT * 0.9 <= got["s"] <= TIMEOUT + SLACK, got
    assert not part1["never_exists"]  # nothing committed (not even a working directory)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".never") or "never" in n]
    for rows in (r0["part2"], r1["part2"]):
        assert [r["full"] for r in rows] == [True, False, True, False], rows
        # a repeat save exchanges a digest and a short answer, not the reports and plan
        assert rows[1]["bytes"] < 400, rows
        # a changed plain value sends the trees, still not the reports and plan
        assert rows[3]["bytes"] < rows[2]["bytes"], rows
        assert rows[0]["bytes"] > rows[1]["bytes"] and rows[2]["bytes"] > rows[3]["bytes"], rows
