"""One rank of a 2-process gloo job: a CheckpointManager whose ranks stop taking part.

Usage: ``manager_bounded_worker.py OUT_DIR`` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set. Both ranks build a manager with ``timeout=TIMEOUT``, a local tier per
rank (two nodes) replicated to the other rank, and save step 0 on both tiers, counting
the bytes copied out of the state (each rank writes part of the replicated state to the
persistent tier and its local step holds all of it: still one copy). Then:

1. rank 1's state holds a value that cannot be saved: its ``save(1)`` raises TypeError
   before anything of step 1 is written; rank 0 learns it at once, from the planning
   and from the peer round (rank 1's notice), not after a timeout;
2. rank 1 never calls ``restore``: rank 0's restore raises CheckpointTimeoutError naming
   rank 1 within the timeout;
3. rank 1 never calls ``save(2)``: rank 0's save raises CheckpointTimeoutError naming
   rank 1, and its local tier's peer copy of step 2 times out naming rank 1 and step 2;
   nothing is committed for step 2.

Each rank writes what it saw to ``OUT_DIR/r<rank>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import shardsafe
from shardsafe.engine.save import feeds
from shardsafe.engine.save.units import HEADER

TIMEOUT = 3.0


def timed(call: Callable[[], object]) -> dict:
    t0 = time.monotonic()
    try:
        call()
    except Exception as e:  # noqa: BLE001 - recorded for the test to check
        return {"error": type(e).__name__, "message": str(e), "s": time.monotonic() - t0}
    return {"error": None, "s": time.monotonic() - t0}


def count_copies() -> list[int]:
    """Counts the tensor bytes copied out of the state (where every save path copies them)."""
    count = [0]
    orig = feeds.copy_unit

    def spy(units, k, sources, out, base=0):  # noqa: ANN001, ANN202
        parts = units.parts(k)
        count[0] += sum(n for i, n in zip(parts.item, parts.length) if i != HEADER and sources.addr[i])
        return orig(units, k, sources, out, base)

    feeds.copy_unit = spy
    return count


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    state = {"w": [torch.arange(4096.0) * i for i in range(1, 5)], "step": 0}  # the same on both ranks
    mgr = shardsafe.CheckpointManager(os.path.join(out, "persistent"), timeout=TIMEOUT,
                                      local_directory=os.path.join(out, f"node{rank}"),
                                      local_replication=True)
    copied = count_copies()
    res: dict = {"save0": timed(lambda: (mgr.save(0, state), mgr.wait_until_finished()))}
    res["copied0"], res["state_bytes"] = copied[0], sum(t.numel() * 4 for t in state["w"])
    res["local_files"] = sorted(os.listdir(os.path.join(out, f"node{rank}", f"rank_{rank}", "step_00000000")))
    bad = dict(state, oops=object()) if rank == 1 else state
    res["fail1"] = timed(lambda: mgr.save(1, bad))
    res["fail1_wait"] = timed(mgr.wait_until_finished)
    dist.barrier()
    if rank == 0:
        res["restore"] = timed(lambda: mgr.restore(dict(state)))
        res["save2"] = timed(lambda: mgr.save(2, state))
        res["save2_wait"] = timed(mgr.wait_until_finished)
    else:  # alive but silent until rank 0 is done (a dead rank would fail it sooner)
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(out, "r0.json")) and time.monotonic() < deadline:
            time.sleep(0.1)
    res["steps"] = mgr.all_steps()
    with open(os.path.join(out, f"r{rank}.json.tmp"), "w") as f:
        json.dump(res, f)
    os.rename(os.path.join(out, f"r{rank}.json.tmp"), os.path.join(out, f"r{rank}.json"))
    os._exit(0)  # the group is out of step after the timeouts: nothing more to tear down


if __name__ == "__main__":
    main(sys.argv[1])
