"""Rank program for the distributed tests (launched by tests/dist_harness.run_ranks).

``python dist_worker.py <name:world:port,...> <out_dir> [args...]`` with RANK and
MASTER_ADDR set. Each phase forms a gloo group of ``world`` ranks on ``port`` (ranks
beyond it skip the phase), runs the scenario, and writes its JSON result to
``<out_dir>/<name>-w<world>-r<rank>.json``; reference tensors go to safetensors files.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import shardsafe
from helpers import flip_byte
from shardsafe.harness.processes import phases
from shardsafe.comm import get_comm
from shardsafe.engine.save import plan_exchange
from shardsafe.storage.local import LocalStorage

RANK = int(os.environ.get("RANK", "0"))
WORLD = 1  # of the current phase


# ----------------------------------------------------------------------------- helpers
def flat_tensors(tree: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """``{dotted.key: tensor}`` of every tensor in a nested state dict (full tensors)."""
    out: dict[str, torch.Tensor] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flat_tensors(v, f"{prefix}{k}."))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(flat_tensors(v, f"{prefix}{i}."))
    elif isinstance(tree, torch.Tensor):
        out[prefix[:-1]] = tree.detach().clone().contiguous()
    return out


def build_fsdp(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    # 32 and 7 rows shard unevenly over 3 and 4 ranks
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 7))
    mesh = init_device_mesh("cpu", (WORLD,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def train(model: nn.Module, opt: torch.optim.Optimizer, start: int, steps: int) -> list[str]:
    losses = []
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(1000 * step + RANK)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 7, generator=g)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item().hex())
    return losses


def write_full_state(model: nn.Module, opt: torch.optim.Optimizer, path: str) -> None:
    """Rank 0 writes the full (unsharded) model and optimizer tensors: the reference."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd, osd = get_state_dict(model, opt, options=opts)
    if RANK == 0:
        save_file(flat_tensors({"model": msd, "optim": osd}), path)


def mesh_tensors() -> dict[str, torch.Tensor]:
    """Full tensors of the 2-D mesh case (distinct values reveal any misplacement)."""
    return {"a": torch.arange(30, dtype=torch.float32).reshape(6, 5),
            "b": torch.arange(28, dtype=torch.float64).reshape(7, 4) * 0.5,
            "c": torch.arange(15, dtype=torch.int32).reshape(5, 3)}


def replicated_state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    sizes = [(1 + (i * 7) % 13) * 1024 for i in range(30)]
    return {"w": {f"t{i}": torch.randn(n, generator=g) for i, n in enumerate(sizes)},
            "step": 11, "note": "same on every rank"}


# ----------------------------------------------------------------------------- scenarios
def s_comm(out: str) -> dict[str, Any]:
    from shardsafe.comm.channel import gather, get
    from shardsafe.errors import CheckpointTimeoutError

    comm = get_comm()
    res: dict[str, Any] = {}
    mine = bytes([RANK]) * (RANK * 1000)  # rank 0 sends empty bytes
    got = comm.gather_bytes(mine, dst=1)
    res["gather_ok"] = got == [bytes([r]) * (r * 1000) for r in range(WORLD)] if RANK == 1 else got is None
    res["bcast"] = comm.broadcast_bytes(b"hello" * 3 if RANK == 2 else None, src=2).decode()
    res["json"] = comm.broadcast({"x": [1, 2.5, None, "s"]} if RANK == 0 else None)
    res["jgather"] = comm.gather({"r": RANK})
    comm.barrier()
    # a store channel used from a background thread while the main thread runs collectives
    ch = comm.channel("bg-test")
    box: dict[str, Any] = {}

    def background() -> None:
        box["gathered"] = gather(ch, "k", f"rank{RANK}".encode(), timeout=30)

    t = threading.Thread(target=background)
    t.start()
    total = torch.zeros(1)
    for _ in range(50):
        x = torch.ones(1)
        dist.all_reduce(x)
        total += x
    t.join()
    res["allreduce"] = float(total)
    res["bg_gather"] = [b.decode() for b in box["gathered"]] if box["gathered"] else None
    # a key nobody sets: bounded wait
    t0 = time.monotonic()
    try:
        get(ch, "never", timeout=0.5)
        res["timeout"] = "no error"
    except CheckpointTimeoutError:
        res["timeout"] = time.monotonic() - t0
    return res


def s_save(out: str) -> dict[str, Any]:
    """4 ranks: FSDP2 training + save, a 2x2 mesh save, a replicated save, a failing save."""
    res: dict[str, Any] = {}
    model, opt = build_fsdp(0)
    res["losses_before"] = train(model, opt, 0, 3)
    state = {"app": shardsafe.ModelOptimizerState(model, opt), "step": 3}
    shardsafe.save(state, os.path.join(out, "fsdp"))
    write_full_state(model, opt, os.path.join(out, "fsdp-ref.safetensors"))
    res["losses_after"] = train(model, opt, 3, 3)
    write_full_state(model, opt, os.path.join(out, "fsdp-ref-after.safetensors"))

    mesh = init_device_mesh("cpu", (2, 2))
    full = mesh_tensors()
    placements = {"a": [Replicate(), Shard(0)], "b": [Shard(0), Shard(1)], "c": [Shard(1), Replicate()]}
    dts = {k: distribute_tensor(full[k], mesh, placements[k]) for k in full}
    shardsafe.save({"m": dts, "plain": torch.arange(10), "n": 5}, os.path.join(out, "mesh2d"))

    shardsafe.save(replicated_state(), os.path.join(out, "replicated"))

    torch.manual_seed(100 + RANK)  # every rank its own generator state
    per = {"rng": shardsafe.PerRank(shardsafe.RNGState()),
           "mine": shardsafe.PerRank({"rank": RANK, "t": torch.full((3,), float(RANK))})}
    shardsafe.save(per, os.path.join(out, "perrank"))
    res["draw_after_save"] = torch.rand(4).tolist()

    bad: dict[str, Any] = {"ok": torch.ones(3)}
    if RANK == 1:
        bad["oops"] = object()  # an object cannot be saved: rank 1 raises TypeError
    try:
        shardsafe.save(bad, os.path.join(out, "bad"))
        res["bad"] = "saved"
    except (TypeError, shardsafe.CheckpointError) as e:
        res["bad"] = f"{type(e).__name__}: {e}"
    return res


def s_load(out: str) -> dict[str, Any]:
    """Any world size: load the FSDP and 2-D mesh checkpoints onto this world."""
    res: dict[str, Any] = {}
    model, opt = build_fsdp(1234)  # different init: the load must overwrite everything
    state = {"app": shardsafe.ModelOptimizerState(model, opt), "step": 0}
    shardsafe.load(os.path.join(out, "fsdp"), state)
    res["step"] = state["step"]
    write_full_state(model, opt, os.path.join(out, f"fsdp-loaded-{WORLD}.safetensors"))
    if WORLD == 4:
        res["losses_after"] = train(model, opt, 3, 3)
        write_full_state(model, opt, os.path.join(out, "fsdp-loaded-after.safetensors"))

    mesh = init_device_mesh("cpu", (WORLD,))
    full = mesh_tensors()
    placements = {"a": [Shard(1)], "b": [Shard(0)], "c": [Replicate()]}
    targets = {k: distribute_tensor(torch.zeros_like(full[k]), mesh, placements[k]) for k in full}
    tgt = {"m": targets, "plain": torch.zeros(10, dtype=torch.int64), "n": 0}
    shardsafe.load(os.path.join(out, "mesh2d"), tgt)
    res["mesh_equal"] = {k: bool(torch.equal(targets[k].full_tensor(), full[k])) for k in full}
    res["mesh_local_shapes"] = {k: list(targets[k].to_local().shape) for k in full}
    res["plain_equal"] = bool(torch.equal(tgt["plain"], torch.arange(10))) and tgt["n"] == 5
    torch.manual_seed(999)  # whatever: the load must bring back this rank's own generator
    mine: dict[str, Any] = {"rank": -1}
    shardsafe.load(os.path.join(out, "perrank"),
                   {"rng": shardsafe.PerRank(shardsafe.RNGState()), "mine": shardsafe.PerRank(mine)})
    res["draw_after_load"] = torch.rand(4).tolist()
    res["mine"] = [mine["rank"], mine["t"].tolist()]
    try:  # rank 0 finds nothing: every rank raises the same error
        shardsafe.load(os.path.join(out, "absent"), {"n": 0})
        res["absent"] = "loaded"
    except shardsafe.CheckpointNotFoundError as e:
        res["absent"] = type(e).__name__
    return res


def s_kill(out: str) -> dict[str, Any]:
    """A good save, then a save during which rank 2 is SIGKILLed while writing its file."""
    res: dict[str, Any] = {}
    path = os.path.join(out, "ckpt")
    mesh = init_device_mesh("cpu", (WORLD,))
    big = distribute_tensor(torch.zeros(WORLD * 1024, 4096), mesh, [Shard(0)])  # 16 MiB per rank
    shardsafe.save({"x": big, "version": 1}, path)
    big.to_local().fill_(2.0)
    if RANK == 2:
        kill_when_writing(os.path.dirname(path), ".ckpt.", "data-r00002-000.safetensors")
    t0 = time.monotonic()
    try:
        shardsafe.save({"x": big, "version": 2}, path, overwrite=True, timeout=float(os.environ["T"]))
        res["error"] = None
    except shardsafe.CheckpointError as e:
        res["error"] = type(e).__name__
        res["message"] = str(e)
    res["elapsed"] = time.monotonic() - t0
    return res


def kill_when_writing(parent: str, prefix: str, name: str) -> None:
    """SIGKILLs this process as soon as a working directory ``<parent>/<prefix>*`` holds the
    data file ``name`` (a watcher thread polls for it)."""

    def watch() -> None:
        while True:
            for d in os.listdir(parent):
                if d.startswith(prefix) and os.path.exists(os.path.join(parent, d, name)):
                    os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.0002)

    threading.Thread(target=watch, daemon=True).start()


def s_async(out: str) -> dict[str, Any]:
    """FSDP2 training whose collectives keep running while async saves commit."""
    model, opt = build_fsdp(0)
    mesh = init_device_mesh("cpu", (WORLD,))
    payload = distribute_tensor(torch.zeros(WORLD * 512, 4096), mesh, [Shard(0)])  # 8 MiB/rank
    state = {"app": shardsafe.ModelOptimizerState(model, opt), "payload": payload, "step": 0}
    handles: list[Any] = []
    overlapped = 0
    # Each commit (rank 0 publishing index.json) is held until the loop has run the next
    # training step, so every save provably stays in flight across training collectives.
    gate = threading.Event()
    publish = LocalStorage.publish

    def gated_publish(self: LocalStorage, path: str, data: bytes) -> None:
        if os.path.basename(path) == "index.json" and not gate.wait(60):
            raise TimeoutError("the training loop never released the commit gate")
        publish(self, path, data)

    LocalStorage.publish = gated_publish  # type: ignore[method-assign]
    # the saves after the first stream through a budget smaller than this rank's state
    budgeted = shardsafe.Checkpointer(unit_size=1 << 20, max_staging_bytes=2 << 20)
    for step in range(9):
        g = torch.Generator().manual_seed(1000 * step + RANK)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 7, generator=g)
        F.mse_loss(model(x), y).backward()  # FSDP all-gathers and reduce-scatters
        if handles:
            handles[-1].wait_staged()  # background staging must finish before we mutate
        opt.step()
        opt.zero_grad()
        payload.to_local().fill_(float(step))
        if step % 3 == 0 and handles:  # the step right after a save: its commit is held
            overlapped += not handles[-1].done()
        gate.set()
        if step % 3 == 2:
            state["step"] = step
            write_full_state(model, opt, os.path.join(out, f"async-ref-{step}.safetensors"))
            mode = "background" if step % 2 else "blocking"
            if handles:
                handles[-1].result(timeout=120)  # one save in flight; re-arm the gate for the next
            gate.clear()
            save = shardsafe.async_save if step == 2 else budgeted.async_save
            handles.append(save(state, os.path.join(out, f"async-{step}"), staging=mode, timeout=60))
    gate.set()  # the last save has no next step to wait for
    for h in handles:
        h.result(timeout=120)
    LocalStorage.publish = publish  # type: ignore[method-assign]
    budgeted.close()
    return {"saved": [3 * i + 2 for i in range(len(handles))], "overlapped": overlapped,
            "budget_peak": budgeted._saver.arena.peak_nbytes, "staged": handles[-1].nbytes}


def s_manager(out: str) -> dict[str, Any]:
    """CheckpointManager on every rank: retention, a signal only rank 1 gets, fallback."""
    res: dict[str, Any] = {}
    directory = os.path.join(out, "managed")
    model, opt = build_fsdp(0)
    state = {"app": shardsafe.ModelOptimizerState(model, opt), "step": 0}
    opts = dict(save_interval_steps=2, max_to_keep=2, preemption_signals=(signal.SIGUSR1,))
    with shardsafe.CheckpointManager(directory, **opts) as mgr:
        for step in range(1, 20):
            train(model, opt, step, 1)
            state["step"] = step
            if step == 7 and RANK == 1:
                os.kill(os.getpid(), signal.SIGUSR1)  # the preemption notice reaches rank 1 only
            if mgr.should_save(step):
                write_full_state(model, opt, os.path.join(out, f"managed-ref-{step}.safetensors"))
            mgr.save(step, state)
            if mgr.reached_preemption(step):
                break
        res["stopped_at"] = step
    res["steps_after_retention"] = shardsafe.CheckpointManager(directory, read_only=True).all_steps()
    dist.barrier()
    if RANK == 0:  # damage a chunk of step 7 that only rank 2 reads
        flip_byte(os.path.join(directory, "step_00000007", "data-r00002-000.safetensors"), -3)
    dist.barrier()
    model2, opt2 = build_fsdp(1234)
    state2 = {"app": shardsafe.ModelOptimizerState(model2, opt2), "step": 0}
    with shardsafe.CheckpointManager(directory, max_to_keep=2) as mgr:
        res["restored"] = mgr.restore(state2)
        res["steps_after_restore"] = mgr.all_steps()
    res["restored_step_value"] = state2["step"]
    write_full_state(model2, opt2, os.path.join(out, f"managed-restored-r{RANK}.safetensors"))
    return res

def s_lost(out: str) -> dict[str, Any]:
    """Rank 1's share of the plan is lost (as a planner bug would lose it): nothing commits."""
    res: dict[str, Any] = {}
    mesh = init_device_mesh("cpu", (WORLD,))
    x = distribute_tensor(torch.arange(WORLD * 64, dtype=torch.float32).reshape(WORLD * 8, 8),
                          mesh, [Shard(0)])
    real = plan_exchange.my_share
    if RANK == 1:
        plan_exchange.my_share = lambda *args, **kwargs: []  # type: ignore[assignment]
    try:
        shardsafe.save({"x": x, "step": 3}, os.path.join(out, "lost"), timeout=30.0)
        res["error"] = None
    except shardsafe.CheckpointError as e:
        res["error"] = type(e).__name__
        res["message"] = str(e)
    finally:
        plan_exchange.my_share = real  # later phases of this process plan normally
    return res


def s_incremental(out: str) -> dict[str, Any]:
    """An incremental manager on every rank: a row-sharded frozen base, a changing adapter."""
    from shardsafe.api.load import read_checkpoint_index

    mesh = init_device_mesh("cpu", (WORLD,))
    full = torch.arange(WORLD * 64 * 64, dtype=torch.float32).reshape(WORLD * 64, 64)
    base = distribute_tensor(full, mesh, [Shard(0)])
    directory = os.path.join(out, "incremental")
    with shardsafe.CheckpointManager(directory, max_to_keep=2, incremental=True) as mgr:
        for step in range(4):
            mgr.save(step, {"base": base, "adapter": torch.full((100,), float(step)), "step": step})
        mgr.wait_until_finished()
        steps = mgr.all_steps()
    dist.barrier()
    last = os.path.join(directory, "step_00000003")
    target = {"base": distribute_tensor(torch.zeros_like(full), mesh, [Shard(0)]),
              "adapter": torch.zeros(100), "step": 0}
    with shardsafe.CheckpointManager(directory, read_only=True) as mgr:
        restored = mgr.restore(target)
    return {"steps": steps, "restored": restored, "step": target["step"],
            "base_ok": torch.equal(target["base"].to_local(), base.to_local()),
            "adapter": target["adapter"].tolist() == [3.0] * 100,
            "files": [f.name for f in read_checkpoint_index(last).files],
            "own_bytes": os.path.getsize(os.path.join(last, f"data-r{RANK:05d}-000.safetensors")),
            **_incremental_compressed(out, mesh)}


def _incremental_compressed(out: str, mesh: Any) -> dict[str, Any]:
    """incremental=True with compression="auto": each rank's compressed shard of the frozen
    base is referenced in the block file step 0 wrote."""
    from shardsafe.api.load import read_checkpoint_index

    full = (torch.randn(WORLD * 128, 256, generator=torch.Generator().manual_seed(8)) * 0.02).to(torch.bfloat16)
    base = distribute_tensor(full, mesh, [Shard(0)])  # 64 KiB per rank: compressed
    directory = os.path.join(out, "incremental-z")
    with shardsafe.CheckpointManager(directory, max_to_keep=2, incremental=True, compression="auto") as mgr:
        for step in range(3):
            mgr.save(step, {"base": base, "adapter": torch.full((100,), float(step)), "step": step})
        mgr.wait_until_finished()
    dist.barrier()
    target = {"base": distribute_tensor(torch.zeros_like(full), mesh, [Shard(0)]),
              "adapter": torch.zeros(100), "step": 0}
    with shardsafe.CheckpointManager(directory, read_only=True) as mgr:
        restored = mgr.restore(target)
    return {"z_restored": restored, "z_base_ok": torch.equal(target["base"].to_local(), base.to_local()),
            "z_files": [f.name for f in read_checkpoint_index(os.path.join(directory, "step_00000002")).files]}


def compressed_tensors() -> dict[str, torch.Tensor]:
    """Full tensors of the compression case: shards of at least 64 KiB per rank, so compressed."""
    g = torch.Generator().manual_seed(21)
    return {"w": (torch.randn(96, 4096, generator=g) * 0.02).to(torch.bfloat16),  # Shard(0)
            "v": torch.randn(1024, 96, generator=g) * 1e-3,  # Shard(1)
            "r": torch.arange(40_000, dtype=torch.int64) % 7}  # replicated: written once


COMPRESSED_SAVE = {"w": [Shard(0)], "v": [Shard(1)], "r": [Replicate()]}
COMPRESSED_LOAD = {"w": [Shard(1)], "v": [Shard(0)], "r": [Shard(0)]}


def _compressed_state(placements: dict[str, list], zero: bool) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (WORLD,))
    full = compressed_tensors()
    return {"m": {k: distribute_tensor(torch.zeros_like(t) if zero else t, mesh, placements[k])
                  for k, t in full.items()}, "small": torch.arange(5), "step": 4}


def s_compressed(out: str) -> dict[str, Any]:
    """3 ranks: sharded saves with compression (sync "auto", async "zstd" staged in the
    background, and one where rank 1 alone compresses nothing)."""
    state = _compressed_state(COMPRESSED_SAVE, zero=False)
    shardsafe.save(state, os.path.join(out, "cz-sync"), compression="auto")
    h = shardsafe.async_save(state, os.path.join(out, "cz-async"), compression="zstd", staging="background")
    h.wait_staged()
    h.result()
    shardsafe.save(state, os.path.join(out, "cz-mixed"), compression=None if RANK == 1 else "auto")
    return {"files": sorted(os.listdir(os.path.join(out, "cz-sync")))}


def s_compressed_load(out: str) -> dict[str, Any]:
    """Any world size: load the compressed checkpoints onto other shardings of this world."""
    full = compressed_tensors()
    res = {}
    for name in ("cz-sync", "cz-async", "cz-mixed"):
        tgt = _compressed_state(COMPRESSED_LOAD, zero=True)
        shardsafe.load(os.path.join(out, name), tgt)
        res[name] = all(torch.equal(tgt["m"][k].full_tensor(), full[k]) for k in full) and tgt["step"] == 4
    return res



def many_full() -> dict[str, torch.Tensor]:
    """Full tensors of the many-rank state (distinct values reveal any misplacement)."""
    return {"row": torch.arange(16 * 5 * 3, dtype=torch.float32).reshape(80, 3),
            "col": torch.arange(7 * 33, dtype=torch.int64).reshape(7, 33),
            "grid": torch.arange(12 * 10, dtype=torch.float64).reshape(12, 10) / 7}


def s_many(out: str) -> dict[str, Any]:
    """Ranks with different trees: DTensors on a 1-D mesh (33 columns: uneven, some ranks
    empty) and on a 2-D mesh (boxes held by 2 ranks), plain tensors, keys of 4 stages
    (each held by a quarter of the ranks) and PerRank values; saved twice, the second
    time with new PerRank values only."""
    full = many_full()
    flat = init_device_mesh("cpu", (WORLD,))
    grid = init_device_mesh("cpu", (2, WORLD // 2))
    stage = RANK * 4 // WORLD
    state: dict[str, Any] = {
        "row": distribute_tensor(full["row"], flat, [Shard(0)]),
        "col": distribute_tensor(full["col"], flat, [Shard(1)]),
        "grid": distribute_tensor(full["grid"], grid, [Replicate(), Shard(0)]),
        "plain": torch.arange(6), "step": 9,
        "stage": {f"s{stage}": torch.full((2,), float(stage))},
        "mine": shardsafe.PerRank({"rank": RANK, "t": torch.full((3,), float(RANK))})}
    shardsafe.save(state, os.path.join(out, "many"))
    first = plan_exchange.STATS.last
    state["mine"].value["rank"] = RANK + 100  # a new PerRank value: only the values travel
    shardsafe.save(state, os.path.join(out, "many"), overwrite=True)
    return {"first": first, "again": plan_exchange.STATS.last, "again_full": plan_exchange.STATS.full}


def s_many_load(out: str) -> dict[str, Any]:
    """Any world size: load ``s_many``'s checkpoint onto other shardings of this world."""
    full = many_full()
    mesh = init_device_mesh("cpu", (WORLD,))
    placements = {"row": Shard(1), "col": Shard(0), "grid": Shard(0)}
    tgt = {k: distribute_tensor(torch.zeros_like(v), mesh, [placements[k]]) for k, v in full.items()}
    state: dict[str, Any] = {**tgt, "plain": torch.zeros(6, dtype=torch.int64), "step": 0,
                             "stage": {f"s{s}": torch.zeros(2) for s in range(4)},
                             "mine": shardsafe.PerRank({"rank": -1, "t": torch.zeros(3)}, missing="keep")}
    shardsafe.load(os.path.join(out, "many"), state)
    return {"equal": {k: bool(torch.equal(tgt[k].full_tensor(), v)) for k, v in full.items()},
            "plain": state["plain"].tolist() == list(range(6)) and state["step"] == 9,
            "stage": [state["stage"][f"s{s}"].tolist() for s in range(4)],
            "mine": [state["mine"].value["rank"], state["mine"].value["t"].tolist()]}


def s_entries_in_files(out: str) -> dict[str, Any]:
    """Every rank but 0 sends its chunk entries through the working directory (the store
    limit lowered to 16 bytes in each process): the checkpoint commits, loads back, and
    holds no entries file."""
    from shardsafe.engine.commit import two_phase

    full = many_full()
    mesh = init_device_mesh("cpu", (WORLD,))
    state = {"row": distribute_tensor(full["row"], mesh, [Shard(0)]), "step": 4}
    path = os.path.join(out, "entries_in_files")
    sent: list[str] = []
    real, message = two_phase.STORE_MAX, two_phase._message
    two_phase.STORE_MAX = 16

    def recorded(prep: Any, entries: bytes) -> bytes:
        m = message(prep, entries)
        sent.append(chr(m[0]))  # R: through the store, F: through a file
        return m

    two_phase._message = recorded
    try:
        shardsafe.save(state, path, timeout=30.0)
    finally:
        two_phase.STORE_MAX, two_phase._message = real, message
    got = shardsafe.load(path)
    return {"equal": bool(torch.equal(got["row"], full["row"])) and got["step"] == 4,
            "files": sorted(os.listdir(path)), "sent": sent}


SCENARIOS = {"comm": s_comm, "save": s_save, "load": s_load, "kill": s_kill, "async": s_async,
             "manager": s_manager, "lost": s_lost, "incremental": s_incremental,
             "compressed": s_compressed, "compressed_load": s_compressed_load,
             "many": s_many, "many_load": s_many_load, "entries_in_files": s_entries_in_files}


def main(scenarios: dict[str, Any] = SCENARIOS) -> None:
    """Runs the phases of ``sys.argv[1]`` with ``scenarios`` (dcp_worker.py passes its own)."""
    global WORLD
    spec, out = sys.argv[1], sys.argv[2]
    for name, WORLD in phases(spec, RANK):
        result = scenarios[name](out, *sys.argv[3:])
        with open(os.path.join(out, f"{name}-w{WORLD}-r{RANK}.json"), "w") as f:
            json.dump(result, f)
        if name == "kill":
            os._exit(0)  # a peer is dead: tearing the group down could hang
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
