"""Train a small FSDP2 model under torchrun, checkpointed with shardsafe.

    torchrun --nproc_per_node=2 examples/fsdp_torchrun.py --dir /tmp/fsdp-ckpt --steps 200

Run it again with the same ``--dir`` (with any number of processes) and it resumes from
the newest committed checkpoint. Each rank writes its own shard; rank 0 commits once all
are on disk. SIGTERM (what schedulers send before preemption) makes every rank save the
current step and exit cleanly.
"""

from __future__ import annotations

import argparse
import signal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import shardsafe


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True, help="checkpoint directory (shared by all ranks)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=50, help="checkpoint every N steps")
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))

    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 10)).to(device)
    for layer in (model[0], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + rank)  # each rank draws its own data and dropout masks

    state = {
        "app": shardsafe.ModelOptimizerState(model, optimizer),  # sharded: each shard saved once
        # every rank's own generators; on more ranks than saved, new ranks keep their seed
        "rng": shardsafe.PerRank(shardsafe.RNGState(), missing="keep"),
        "step": 0,
    }
    with shardsafe.CheckpointManager(args.dir, save_interval_steps=args.every, max_to_keep=3,
                                     preemption_signals=(signal.SIGTERM,)) as mgr:
        resumed = mgr.restore(state)  # collective; None on the first run
        if rank == 0:
            print(f"starting at step {state['step']} (restored: {resumed})", flush=True)
        for step in range(state["step"] + 1, args.steps + 1):
            x = torch.randn(32, 64, device=device)
            y = torch.randint(0, 10, (32,), device=device)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            state["step"] = step
            mgr.save(step, state, metrics={"loss": loss.item()})  # async: returns after staging
            if mgr.reached_preemption(step):
                break
        mgr.wait_until_finished()  # the last save is committed (and old ones retired)
        if rank == 0:
            print(f"stopped at step {state['step']}, checkpoints: {mgr.all_steps()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
