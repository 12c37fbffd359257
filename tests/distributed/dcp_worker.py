"""Rank program of tests/distributed/test_dist_dcp.py: DCP saving and loading through
shardsafe.dcp's Writer and Reader in real gloo groups (launched by dist_harness.run_ranks).

``dcp_worker.py <name:world:port,...> <out_dir>``. Phases:

- ``save`` (2 ranks): FSDP2 + AdamW trained 3 steps, ``get_state_dict`` saved with
  ``dcp.save`` (and with ``shardsafe.save``, for Reader); one more step, then
  ``dcp.async_save`` with compression. Each checkpoint's full state is written as a
  safetensors reference.
- ``load`` (3 ranks): each checkpoint loaded with ``dcp.load`` into a fresh FSDP2 model
  of 3 ranks, its full state written out; the DCP checkpoint also loaded in place with
  ``shardsafe.load`` (resharded); a copy with one flipped byte loaded with ``dcp.load``.
- ``kill`` (2 ranks): rank 1 SIGKILLs itself as soon as its data file appears; rank 0
  reports what ``dcp.save`` raised and whether anything was committed.

Each phase writes ``<name>-w<world>-r<rank>.json`` (``dist_worker.main`` runs the phases).
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import dist_worker
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from dist_worker import build_fsdp, kill_when_writing, train, write_full_state
from helpers import flip_byte
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import shardsafe
from shardsafe.dcp import Reader, Writer
from shardsafe.engine.commit import is_committed
from shardsafe.storage.local import LocalStorage

RANK = int(os.environ["RANK"])


def s_save(out: str) -> dict[str, Any]:
    model, opt = build_fsdp(0)
    train(model, opt, 0, 3)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd, "step": 3}, storage_writer=Writer(os.path.join(out, "sync")))
    shardsafe.save({"model": msd, "optim": osd, "step": 3}, os.path.join(out, "native"))
    write_full_state(model, opt, os.path.join(out, "sync-ref.safetensors"))
    train(model, opt, 3, 1)
    msd, osd = get_state_dict(model, opt)
    # DCP's background thread talks over a group of its own, never the one training uses
    group = dist.new_group(backend="gloo")
    future = dcp.async_save({"model": msd, "optim": osd, "step": 4}, process_group=group,
                            storage_writer=Writer(os.path.join(out, "async"), compression="zstd"))
    train(model, opt, 4, 1)  # training goes on while the checkpoint is written
    future.result()
    model2, opt2 = build_fsdp(0)  # the async checkpoint holds step 4, not the step trained since
    train(model2, opt2, 0, 4)
    write_full_state(model2, opt2, os.path.join(out, "async-ref.safetensors"))
    return {}


def _dcp_load(path: str, out_name: str) -> int:
    """``dcp.load`` of ``path`` into a fresh FSDP2 model of this world; writes its full state."""
    model, opt = build_fsdp(1)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "step": 0}
    dcp.load(state, storage_reader=Reader(path))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    write_full_state(model, opt, out_name)
    return state["step"]


def s_load(out: str) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for name in ("sync", "async", "native"):
        res[name] = _dcp_load(os.path.join(out, name), os.path.join(out, f"{name}-loaded.safetensors"))
    model, opt = build_fsdp(2)  # shardsafe.load in place: the tensors, resharded to 3 ranks
    msd, _ = get_state_dict(model, opt)
    loaded = shardsafe.load(os.path.join(out, "sync"), {"model": msd}, strict=False)
    set_model_state_dict(model, msd)
    res["in_place_unexpected"] = len(loaded.unexpected)
    write_full_state(model, opt, os.path.join(out, "in-place-loaded.safetensors"))
    damaged = os.path.join(out, "damaged")
    if RANK == 0:
        shutil.copytree(os.path.join(out, "sync"), damaged)
        flip_byte(os.path.join(damaged, "data-r00001-000.safetensors"), -3)  # tensor data
    dist.barrier()
    try:
        _dcp_load(damaged, os.path.join(out, "damaged-loaded.safetensors"))
        res["damaged"] = None
    except CheckpointException as e:
        res["damaged"] = {r: f"{type(exc).__name__}: {exc}" for r, (exc, _) in e.failures.items()}
    return res


def s_kill(out: str) -> dict[str, Any]:
    path = os.path.join(out, "killed")
    mesh = init_device_mesh("cpu", (2,))
    big = distribute_tensor(torch.ones(2 * 1024, 4096), mesh, [Shard(0)])  # 16 MiB per rank
    if RANK == 1:  # SIGKILL as soon as our data file appears
        kill_when_writing(out, ".killed.", "data-r00001-000.safetensors")
    t0 = time.monotonic()
    try:
        dcp.save({"x": big, "step": 1}, storage_writer=Writer(path))
        error = None
    except (CheckpointException, RuntimeError) as e:  # DCP's, or gloo's when the peer is gone
        error = type(e).__name__
    return {"error": error, "committed": is_committed(LocalStorage(), path),
            "elapsed": time.monotonic() - t0}


SCENARIOS = {"save": s_save, "load": s_load, "kill": s_kill}


if __name__ == "__main__":
    dist_worker.main(SCENARIOS)  # its phases loop (dist_worker.WORLD: build_fsdp's world)
