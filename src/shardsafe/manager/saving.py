"""How the manager starts one save: the single seam between manager and save engine.

``start_save`` returns once the state has been captured (staged into host memory, or fully
written when ``background`` is False); the returned handle's ``result()`` blocks until the
checkpoint is committed and durable and re-raises any error of the write.

Until ``shardsafe.async_save`` exists on main this module carries a small fallback: the
state is staged on the calling thread with the foundation's ``prepare``/``stage_all``
(so the caller may mutate its tensors as soon as ``start_save`` returns) and the write
and commit run on one background thread.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from ..api.save import prepare, save, stage_all, write_and_commit
from ..engine.buffers import HostBuffer


class SaveJob(Protocol):
    """A started save (the subset of ``SaveHandle`` the manager relies on)."""

    def result(self, timeout: float | None = None) -> None:
        """Blocks until committed and durable; re-raises the save's error."""
        ...

    def done(self) -> bool:
        """True once the save has committed or failed."""
        ...


class _Finished:
    """A save that completed before ``start_save`` returned."""

    def result(self, timeout: float | None = None) -> None:
        return None

    def done(self) -> bool:
        return True


class _ThreadJob:
    def __init__(self, future: Future) -> None:
        self._future = future

    def result(self, timeout: float | None = None) -> None:
        self._future.result(timeout)

    def done(self) -> bool:
        return self._future.done()


_lock = threading.Lock()
_writer: ThreadPoolExecutor | None = None


def _writer_pool() -> ThreadPoolExecutor:
    global _writer
    with _lock:
        if _writer is None:
            _writer = ThreadPoolExecutor(1, thread_name_prefix="shardsafe-manager-write")
        return _writer


def _write(prep: Any, buffers: list[HostBuffer]) -> None:
    try:
        write_and_commit(prep, buffers)
    finally:
        for b in buffers:
            b.close()


def start_save(state: Mapping[str, Any], path: str, *, metadata: Mapping[str, Any],
               storage_options: Mapping[str, Any] | None, background: bool) -> SaveJob:
    """Starts saving ``state`` to ``path``; returns when the caller may mutate ``state``.

    Raises (before anything is written): TypeError for an unsaveable value, ValueError for
    metadata that is not JSON, CheckpointError when ``path`` must not be written.
    """
    opts = dict(storage_options) if storage_options is not None else None
    if not background:
        save(state, path, metadata=metadata, storage_options=opts)
        return _Finished()
    prep = prepare(state, path, metadata=metadata, storage_options=opts)
    buffers = stage_all(prep)
    try:
        return _ThreadJob(_writer_pool().submit(_write, prep, buffers))
    except RuntimeError:  # interpreter shutting down: no new threads
        _write(prep, buffers)
        return _Finished()
