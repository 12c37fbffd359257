"""Rank program of the elastic-resume and many-rank tests (launched by dist_harness.run_ranks).

``python elastic_worker.py <name:world:port,...> <out_dir>`` with RANK and MASTER_ADDR
set; each phase forms a fresh gloo group of ``world`` ranks (the others sit it out) and
writes its JSON result to ``<out_dir>/<name>-w<world>-r<rank>.json``.

* ``save`` (8 ranks): an FSDP2 model with AdamW trained 3 steps, saved; and a 2-D
  ``(dp, tp)`` model (tensor parallel on "tp", FSDP2 on "dp") trained 2 steps, saved.
  Rank 0 writes the full tensors of both (the references).
* ``load`` (any world): both checkpoints into a 1-D FSDP2 model of this world; rank 0
  writes the full tensors it got.
* ``many`` and ``many_load``: ``dist_worker``'s scenarios, here on 16 ranks and on 8 and 24.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.nn.functional as F
import dist_worker
from shardsafe.harness.processes import phases
from dist_worker import flat_tensors
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import shardsafe
from shardsafe.engine.save import plan_exchange

RANK = int(os.environ.get("RANK", "0"))
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    # 40 and 13 rows shard unevenly over 3, 5, 6, 8 and 12 ranks
    return nn.Sequential(nn.Linear(16, 40), nn.ReLU(), nn.Linear(40, 13))


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for step in range(steps):
        g = torch.Generator().manual_seed(100 + step)  # the same batch on every rank
        x, y = torch.randn(4, 16, generator=g), torch.randn(4, 13, generator=g)
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def _fsdp(model: nn.Module, mesh: Any) -> nn.Module:
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _reference(model: nn.Module, opt: torch.optim.Optimizer, path: str) -> None:
    msd, osd = get_state_dict(model, opt, options=FULL)
    if RANK == 0:
        save_file(flat_tensors({"model": msd, "optim": osd}), path)


def s_save(out: str, world: int) -> dict[str, Any]:
    model = _fsdp(_model(0), init_device_mesh("cpu", (world,)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    _train(model, opt, 3)
    shardsafe.save({"app": shardsafe.ModelOptimizerState(model, opt), "step": 3}, os.path.join(out, "fsdp"))
    _reference(model, opt, os.path.join(out, "fsdp-ref.safetensors"))
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    tp = _model(1)
    parallelize_module(tp, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    tp = _fsdp(tp, mesh["dp"])
    opt2 = torch.optim.AdamW(tp.parameters(), lr=1e-2)
    _train(tp, opt2, 2)
    shardsafe.save({"app": shardsafe.ModelOptimizerState(tp, opt2), "step": 2}, os.path.join(out, "dptp"))
    _reference(tp, opt2, os.path.join(out, "dptp-ref.safetensors"))
    return {"plan_bytes": plan_exchange.STATS.last}


def s_load(out: str, world: int) -> dict[str, Any]:
    res = {}
    for name in ("fsdp", "dptp"):
        model = _fsdp(_model(1234), init_device_mesh("cpu", (world,)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _train(model, opt, 1)  # optimizer state exists: the load must overwrite it all
        state = {"app": shardsafe.ModelOptimizerState(model, opt), "step": 0}
        shardsafe.load(os.path.join(out, name), state)
        res[name] = state["step"]
        _reference(model, opt, os.path.join(out, f"{name}-loaded-{world}.safetensors"))
    return res


def s_many(out: str, world: int) -> dict[str, Any]:
    dist_worker.WORLD = world
    return dist_worker.s_many(out)


def s_many_load(out: str, world: int) -> dict[str, Any]:
    dist_worker.WORLD = world
    return dist_worker.s_many_load(out)


SCENARIOS = {"save": s_save, "load": s_load, "many": s_many, "many_load": s_many_load}


def main() -> None:
    spec, out = sys.argv[1], sys.argv[2]
    for name, world in phases(spec, RANK):
        result = SCENARIOS[name](out, world)
        with open(os.path.join(out, f"{name}-w{world}-r{RANK}.json"), "w") as f:
            json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
