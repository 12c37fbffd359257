"""One rank of a 2-process gloo job: bounded collectives and cached planning.

Usage: ``bounded_worker.py OUT_DIR`` with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set.

Part 1: rank 0 saves and loads collectively while rank 1 makes no call; rank 0 must
raise CheckpointTimeoutError naming rank 1 within the timeout. Part 2 (a fresh group,
whose collectives are counted from one): both ranks save three times (same layout
twice, then a changed one, then a changed
plain value) and record the planning bytes of each save.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import shardsafe
from shardsafe.engine.save import plan_exchange

TIMEOUT = 3.0


def _timed(call) -> dict:  # noqa: ANN001
    t0 = time.monotonic()
    try:
        call()
    except shardsafe.CheckpointTimeoutError as e:
        return {"error": "CheckpointTimeoutError", "message": str(e), "s": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001 - recorded for the test to show
        return {"error": type(e).__name__, "message": str(e), "s": time.monotonic() - t0}
    return {"error": None, "s": time.monotonic() - t0}


def part1(out: str, rank: int) -> dict:
    if rank != 0:
        return {}
    state = {"w": torch.arange(8.0)}
    shardsafe.save(state, os.path.join(out, "alone"), collective=False)
    save = _timed(lambda: shardsafe.save(state, os.path.join(out, "never"), timeout=TIMEOUT))
    load = _timed(lambda: shardsafe.load(os.path.join(out, "alone"), timeout=TIMEOUT))
    return {"save": save, "load": load, "never_exists": os.path.exists(os.path.join(out, "never"))}


def part2(out: str, rank: int) -> list[dict]:
    group = dist.new_group([0, 1])
    torch.manual_seed(0)
    state = {"w": torch.randn(64, 64), "rank_only": shardsafe.PerRank({"r": rank})}
    rows = []
    for i, (extra, step) in enumerate([(False, 1), (False, 1), (True, 1), (True, 2)]):
        if extra:
            state["b"] = torch.ones(3)
        state["step"] = step  # the last save changes a plain value only: trees, not the plan
        state["w"].add_(1.0)
        shardsafe.save(state, os.path.join(out, f"s{i}"), process_group=group, timeout=30)
        rows.append({"bytes": plan_exchange.STATS.last, "full": plan_exchange.STATS.full})
        got = shardsafe.load(os.path.join(out, f"s{i}"), collective=False)
        assert torch.equal(got["w"], state["w"]) and got["step"] == step, i
    return rows


def main(out: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    result = {"part1": part1(out, rank)}
    dist.barrier()
    result["part2"] = part2(out, rank)
    with open(os.path.join(out, f"r{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
