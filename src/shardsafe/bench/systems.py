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
