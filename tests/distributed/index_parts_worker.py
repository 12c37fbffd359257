"""Rank program of tests/distributed/test_dist_index_parts.py: an FSDP2 job saves through a
CheckpointManager on a counting storage, restores on the same ranks and on 3/4 of them.

``python index_parts_worker.py <out_dir> <world> <second port>`` with RANK, MASTER_ADDR and
MASTER_PORT set (``world`` processes). Phase 1 forms a gloo group of all ranks whose c10d
store records the size of every value set through it; the manager starts (its LIST
requests counted), saves step 1, a second manager restores it into a freshly initialised
model; a checkpoint with 2 MB of metadata is saved and loaded too (an index head far
above the store's 1 MB limit), then loaded again with its index rewritten in version 3
(which travels whole). Phase 2 forms a group of the first 3/4 of the ranks and
restores step 1 onto them. Each rank writes ``<out_dir>/r<rank>.json``: per phase its
LIST requests at start-up and restore, the index bytes it read and received, the parts it
read, whether it restored exactly, and the largest store value it set.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import sys
from typing import Any

import counting_fs
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import shardsafe
from shardsafe.engine.load import index_exchange
from shardsafe.format.index.versions import decode_index, encode_index

RANK = int(os.environ["RANK"])
MB = 1_000_000


class MeasuredStore:
    """A c10d store handle that records the largest value set through it.

    shardsafe's store channels are built on ``torch.distributed.PrefixStore(...)`` over the
    job's store (``comm.torch_comm``); ``dist.PrefixStore`` is replaced by this wrapper, so
    every value shardsafe sets in the c10d store is measured. (A store written in Python
    cannot sit under a C++ ``PrefixStore``: torch does not forward ``delete_key`` to it.)
    """

    def __init__(self, prefix: str, store: Any, inner: Any = None) -> None:
        self.inner = inner if inner is not None else REAL_PREFIX_STORE(prefix, store)

    def set(self, key: str, value: Any) -> None:
        BIGGEST[0] = max(BIGGEST[0], len(value))
        self.inner.set(key, value)

    def clone(self) -> MeasuredStore:
        return MeasuredStore("", None, self.inner.clone())

    def __getattr__(self, name: str) -> Any:  # get, check, wait, multi_get, delete_key, ...
        return getattr(self.inner, name)


BIGGEST = [0]
REAL_PREFIX_STORE = dist.PrefixStore
dist.PrefixStore = MeasuredStore  # type: ignore[misc,assignment]


def group(world: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=RANK, world_size=world,
                            timeout=datetime.timedelta(seconds=120))


def build(world: int, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 16))
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    g = torch.Generator().manual_seed(RANK)
    F.mse_loss(model(torch.randn(4, 16, generator=g)), torch.randn(4, 16, generator=g)).backward()
    opt.step()
    opt.zero_grad()


def full(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every tensor of the model and optimizer state, unsharded (collective)."""
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    out = {}
    for prefix, sd in (("model", msd), ("optim", osd)):
        stack = [(prefix, sd)]
        while stack:
            name, v = stack.pop()
            if isinstance(v, dict):
                stack.extend((f"{name}.{k}", x) for k, x in v.items())
            elif isinstance(v, torch.Tensor):
                out[name] = v.detach().clone()
    return out


def counted(fn: Any) -> dict[str, Any]:
    """The requests ``fn()`` makes of the counting storage on this rank (``gets``: by file)."""
    counting_fs.reset()
    fn()
    return {**counting_fs.COUNTS, "gets": dict(counting_fs.GETS)}


def restore(url: str, world: int, reference: dict[str, torch.Tensor]) -> dict[str, Any]:
    model, opt = build(world, seed=1234)  # another initialisation: the restore must replace it
    state = {"app": shardsafe.ModelOptimizerState(model, opt), "step": 0}
    box: dict[str, Any] = {}
    startup = counted(lambda: box.setdefault("m", shardsafe.CheckpointManager(url, async_save=False)))
    got = counted(lambda: box.setdefault("step", box["m"].restore(state)))
    box["m"].close()
    stats = index_exchange.STATS
    mine = full(model, opt)
    return {"startup": startup, "restore": got, "step": box["step"], "read": stats.read, "received": stats.received,
            "index_requests": stats.requests, "parts": stats.parts,
            "equal": sorted(mine) == sorted(reference) and all(torch.equal(mine[k], reference[k]) for k in mine)}


def main() -> None:
    out_dir, world, port2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    url = counting_fs.url(os.path.join(out_dir, "run"))
    res: dict[str, Any] = {}
    group(world, int(os.environ["MASTER_PORT"]))
    model, opt = build(world, seed=0)
    train(model, opt)
    box: dict[str, Any] = {}
    res["startup"] = counted(lambda: box.setdefault("m", shardsafe.CheckpointManager(url, async_save=False)))
    box["m"].save(1, {"app": shardsafe.ModelOptimizerState(model, opt), "step": 1}, force=True)
    box["m"].close()
    reference = full(model, opt)
    res["same"] = restore(url, world, reference)
    blob = base64.b64encode(os.urandom(1_500_000)).decode()  # 2 MB of metadata, ~1.5 MB compressed
    x = torch.arange(world * 4, dtype=torch.float32)
    big = os.path.join(out_dir, "big")
    shardsafe.save({"x": x}, big, metadata={"blob": blob})
    y = {"x": torch.zeros_like(x)}
    shardsafe.load(big, y)
    res["big"] = {"received": index_exchange.STATS.received, "read": index_exchange.STATS.read,
                  "equal": bool(torch.equal(y["x"], x))}
    if RANK == 0:  # the same checkpoint with its index in version 3: broadcast whole
        with open(os.path.join(big, "index.json"), "rb") as f:
            v3 = encode_index(decode_index(f.read()), version=3)
        with open(os.path.join(big, "index.v3"), "wb") as f:
            f.write(v3)
        os.replace(os.path.join(big, "index.v3"), os.path.join(big, "index.json"))
    dist.barrier()
    y = {"x": torch.zeros_like(x)}
    shardsafe.load(big, y)
    res["big_v3"] = {"received": index_exchange.STATS.received, "read": index_exchange.STATS.read,
                     "size": os.path.getsize(os.path.join(big, "index.json")), "equal": bool(torch.equal(y["x"], x))}
    dist.destroy_process_group()
    smaller = world * 3 // 4
    if RANK < smaller:
        group(smaller, port2)
        res["reshard"] = restore(url, smaller, reference)
        dist.destroy_process_group()
    res["store_max"] = BIGGEST[0]
    with open(os.path.join(out_dir, f"r{RANK}.json"), "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
