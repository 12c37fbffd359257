"""One rank of a 2-process gloo job in which rank 0 alone saves, with collective=False.

Usage: ``rank0_save_worker.py OUT_DIR`` with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
set. Rank 1 makes no shardsafe call while rank 0 saves: a save that talked to the other
ranks would wait for it until the job's timeout. Afterwards both meet at a barrier and
rank 1 loads what rank 0 wrote, on its own.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import shardsafe


def state(rank: int) -> dict:
    torch.manual_seed(rank)
    return {"model": torch.nn.Linear(8, 4).state_dict(), "rank": rank, "tag": f"rank-{rank}"}


def main(out: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    if rank == 0:
        shardsafe.save(state(0), os.path.join(out, "sync"), collective=False, timeout=10)
        h = shardsafe.async_save(state(0), os.path.join(out, "async"), collective=False, timeout=10)
        h.result(timeout=30)
    dist.barrier()  # only now does rank 1 take part in anything
    got = shardsafe.load(os.path.join(out, "sync"), collective=False)
    with open(os.path.join(out, f"r{rank}.json"), "w") as f:
        json.dump({"rank": rank, "loaded_rank": got["rank"], "world": dist.get_world_size()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
