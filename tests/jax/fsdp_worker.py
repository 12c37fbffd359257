"""A rank of the JAX <-> FSDP2 test (launched by tests/dist_harness.run_script on gloo).

    python fsdp_worker.py JAX_CKPT TORCH_CKPT OUT_DIR

Loads the JAX checkpoint into an FSDP2 model (7-row and 16-row weights, sharded over
the ranks unevenly) and a DTensor sharded by columns, writes the full tensors it got to
``OUT_DIR/loaded-r<rank>.safetensors``, then doubles every value and saves the same
state collectively to TORCH_CKPT for the test to restore into JAX.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard, distribute_tensor

import shardsafe


def main() -> None:
    jax_ckpt, torch_ckpt, out = sys.argv[1:4]
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 7))
    fully_shard(model, mesh=mesh)
    cols = distribute_tensor(torch.zeros(6, 10, dtype=torch.bfloat16), mesh, [Shard(1)])
    state = {"model": model, "cols": cols, "step": 0}
    shardsafe.load(jax_ckpt, state)
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    full["cols"] = cols.full_tensor()
    save_file({k: v.contiguous() for k, v in full.items()}, os.path.join(out, f"loaded-r{dist.get_rank()}.safetensors"))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2)
        cols.mul_(2)
    shardsafe.save({"model": model, "cols": cols, "step": state["step"] + 1}, torch_ckpt)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
