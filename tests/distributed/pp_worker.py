"""Rank program of the pipeline-parallel test: 2 stages x 2 FSDP ranks save, others load.

``pp_worker.py <name:world:port,...> <out_dir>`` with RANK and MASTER_ADDR set; like
dist_worker.py, each phase forms a fresh gloo group (ranks beyond its world sit it out).

* ``save`` (4 ranks): a 2-D mesh ("pp", "dp"); stage s = rank // 2 owns layers 2s and
  2s+1, fully_shard on the "dp" sub-mesh, Adam, one step; saves the torchtitan-style
  state (flattened optimizer state dict): every rank holds only its stage's keys.
  Each stage's dp rank 0 writes the full tensors of its stage (the reference).
* ``load`` (2 or 3 ranks): all four layers with FSDP over the whole world, loads, and
  rank 0 writes the full tensors it got.
"""

from __future__ import annotations

import os
import sys

import torch
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import shardsafe
from dist_worker import flat_tensors
from shardsafe.harness.processes import phases

RANK = int(os.environ.get("RANK", "0"))
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
FULL = StateDictOptions(flatten_optimizer_state_dict=True, full_state_dict=True, cpu_offload=True)


def build(layers: list[int], mesh: object, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Module()
    model.layers = nn.ModuleDict({str(i): nn.Linear(6, 6) for i in range(4)})
    for i in range(4):
        if i not in layers:
            del model.layers[str(i)]
    for i in layers:
        fully_shard(model.layers[str(i)], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(seed + 1))
    for i in layers:  # one step: every parameter gets Adam state
        x = model.layers[str(i)](x)
    x.square().sum().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def s_save(out: str) -> None:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    stage = RANK // 2
    model, opt = build([2 * stage, 2 * stage + 1], mesh["dp"], 0)
    msd, osd = get_state_dict(model, opt, options=FLAT)
    shardsafe.save({"model": msd, "optim": osd, "step": 1}, os.path.join(out, "pp"), timeout=60)
    # full tensors of this stage (a collective of the dp sub-mesh)
    full = {k: v.full_tensor() if isinstance(v, DTensor) else v
            for k, v in flat_tensors({"model": msd, "optim": osd}).items()}
    if RANK % 2 == 0:
        save_file(full, os.path.join(out, f"ref-{stage}.safetensors"))


def s_load(out: str, world: int) -> None:
    mesh = init_device_mesh("cpu", (world,))
    model, opt = build([0, 1, 2, 3], mesh, 99)
    msd, osd = get_state_dict(model, opt, options=FLAT)
    state = {"model": msd, "optim": osd, "step": 0}
    shardsafe.load(os.path.join(out, "pp"), state, timeout=60)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=FLAT)
    fm, fo = get_state_dict(model, opt, options=FULL)
    if RANK == 0:
        save_file(flat_tensors({"model": fm, "optim": fo}), os.path.join(out, f"loaded-{world}.safetensors"))


def main() -> None:
    spec, out = sys.argv[1], sys.argv[2]
    for name, world in phases(spec, RANK):
        if name == "save":
            s_save(out)
        else:
            s_load(out, world)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
