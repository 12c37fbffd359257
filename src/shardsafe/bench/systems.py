"""The systems under test, each as save/load operations returning their timings.

Every operation returns a dict of seconds: ``stall`` (how long the caller is blocked),
``durable`` (until the checkpoint is committed and on disk), and for background
staging ``staged``. Loads return ``durable`` as their total time.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import shardsafe

from .measure import drop_cache

Op = Callable[[dict[str, Any], str], dict[str, float]]


def _dcp() -> Any:
    warnings.filterwarnings("ignore", module="torch.distributed.checkpoint")
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    import torch.distributed.checkpoint as dcp

    return dcp


# ---------------------------------------------------------------------- saves
def shardsafe_save(ckpt: shardsafe.Checkpointer) -> Op:
    def op(state: dict[str, Any], path: str) -> dict[str, float]:
        t = time.perf_counter()
        ckpt.save(state, path)
        d = time.perf_counter() - t
        return {"stall": d, "durable": d, "retained": ckpt.retained_bytes}
    return op


def shardsafe_async(ckpt: shardsafe.Checkpointer, staging: str) -> Op:
    def op(state: dict[str, Any], path: str) -> dict[str, float]:
        t = time.perf_counter()
        h = ckpt.async_save(state, path, staging=staging)
        stall = time.perf_counter() - t
        h.wait_staged()
        staged = time.perf_counter() - t
        h.result()
        return {"stall": stall, "staged": staged, "durable": time.perf_counter() - t,
                "retained": ckpt.retained_bytes}
    return op


def torch_save(state: dict[str, Any], path: str) -> dict[str, float]:
    t = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    d = time.perf_counter() - t
    return {"stall": d, "durable": d}


def safetensors_save(state: dict[str, Any], path: str) -> dict[str, float]:
    """``safetensors.torch.save_file`` of the (flat) state, then fsync."""
    from safetensors.torch import save_file

    t = time.perf_counter()
    save_file(state, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    d = time.perf_counter() - t
    return {"stall": d, "durable": d}


def dcp_save(state: dict[str, Any], path: str) -> dict[str, float]:
    dcp = _dcp()
    t = time.perf_counter()
    dcp.save(state, checkpoint_id=path)
    d = time.perf_counter() - t
    return {"stall": d, "durable": d}


def dcp_async_save(state: dict[str, Any], path: str) -> dict[str, float]:
    dcp = _dcp()
    t = time.perf_counter()
    fut = dcp.async_save(state, checkpoint_id=path)
    stall = time.perf_counter() - t
    upload = getattr(fut, "upload_completion", fut)
    upload.result()
    return {"stall": stall, "durable": time.perf_counter() - t}


# ---------------------------------------------------------------------- loads
def _load_op(load: Callable[[str], Any], cold: bool, system_drop: bool) -> Op:
    """A load operation: evict the files first when ``cold``, then time ``load(path)``.

    The loaded result is released after the clock stops, so freeing it is not timed.
    """
    def op(_: dict[str, Any], path: str) -> dict[str, float]:
        if cold:
            drop_cache(path, system=system_drop)
        t = time.perf_counter()
        out = load(path)
        d = time.perf_counter() - t
        del out
        return {"durable": d}
    return op


def shardsafe_load_in_place(target: dict[str, Any], cold: bool, system_drop: bool = False) -> Op:
    return _load_op(lambda path: shardsafe.load(path, target), cold, system_drop)


def shardsafe_load_new(cold: bool, system_drop: bool = False, mmap: bool = False) -> Op:
    return _load_op(lambda path: shardsafe.load(path, mmap=mmap), cold, system_drop)


def torch_load(cold: bool, system_drop: bool = False) -> Op:
    return _load_op(lambda path: torch.load(path, weights_only=True), cold, system_drop)


def _safetensors_copy(path: str) -> dict[str, Any]:
    """``safetensors.torch.load_file`` (tensors backed by a memory map of the file), then a
    copy of each into memory of its own: what holds the state once the file is closed."""
    from safetensors.torch import load_file

    return {k: v.clone() for k, v in load_file(path).items()}


def safetensors_load(cold: bool, system_drop: bool = False) -> Op:
    import safetensors.torch  # noqa: F401 - imported before any timing

    return _load_op(_safetensors_copy, cold, system_drop)


def dcp_load_in_place(target: dict[str, Any], cold: bool, system_drop: bool = False) -> Op:
    dcp = _dcp()  # imported before any timing
    return _load_op(lambda path: dcp.load(target, checkpoint_id=path), cold, system_drop)


def dcp_async_save_stager(stager: Any) -> Op:
    """``dcp.async_save`` through ``shardsafe.dcp.Writer`` with ``shardsafe.dcp.Stager``
    (one stager for the whole run, as a training job keeps one)."""
    def op(state: dict[str, Any], path: str) -> dict[str, float]:
        dcp = _dcp()
        from ..dcp import Writer

        t = time.perf_counter()
        fut = dcp.async_save(state, storage_writer=Writer(path), async_stager=stager)
        stall = time.perf_counter() - t
        fut.result()
        return {"stall": stall, "durable": time.perf_counter() - t, "retained": stager.nbytes}
    return op


# ---------------------------------------------------------------------- torch_checkpointing
TORCH_CHECKPOINTING_NOTE = ("torch_checkpointing writes with LocalFileSystemStorageConfig(use_direct_io=False): "
                            "its default O_DIRECT writes of unaligned buffers fail with EINVAL on this machine")


class TorchCheckpointing:
    """Meta's torch-checkpointing (0.1) as a peer: a sync and an async ``CheckpointManager``
    (the async one writes from a separate process, as its default does), the whole state
    as one item that is copied before an async write, local files written without O_DIRECT
    (``TORCH_CHECKPOINTING_NOTE``)."""

    def __init__(self) -> None:
        from torch_checkpointing.checkpoint_manager import CheckpointManager
        from torch_checkpointing.checkpoint_process import CheckpointProcessConfig
        from torch_checkpointing.config import AsyncCheckpointSaverConfig, SyncCheckpointSaverConfig
        from torch_checkpointing.schema import ItemSpec
        from torch_checkpointing.storage.filesystem import LocalFileSystemStorageConfig

        storage = LocalFileSystemStorageConfig(use_direct_io=False)
        self._sync = CheckpointManager.Config(save=SyncCheckpointSaverConfig(), storage_config=storage,
                                              default=ItemSpec(requires_copy=True)).build()
        # its writer process imports torch first: 30 s (its default) is not enough on a busy machine
        slow_start = AsyncCheckpointSaverConfig(process_config=CheckpointProcessConfig(subprocess_init_timeout_secs=300))
        self._async = CheckpointManager.Config(save=slow_start, storage_config=storage,
                                               default=ItemSpec(requires_copy=True)).build()

    def save(self, state: dict[str, Any], path: str) -> dict[str, float]:
        t = time.perf_counter()
        self._sync.save(path, {"state": state})
        d = time.perf_counter() - t
        return {"stall": d, "durable": d}

    def async_save(self, state: dict[str, Any], path: str) -> dict[str, float]:
        t = time.perf_counter()
        fut = self._async.save(path, {"state": state})
        stall = time.perf_counter() - t
        with self._async.lock():  # returns once the state has been captured
            staged = time.perf_counter() - t
        fut.result()
        return {"stall": stall, "staged": staged, "durable": time.perf_counter() - t}

    def load_in_place(self, target: dict[str, Any], cold: bool, system_drop: bool = False) -> Op:
        return _load_op(lambda path: self._sync.load(path, {"state": target}), cold, system_drop)

    def close(self) -> None:
        self._sync.close()
        self._async.close()


def dcp_stager() -> Any:
    """A ``shardsafe.dcp.Stager`` (imports DCP)."""
    _dcp()
    from ..dcp import Stager

    return Stager()
