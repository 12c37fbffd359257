"""save/async_save(..., collective=False) under a real 2-process gloo group: rank 0 alone
writes a complete checkpoint while rank 1 makes no call at all (Lightning's rank-0 saves)."""

from __future__ import annotations

import json
import os

import torch

from dist_harness import run_script

import shardsafe


def test_rank0_saves_alone_and_the_result_loads_in_a_plain_process(tmp_path) -> None:  # noqa: ANN001
    run_script("rank0_save_worker.py", 2, str(tmp_path))
    for rank in range(2):
        with open(tmp_path / f"r{rank}.json") as f:
            assert json.load(f) == {"rank": rank, "loaded_rank": 0, "world": 2}
    torch.manual_seed(0)
    expected = torch.nn.Linear(8, 4).state_dict()
    for name in ("sync", "async"):
        path = str(tmp_path / name)
        # one data file, an index of world size 1: a complete checkpoint of rank 0's state
        assert shardsafe.load(path)["tag"] == "rank-0"
        got = shardsafe.load(path)
        assert got["rank"] == 0
        for k, v in expected.items():
            assert torch.equal(got["model"][k], v), (name, k)
        files = sorted(n for n in os.listdir(path) if n != "index.json")
        assert len(files) == 1, files
