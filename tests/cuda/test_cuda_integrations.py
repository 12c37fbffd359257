"""GPU state through shardsafe's other entry points: DTensors on a 1-GPU mesh (NCCL, and
NCCL beside gloo), ``CheckpointManager`` with the local tier, DCP through
``shardsafe.dcp.Writer``/``Reader``, and DCP's ``async_save`` with ``shardsafe.dcp.Stager``."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest
import torch
from dist_harness import run_script
from gpu_helpers import assert_bytes_equal, fill_late, to_host

import shardsafe

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl"])
def test_dtensor_on_a_one_gpu_mesh(tmp_path, backend) -> None:
    outputs = run_script(os.path.join(HERE, "dtensor_gpu_worker.py"), 1, str(tmp_path), backend, timeout=120)
    assert outputs[0].rstrip().endswith("ok"), outputs[0][-2000:]


def _model(device: torch.device, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(step)).to(next(model.parameters()).device)
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def test_manager_local_tier_with_gpu_state(tmp_path, device) -> None:
    """Saves every step (persistent every 4, local every 2), training on between; a restore
    into a fresh GPU model and optimizer takes the newest step from the local tier, and
    the persistent tier once the local one is gone; every value is the step's own."""
    model, opt = _model(device, 0)
    snapshots: dict[int, dict[str, Any]] = {}
    opts = dict(save_interval_steps=4, local_directory=str(tmp_path / "local"), local_save_interval_steps=2)
    with shardsafe.CheckpointManager(tmp_path / "persistent", **opts) as mgr:
        for step in range(7):
            _train_step(model, opt, step)
            mgr.save(step, {"model": model, "optim": opt})
            snapshots[step] = {k: to_host(v) for k, v in model.state_dict().items()}
        mgr.wait_until_finished()
        assert mgr.all_steps() == [0, 4] and mgr.local_steps() == [4, 6]

    def restore(want_step: int, want_tier: str) -> None:
        fresh, fresh_opt = _model(device, 1)
        with shardsafe.CheckpointManager(tmp_path / "persistent", **opts) as m:
            assert m.restore({"model": fresh, "optim": fresh_opt}) == want_step
            assert m.last_restore.tier == want_tier
        for k, v in fresh.state_dict().items():
            assert v.device == device, k
            assert_bytes_equal(v, snapshots[want_step][k], k)
        _train_step(fresh, fresh_opt, 99)  # the restored optimizer state works on the GPU
        assert all(s["exp_avg"].device == device for s in fresh_opt.state.values())

    restore(6, "local")
    shutil.rmtree(tmp_path / "local")
    restore(4, "persistent")


def _dcp_state(device: torch.device) -> dict[str, Any]:
    model, opt = _model(device, 2)
    _train_step(model, opt, 0)
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": 3}


def _tensors(sd: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors of a nested state dict by dotted key."""
    if isinstance(sd, torch.Tensor):
        return {prefix: sd}
    out: dict[str, torch.Tensor] = {}
    if isinstance(sd, dict):
        for k, v in sd.items():
            out.update(_tensors(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(sd, (list, tuple)):
        for i, v in enumerate(sd):
            out.update(_tensors(v, f"{prefix}.{i}"))
    return out


def _zeros_like(sd: Any) -> Any:
    if isinstance(sd, torch.Tensor):
        return torch.zeros_like(sd)
    if isinstance(sd, dict):
        return {k: _zeros_like(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [_zeros_like(v) for v in sd]
    return sd


def test_dcp_writer_and_reader_with_gpu_tensors(tmp_path, device) -> None:
    import torch.distributed.checkpoint as dcp

    from shardsafe.dcp import Reader, Writer

    sd = _dcp_state(device)
    want = {k: v.clone() for k, v in _tensors(sd).items()}
    for name, go in (("sync", lambda p: dcp.save(sd, storage_writer=Writer(p))),
                     ("async", lambda p: _result(dcp.async_save(sd, storage_writer=Writer(p))))):
        path = str(tmp_path / name)
        go(path)
        plain = _tensors(shardsafe.load(path))
        for k, v in want.items():
            assert_bytes_equal(plain[k], v, f"{name} {k}")
        target = _zeros_like(sd)
        dcp.load(target, storage_reader=Reader(path))
        for k, v in _tensors(target).items():
            assert v.device == device, k
            assert_bytes_equal(v, want[k], f"{name} {k}")


def _result(response: Any) -> Any:
    """Waits for what ``dcp.async_save`` returned (a Future, or an AsyncSaveResponse)."""
    return getattr(response, "upload_completion", response).result()


def _stager_class() -> Any:
    import shardsafe.dcp

    stager = getattr(shardsafe.dcp, "Stager", None)
    if stager is None:
        pytest.skip("shardsafe.dcp.Stager does not exist in this checkout yet")
    return stager


@pytest.mark.parametrize("writer", ["shardsafe", "dcp"])
@pytest.mark.parametrize("budget", [None, 2 * MiB])
def test_dcp_async_save_with_shardsafe_stager_and_gpu_tensors(tmp_path, device, writer, budget) -> None:
    """DCP's ``async_save`` staged by ``shardsafe.dcp.Stager`` (with and without a staging
    budget; into shardsafe's ``Writer`` and DCP's own ``FileSystemWriter``) saves the values
    queued before the call, not the step right after staging completed."""
    import torch.distributed.checkpoint as dcp

    from shardsafe.dcp import Reader, Writer

    stager_cls = _stager_class()
    g = torch.Generator(device=device).manual_seed(4)
    sd = {"w": torch.randn(3 * MiB // 4 + 11, generator=g, device=device),
          "h": torch.randn(64, 32, generator=g, device=device).to(torch.bfloat16), "step": 1}
    fill_late(sd["w"], 1.5)
    want = {"w": torch.full_like(sd["w"], 1.5), "h": sd["h"].clone()}
    path = str(tmp_path / "ckpt")
    storage = Writer(path) if writer == "shardsafe" else dcp.FileSystemWriter(path)
    stager = stager_cls() if budget is None else stager_cls(max_staging_bytes=budget)
    try:
        response = dcp.async_save(sd, storage_writer=storage, async_stager=stager)
        staged = getattr(response, "staging_completion", None)
        if staged is not None:
            staged.result()
        sd["w"].fill_(-1.0)  # the next optimizer step
        sd["h"].zero_()
        _result(response)
    finally:
        stager.close()
    target = {"w": torch.zeros_like(sd["w"]), "h": torch.zeros_like(sd["h"]), "step": 0}
    dcp.load(target, storage_reader=Reader(path) if writer == "shardsafe" else dcp.FileSystemReader(path))
    for k, v in want.items():
        assert_bytes_equal(target[k], v, k)
