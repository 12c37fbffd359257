"""Asynchronous saves through a process-wide default Checkpointer."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from ..engine.save.handle import SaveHandle
from ..engine.save.request import StagingMode
from ..format.codec import Compression
from ..plan.flatten import Stateful
from .checkpointer import Checkpointer

_default_lock = threading.Lock()
_default: Checkpointer | None = None


def default_checkpointer() -> Checkpointer:
    """The Checkpointer behind ``shardsafe.save`` and ``shardsafe.async_save``.

    Created on first use; it keeps the staging buffers of the last async save for the
    next one (call ``close()`` on it to free them; a new one is created on next use).
    """
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Checkpointer()
        return _default


def _reset_in_child() -> None:
    """After ``fork``: a fresh lock (a parent thread may have held it at the fork). The
    default Checkpointer itself is reset by the engine's own fork hook."""
    global _default_lock
    _default_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_in_child)


def async_save(state: Mapping[str, Any] | Stateful, path: str, *, staging: StagingMode = "blocking",
               overwrite: bool = False, metadata: Mapping[str, Any] | None = None,
               storage_options: dict | None = None, process_group: Any = None,
               timeout: float | None = None, collective: bool | None = None,
               compression: Compression | None = None,
               max_staging_bytes: int | None = None) -> SaveHandle:
    """Starts saving ``state`` to ``path``; returns a SaveHandle.

    ``state`` is a mapping or a single Stateful object, as for ``save``.

    With ``staging="blocking"`` (default) it returns once the state is copied into host
    buffers, so the caller may change its tensors at once; with ``"background"`` it
    returns immediately and the caller must call ``handle.wait_staged()`` before changing
    any tensor of ``state``. Checksums, writes and the commit run in the background;
    ``handle.result()`` waits for them and re-raises any failure. At most one save is in
    flight: a new save (sync or async) first waits for the previous one and raises its
    error if nobody collected it. Under torch.distributed (or ``jax.distributed``) it is
    collective like ``save``: the planning runs on the calling thread, while the background
    part talks to the other ranks through the c10d Store (JAX's coordination service) only,
    never the training process group. With
    ``collective=False`` this rank alone saves its own state, with no communication (as
    ``save(..., collective=False)``). With ``compression`` (as for ``save``) the
    tensors are compressed in the background, after staging, so the stall does not grow.
    With ``max_staging_bytes`` the save stages into at most that many bytes of host
    memory: a larger state streams through them while it is written, and the call
    returns once the last part is staged (it waits for the disk for what does not fit).
    The two combine: compressed, the budget holds the blocks being coded and the block
    file's write chunks too (it must be at least 56 MiB then). See
    ``Checkpointer.async_save`` for the arguments.
    """
    return default_checkpointer().async_save(
        state, path, staging=staging, overwrite=overwrite, metadata=metadata, storage_options=storage_options,
        process_group=process_group, timeout=timeout, collective=collective, compression=compression,
        max_staging_bytes=max_staging_bytes)


__all__ = ["async_save", "default_checkpointer"]
