"""What the GPU benchmark measures: the state, the copy limits, the saves, a training loop
while they write, and the loads back onto the device.

Every function works on any torch device, so ``--dry-run`` runs this very code on tiny
CPU tensors where there is no GPU. Times are host wall-clock seconds; device work is
synchronised before a clock is read.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import shardsafe

from .gpu_report import DCP, PAGEABLE, PINNED, SHARDSAFE
from .measure import settle

MiB = 1 << 20
LIMIT_BYTES = 1 << 30  # the copy limits are measured on this much of the state (or all of it)

# A save started in the background: (seconds the call blocked, done(), wait()).
Started = tuple[float, Callable[[], bool], Callable[[], object]]


def sync(device: torch.device) -> None:
    """Waits for the device's queued work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_state(nbytes: int, device: torch.device, tensor_bytes: int) -> dict[str, torch.Tensor]:
    """``nbytes`` of random values on ``device`` in tensors of ``tensor_bytes``: half of the
    bytes bf16 ("model" weights), half fp32 ("optimizer" moments)."""
    n = max(2, nbytes // tensor_bytes)
    g = torch.Generator(device=device).manual_seed(0)
    state = {}
    for i in range(n):
        dtype = torch.bfloat16 if i % 2 == 0 else torch.float32
        numel = tensor_bytes // (2 if dtype == torch.bfloat16 else 4)
        name = f"model.{i // 2:03d}.weight" if i % 2 == 0 else f"optim.{i // 2:03d}.exp_avg"
        state[name] = torch.randn(numel, generator=g, device=device, dtype=torch.float32).to(dtype)
    sync(device)
    return state


def state_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def copy_limits(state: dict[str, torch.Tensor], repeat: int) -> dict[str, list[float]]:
    """GB/s of ``copy_`` from the device into page-locked and into pageable host tensors.

    Copies up to ``LIMIT_BYTES`` of the state's tensors, each into a host tensor of its
    own allocated beforehand, all queued and then synchronised; a warm-up round first.
    Without CUDA there is no page-locked memory: only "pageable" (a memcpy) is measured.
    """
    device = next(iter(state.values())).device
    part, total = [], 0
    for t in state.values():
        if total >= LIMIT_BYTES:
            break
        part.append(t)
        total += t.numel() * t.element_size()
    kinds = [PINNED, PAGEABLE] if device.type == "cuda" else [PAGEABLE]
    out: dict[str, list[float]] = {}
    for kind in kinds:
        hosts = [torch.empty(t.shape, dtype=t.dtype, pin_memory=kind == PINNED) for t in part]
        samples = []
        for r in range(repeat + 1):
            sync(device)
            t0 = time.perf_counter()
            for h, t in zip(hosts, part):
                h.copy_(t, non_blocking=kind == PINNED)
            sync(device)
            if r:
                samples.append(total / (time.perf_counter() - t0) / 1e9)
        out[kind] = samples
        del hosts
    return out


class MatmulSteps:
    """A matmul-heavy training step on ``device``, plus an in-place update of the
    checkpointed state (what an optimizer step does to the tensors being saved)."""

    def __init__(self, device: torch.device, dim: int, matmuls: int, state: dict[str, torch.Tensor]) -> None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        g = torch.Generator(device=device).manual_seed(1)
        scale = dim ** -0.5
        self.device = device
        self.x = torch.randn(dim, dim, generator=g, device=device).to(dtype)
        self.ws = [(torch.randn(dim, dim, generator=g, device=device) * scale).to(dtype) for _ in range(matmuls)]
        self.params = list(state.values())

    def step(self) -> float:
        """One step, synchronised; its wall-clock seconds."""
        t0 = time.perf_counter()
        h = self.x
        for w in self.ws:
            h = h @ w
        torch._foreach_add_(self.params, 1e-3)
        sync(self.device)
        return time.perf_counter() - t0

    def run(self, steps: int) -> list[float]:
        return [self.step() for _ in range(steps)]

    def run_while(self, busy: Callable[[], bool], cap: int) -> list[float]:
        """One step, then more while ``busy()`` (checked before each), at most ``cap``."""
        times = [self.step()]
        while busy() and len(times) < cap:
            times.append(self.step())
        return times


def _dcp() -> Any:
    warnings.filterwarnings("ignore", module="torch.distributed.checkpoint")
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    import torch.distributed.checkpoint as dcp

    return dcp


def dcp_stager(device: torch.device) -> Any:
    """DCP's pinned, cached staging: its ``DefaultStager`` copying into page-locked host
    storages that it keeps for the next save, synchronously (the call returns once the
    state is copied, like shardsafe's blocking staging); ``BlockingAsyncStager(cache_staged_
    state_dict=True)`` where this torch has no ``DefaultStager``. No pinning without CUDA."""
    _dcp()
    from torch.distributed.checkpoint import staging

    cuda = device.type == "cuda"
    if hasattr(staging, "DefaultStager") and hasattr(staging, "StagingOptions"):
        return staging.DefaultStager(staging.StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                            use_async_staging=False, use_non_blocking_copy=cuda))
    return staging.BlockingAsyncStager(cache_staged_state_dict=True)


@dataclass
class Systems:
    """The background saves compared: each ``start(state, path)`` returns a ``Started``."""

    checkpointer: shardsafe.Checkpointer
    stager: Any

    def start(self, system: str, state: dict[str, torch.Tensor], path: str) -> Started:
        t0 = time.perf_counter()
        if system == SHARDSAFE:
            h = self.checkpointer.async_save(state, path)
            return time.perf_counter() - t0, h.done, h.result
        fut = _dcp().async_save(state, checkpoint_id=path, async_stager=self.stager)
        stall = time.perf_counter() - t0
        upload = getattr(fut, "upload_completion", fut)
        return stall, upload.done, upload.result

    def close(self) -> None:
        self.checkpointer.close()
        close = getattr(self.stager, "close", None)
        if close is not None:
            close()


def timed_save(systems: Systems, system: str, state: dict[str, torch.Tensor], path: str) -> dict[str, float]:
    """One background save, waited for: blocked and durable seconds."""
    settle()
    t0 = time.perf_counter()
    stall, _, wait = systems.start(system, state, path)
    wait()
    return {"stall": stall, "durable": time.perf_counter() - t0}


def save_while_training(systems: Systems, system: str, state: dict[str, torch.Tensor], path: str,
                        trainer: MatmulSteps, cap: int) -> tuple[list[float], dict[str, float]]:
    """Starts a background save, then trains until it is durable: the step times, and the
    save's blocked and durable seconds (durable as seen by a thread waiting for it)."""
    settle()
    t0 = time.perf_counter()
    stall, done, wait = systems.start(system, state, path)
    finished: dict[str, float] = {}
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            wait()
        except BaseException as e:  # noqa: BLE001 - re-raised on the training thread below
            errors.append(e)
        finished["durable"] = time.perf_counter() - t0

    th = threading.Thread(target=waiter, name="shardsafe-bench-wait", daemon=True)
    th.start()
    times = trainer.run_while(lambda: "durable" not in finished, cap)
    th.join()
    if errors:
        raise errors[0]
    return times, {"stall": stall, "durable": finished["durable"]}


def timed_load(system: str, target: dict[str, torch.Tensor], path: str) -> float:
    """Seconds to load ``path`` into ``target`` in place (onto its device), synchronised."""
    device = next(iter(target.values())).device
    sync(device)
    t0 = time.perf_counter()
    if system == DCP:
        _dcp().load(target, checkpoint_id=path)
    else:
        shardsafe.load(path, target)
    sync(device)
    return time.perf_counter() - t0


def driver_version() -> str | None:
    """The NVIDIA driver's version (``nvidia-smi``, else ``/proc/driver/nvidia/version``)."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            r = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
            if r.returncode == 0 and r.stdout.strip():
                return r.stdout.strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            return f.readline().strip() or None
    except OSError:
        return None


def free_bytes(directory: str) -> int:
    """Free bytes of the file system holding ``directory``."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize
