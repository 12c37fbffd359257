"""How the engine copies GPU state out: side streams that wait for the caller's stream as
it was at the call (also when another thread queues the copies), the caller's stream made
to wait for the copies on the GPU instead of its thread waiting, waits that sleep,
page-locking only for GPU state (and a refused one that leaves no error behind), bounce
buffers for sync saves, and units of non-contiguous tensors that gather only their own
elements."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import torch
from gpu_helpers import SLOW_CYCLES, fill_late, to_host

import shardsafe
from shardsafe.engine import cuda
from shardsafe.storage.memory import anonymous

MiB = 1 << 20


def _slow_seconds(device: torch.device) -> float:
    """How long ``torch.cuda._sleep(SLOW_CYCLES)`` takes on this GPU (measured here)."""
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    torch.cuda._sleep(SLOW_CYCLES)
    torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def test_copies_queued_by_another_thread_wait_for_the_callers_stream(device) -> None:
    """The fence is taken on the caller's thread, on its own stream; a helper thread (whose
    current stream is the default one) queues the copy: it must still read the late value."""
    _map, out = anonymous(MiB)
    assert cuda.pin(out, device.index)
    try:
        s = torch.cuda.Stream(device=device)
        with torch.cuda.stream(s):
            src = torch.zeros(MiB // 4, device=device)
            fill_late(src, 1.0)
            fence = cuda.Fence.capture([src])
        assert fence is not None and fence.marks[device.index][0] == s
        errors: list[BaseException] = []

        def helper() -> None:
            try:
                copier = cuda.DeviceCopier(fence)
                copier.copy(src, out)
                copier.wait()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        t = threading.Thread(target=helper)
        t.start()
        t.join()
        assert not errors, errors
        assert np.array_equal(out.view(np.float32), np.ones(MiB // 4, dtype=np.float32))
    finally:
        cuda.unpin(out, device.index)


def test_waiting_for_copies_sleeps_instead_of_spinning(device) -> None:
    slow = _slow_seconds(device)
    _map, out = anonymous(MiB)
    assert cuda.pin(out, device.index)
    try:
        src = torch.zeros(MiB // 4, device=device)
        fill_late(src, 3.0)
        copier = cuda.DeviceCopier(cuda.Fence.capture([src]))
        copier.copy(src, out)
        wall, cpu = time.perf_counter(), time.thread_time()
        copier.wait()
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        assert wall > slow / 3, (wall, slow)  # it did wait for the slow kernel
        assert cpu < wall / 4, (cpu, wall)  # asleep, not spinning a core
        assert np.array_equal(out.view(np.float32), np.full(MiB // 4, 3.0, dtype=np.float32))
    finally:
        cuda.unpin(out, device.index)


def test_blocking_async_save_returns_before_its_device_copies_land(tmp_path, device) -> None:
    """The caller's thread does not wait for the device-to-host copies: its stream does
    (the copies wait behind a slow kernel here, the call returns well before it ends), and
    the caller's next change, queued right after, is still not saved."""
    slow = _slow_seconds(device)
    state = {"w": torch.zeros(2 * MiB, device=device), "t": torch.zeros(256, 384, device=device).t()}
    with shardsafe.Checkpointer() as ckpt:
        ckpt.async_save(state, str(tmp_path / "warm")).result()  # the staging images exist, page-locked
        assert all(b.parent.pinned for b in ckpt._saver.arena.buffers)
        for t in state.values():
            fill_late(t, 1.0)
        t0 = time.perf_counter()
        h = ckpt.async_save(state, str(tmp_path / "ckpt"))
        blocked = time.perf_counter() - t0
        for t in state.values():
            t.fill_(2.0)
        h.result()
    assert blocked < slow / 2, (blocked, slow)
    got = shardsafe.load(str(tmp_path / "ckpt"))
    for k, t in state.items():
        assert torch.equal(got[k], torch.ones(t.shape)), k
    assert all(bool((t == 2).all()) for t in state.values())


def test_only_saves_of_gpu_state_page_lock_and_a_refusal_falls_back(tmp_path, device, caplog) -> None:
    """A CPU state's save leaves the staging image pageable (no registration, no context).
    The same layout on the GPU page-locks it; here CUDA refuses (a page of it is registered
    already): a warning, pageable staging, exact values, and no CUDA error left for this
    thread's next kernels."""
    cpu_state = {"w": torch.arange(MiB, dtype=torch.float32)}
    gpu_state = {"w": torch.arange(MiB, dtype=torch.float32, device=device) * 2}
    cudart = torch.cuda.cudart()
    with shardsafe.Checkpointer() as ckpt:
        ckpt.async_save(cpu_state, str(tmp_path / "cpu")).result()
        (image,) = ckpt._saver.arena.buffers
        slab = image.parent
        assert not slab.pinned
        # by someone else: the image's first page (the header's: no device copy lands there)
        err = cudart.cudaHostRegister(int(slab.array.ctypes.data), 4096, 0)
        assert int(getattr(err, "value", err)) == 0
        try:
            with caplog.at_level(logging.WARNING, logger="shardsafe"):
                ckpt.async_save(gpu_state, str(tmp_path / "gpu")).result()
            assert ckpt._saver.arena.buffers[0].parent is slab and not slab.pinned
            assert any("cudaHostRegister" in r.getMessage() for r in caplog.records), caplog.text
            y = (gpu_state["w"].view(1024, 1024).t().contiguous() + 1).sum()  # kernel launches, each checked
            assert y.item() == float((gpu_state["w"] + 1).sum().item())
        finally:
            cudart.cudaHostUnregister(int(slab.array.ctypes.data))
    assert torch.equal(shardsafe.load(str(tmp_path / "gpu"))["w"], to_host(gpu_state["w"]))
    assert torch.equal(shardsafe.load(str(tmp_path / "cpu"))["w"], cpu_state["w"])


def test_sync_saves_of_gpu_state_stream_through_page_locked_bounce_buffers(tmp_path, device) -> None:
    state = {"w": torch.randn(6 * MiB, device=device), "t": torch.randn(300, 700, device=device).t()}
    with shardsafe.Checkpointer(unit_size=MiB) as ckpt:
        ckpt.save({"c": torch.ones(MiB)}, str(tmp_path / "cpu"))
        free = ckpt._saver._bounce._free
        assert free and not any(b.pinned for b in free)  # a CPU state pins nothing
        ckpt.save(state, str(tmp_path / "gpu"))
        # the buffers the GPU state went through are page-locked (idle ones may not be)
        assert any(b.pinned for b in ckpt._saver._bounce._free)
    got = shardsafe.load(str(tmp_path / "gpu"))
    for k, v in state.items():
        assert torch.equal(got[k], to_host(v)), k


def test_units_of_a_transposed_tensor_gather_only_their_own_elements(tmp_path, device) -> None:
    """A 64 MiB transposed weight streamed in 1 MiB units: GPU memory grows by about a unit,
    not by a contiguous copy of the weight per unit."""
    w = torch.randn(4096, 4096, device=device).t()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    with shardsafe.Checkpointer(unit_size=MiB, max_staging_bytes=4 * MiB) as ckpt:
        ckpt.async_save({"w": w}, str(tmp_path / "async")).result()
        ckpt.save({"w": w}, str(tmp_path / "sync"))
    torch.cuda.synchronize(device)
    grew = torch.cuda.max_memory_allocated(device) - base
    assert grew < 16 * MiB, grew
    want = to_host(w)
    for name in ("async", "sync"):
        assert torch.equal(shardsafe.load(str(tmp_path / name))["w"], want), name
