"""One rank of a gloo job saving to S3 through the fault proxy (tests/fault_proxy.py).

Usage: ``faults_worker.py OUT URL OPTIONS_JSON TIMEOUT`` with RANK, WORLD_SIZE, MASTER_ADDR
and MASTER_PORT set. Every rank saves a committed checkpoint ``URL/good``, then tries to
save ``URL/bad`` with ``timeout=TIMEOUT`` while the proxy stalls one rank's uploads of
it; each rank writes what it raised and when to ``OUT/r<rank>.json``, after loading
``URL/good`` again (the failed save must not have disturbed it).
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


def state(rank: int) -> dict:
    return {"mine": shardsafe.PerRank({"w": torch.full((1 << 18,), float(rank))}),
            "shared": torch.arange(4096.0), "step": 7}


def main(out: str, url: str, options: str, timeout: float) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    opts = json.loads(options)
    shardsafe.save(state(rank), f"{url}/good", storage_options=opts, timeout=120)
    t0 = time.monotonic()
    result: dict = {"rank": rank, "error": None}
    try:
        shardsafe.save(state(rank), f"{url}/bad", storage_options=opts, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - recorded for the test to judge
        result.update(error=type(e).__name__, message=str(e),
                      checkpoint_error=isinstance(e, shardsafe.CheckpointError))
    result["elapsed"] = time.monotonic() - t0
    target = {"mine": shardsafe.PerRank({"w": torch.zeros(1 << 18)}), "shared": torch.zeros(4096), "step": 0}
    shardsafe.load(f"{url}/good", target, storage_options=opts, timeout=120)
    result["good"] = bool(torch.equal(target["mine"].value["w"], state(rank)["mine"].value["w"])
                          and torch.equal(target["shared"], torch.arange(4096.0)) and target["step"] == 7)
    with open(os.path.join(out, f"r{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
