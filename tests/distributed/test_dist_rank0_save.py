"""save/async_save(..., collective=False) under a real 2-process gloo group: rank 0 alone
writes a complete checkpoint while rank 1 makes no call at all (Lightning's rank-0 saves)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

import shardsafe
from shardsafe.comm import free_loopback_port

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")


def test_rank0_saves_alone_and_the_result_loads_in_a_plain_process(tmp_path) -> None:  # noqa: ANN001
    port = str(free_loopback_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, OMP_NUM_THREADS="1",
                   PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "rank0_save_worker.py"),
                                       str(tmp_path)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
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
