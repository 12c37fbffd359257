"""A rank SIGKILLed while writing its file: no commit, bounded errors, old checkpoint intact."""

from __future__ import annotations

import os

import torch
from dist_harness import run_ranks

import shardsafe

TIMEOUT = 4.0


def test_rank_killed_mid_save_leaves_previous_checkpoint(tmp_path) -> None:  # noqa: ANN001
    out = str(tmp_path)
    results = run_ranks(3, [("kill", 3)], out, killed=[2], timeout=180,
                        env={"T": str(TIMEOUT)})[("kill", 3)]
    assert results[2] is None  # SIGKILLed by itself as soon as its data file appeared
    for rank in (0, 1):
        r = results[rank]
        assert r["error"] in ("CheckpointTimeoutError", "CheckpointError"), r
        assert r["elapsed"] < TIMEOUT + 5, r  # bounded: no hang
    # rank 0 saw rank 2 missing and told rank 1 so (rank 1 did not need its own timeout)
    assert "rank(s) 2 of 3" in results[0]["message"]
    assert "rank(s) 2 of 3" in results[1]["message"] or results[1]["error"] == "CheckpointTimeoutError"
    # the previous checkpoint is still the committed one, and no working directory is left
    state = shardsafe.load(os.path.join(out, "ckpt"))
    assert state["version"] == 1 and torch.count_nonzero(state["x"]) == 0
    assert state["x"].shape == (3 * 1024, 4096)
    assert [n for n in os.listdir(out) if n.startswith(".ckpt")] == []
