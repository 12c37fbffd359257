"""Rank program of the tier tests: FSDP2 training with local, peer and persistent tiers.

``python tier_worker.py train|recover <out_dir>`` with the torchrun environment (2 or 4
ranks). The first half of the ranks is node 0, the second half node 1: each node has its
own local directory (``<out>/node<n>``), which is what makes them different nodes.

``train`` runs steps 1..6 (persistent saves every 4, local every 2, kept 2, replicated),
writes the full model+optimizer after steps 4 and 6 as the uninterrupted reference, trains
step 7 and then every rank SIGKILLs itself. ``recover`` restores three times into a
freshly initialised model: from every node's local directory; after node 1's directory
is damaged (that rank fetches it from its peer); after node 1's directory
is deleted (its ranks fetch from their peers); after every local directory is deleted
(the persistent tier); then an automatic interval is agreed. Each writes the restored full state for the test to compare.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time

import torch
import torch.distributed as dist

import dist_worker as dw
from helpers import flip_byte
import shardsafe

RANK = int(os.environ["RANK"])
NODE = RANK // max(1, int(os.environ["WORLD_SIZE"]) // 2)


def manager(out: str) -> shardsafe.CheckpointManager:
    return shardsafe.CheckpointManager(
        os.path.join(out, "persistent"), save_interval_steps=4,
        local_directory=os.path.join(out, f"node{NODE}"), local_save_interval_steps=2,
        local_max_to_keep=2, local_replication=True)


def train(out: str) -> None:
    model, opt = dw.build_fsdp(0)
    state = {"app": shardsafe.ModelOptimizerState(model, opt), "step": 0}
    mgr = manager(out)
    for step in range(1, 7):
        dw.train(model, opt, step, 1)
        state["step"] = step
        mgr.save(step, state)
        if step in (4, 6):  # the steps the test restores
            dw.write_full_state(model, opt, os.path.join(out, f"ref-{step}.safetensors"))
    mgr.wait_until_finished()
    losses = dw.train(model, opt, 7, 1)
    with open(os.path.join(out, f"train-r{RANK}.json"), "w") as f:
        json.dump({"local_steps": mgr.local_steps(), "all_steps": mgr.all_steps(), "loss7": losses}, f)
    dist.barrier()
    os.kill(os.getpid(), signal.SIGKILL)  # the whole job crashes: nothing is closed


def recover_once(out: str, case: str) -> dict:
    model, opt = dw.build_fsdp(1234)  # another init: the restore must overwrite everything
    state = {"app": shardsafe.ModelOptimizerState(model, opt), "step": 0}
    with manager(out) as mgr:
        step = mgr.restore(state)
        info = mgr.last_restore
        dw.write_full_state(model, opt, os.path.join(out, f"got-{case}.safetensors"))
        loss = dw.train(model, opt, 7, 1) if step == 6 else None
        local = mgr.local_steps()
    return {"step": step, "state_step": state["step"], "tier": info.tier, "loss7": loss,
            "local_steps": local}


def wipe(out: str, nodes: list[int]) -> None:
    dist.barrier()
    if RANK == 0:
        for n in nodes:
            shutil.rmtree(os.path.join(out, f"node{n}"))
    dist.barrier()


def damage(out: str) -> None:
    """Flips a byte in the data file of rank 1's local step 6."""
    dist.barrier()
    if RANK == 1:
        step = os.path.join(out, f"node{NODE}", "rank_1", "step_00000006")
        flip_byte(max((os.path.join(step, n) for n in os.listdir(step)), key=os.path.getsize), -3)
    dist.barrier()


def auto_interval(out: str) -> dict:
    """``save_interval_steps="auto"`` with rank-dependent step times: one agreed interval."""
    state = {"w": torch.zeros(1024)}
    with shardsafe.CheckpointManager(os.path.join(out, "auto"), save_interval_steps="auto",
                                     expected_mtbf_seconds=100.0) as mgr:
        for step in range(4):
            time.sleep(0.01 * (RANK + 1))  # the last rank's steps are WORLD times slower than rank 0's
            mgr.save(step, state)
        mgr.wait_until_finished()
        return {"interval": mgr.current_interval_steps, "steps": mgr.all_steps()}


def recover(out: str) -> None:
    res = {"local": recover_once(out, "local")}
    damage(out)  # rank 1's copy fails its checksum: rank 1 alone takes its peer copy
    res["damaged"] = recover_once(out, "damaged")
    wipe(out, [1])  # node 1 is lost: its ranks fetch their copies from node 0
    res["peer"] = recover_once(out, "peer")
    wipe(out, [0, 1])
    res["persistent"] = recover_once(out, "persistent")
    res["auto"] = auto_interval(out)
    with open(os.path.join(out, f"recover-r{RANK}.json"), "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    mode, out_dir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    dw.WORLD, dw.RANK = dist.get_world_size(), RANK
    {"train": train, "recover": recover}[mode](out_dir)
    dist.barrier()
    dist.destroy_process_group()
