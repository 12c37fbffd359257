"""Page-locked staging memory: when ``cudaHostRegister`` refuses a buffer, staging falls
back to pageable memory with a warning, and neither that nor the refusal itself ever
costs a wrong value or a CUDA error in later, unrelated work."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from gpu_helpers import fill_late, to_host

import shardsafe
from shardsafe.engine import cuda
from shardsafe.storage.memory import anonymous

MiB = 1 << 20


def test_a_refused_registration_warns_and_leaves_no_cuda_error_behind(tmp_path, caplog, device) -> None:
    """A range part of which is registered already is refused (CUDA's documented
    ``cudaErrorHostMemoryAlreadyRegistered``): ``pin`` says so with a warning and returns
    False; the next kernels of this thread run, and so does a save of GPU state from it (a
    failed runtime call must not stay behind as the thread's last CUDA error, which
    PyTorch's next kernel-launch check would raise)."""
    _map, buf = anonymous(4 * MiB, huge=False)
    cudart = torch.cuda.cudart()
    err = cudart.cudaHostRegister(int(buf.ctypes.data), MiB, 0)  # the first MiB, by someone else
    assert int(getattr(err, "value", err)) == 0
    try:
        with caplog.at_level(logging.WARNING, logger="shardsafe"):
            assert cuda.pin(buf) is False
        assert any("cudaHostRegister" in r.getMessage() for r in caplog.records), caplog.text
        x = torch.arange(1 << 20, device=device, dtype=torch.float32)
        y = (x.view(1024, 1024).t().contiguous() * 2).sum()  # kernel launches, each checked
        assert y.item() == float(x.sum().item() * 2)
        state = {"t": x.view(1024, 1024).t()}  # staging runs a kernel (contiguous) on this thread
        with shardsafe.Checkpointer() as ckpt:
            ckpt.async_save(state, str(tmp_path / "ckpt")).result()
        assert torch.equal(shardsafe.load(str(tmp_path / "ckpt"))["t"], state["t"].cpu())
    finally:
        cudart.cudaHostUnregister(int(buf.ctypes.data))


@pytest.mark.parametrize("budget", [None, 2 * MiB])
@pytest.mark.parametrize("staging", ["blocking", "background"])
def test_pageable_staging_saves_exact_values(tmp_path, device, staging, budget) -> None:
    """Staging that is not page-locked (what a refused registration leaves) still waits
    for the caller's stream and still keeps the values of the call."""
    g = torch.Generator(device=device).manual_seed(1)
    state = {"w": torch.randn(MiB + 5, generator=g, device=device), "b": torch.zeros(17, device=device)}
    fill_late(state["b"], 4.0)
    want = {"w": to_host(state["w"]), "b": torch.full((17,), 4.0)}
    path = str(tmp_path / "ckpt")
    with shardsafe.Checkpointer(pin_memory=False, unit_size=MiB, max_staging_bytes=budget) as ckpt:
        h = ckpt.async_save(state, path, staging=staging)
        if staging == "background":
            h.wait_staged()
        state["w"].zero_()
        state["b"].zero_()
        h.result()
    got = shardsafe.load(path)
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_pin_and_unpin_a_staging_buffer(device) -> None:
    """What ``pin`` registers, CUDA sees as page-locked, until ``unpin``."""
    _map, buf = anonymous(2 * MiB)
    assert cuda.pin(buf)
    try:
        assert torch.from_numpy(buf).is_pinned()
        host = torch.from_numpy(buf[: MiB]).view(torch.float32)
        src = torch.arange(MiB // 4, device=device, dtype=torch.float32)
        host.copy_(src, non_blocking=True)
        torch.cuda.synchronize(device)
        assert np.array_equal(buf[:MiB].view(np.float32), np.arange(MiB // 4, dtype=np.float32))
    finally:
        cuda.unpin(buf)
    assert not torch.from_numpy(buf).is_pinned()
