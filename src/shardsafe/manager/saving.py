"""How the manager starts one save: the single seam between manager and save engine.

``start_save`` returns once the state has been captured (copied into the Checkpointer's
reusable staging buffers, or fully written when ``background`` is False); the returned
handle's ``result()`` blocks until the checkpoint is committed and durable and re-raises
any error of the write. ``Inflight`` is the manager's slot for the save in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import Any, Protocol

from ..engine.checkpointer import Checkpointer
from ..engine.incremental import Baseline
from ..format.codec import Compression
from .lock import DirectoryLock

log = logging.getLogger("shardsafe")


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


def start_save(saver: Checkpointer, state: Mapping[str, Any], path: str, *,
               metadata: Mapping[str, Any], storage_options: Mapping[str, Any] | None,
               background: bool, compression: Compression | None = None,
               baseline: Baseline | None = None) -> SaveJob:
    """Starts saving ``state`` to ``path``; returns when the caller may mutate ``state``.

    With a ``baseline`` (incremental saves) unchanged chunks are referenced, not written.

    Raises (before anything is written): TypeError for an unsaveable value, ValueError for
    metadata that is not JSON, CheckpointError when ``path`` must not be written.
    """
    opts = dict(storage_options) if storage_options is not None else None
    if not background:
        saver.save(state, path, metadata=metadata, storage_options=opts, compression=compression,
                   baseline=baseline)
        return _Finished()
    return saver.async_save(state, path, staging="blocking", metadata=metadata, storage_options=opts,
                            compression=compression, baseline=baseline)


class Incremental:
    """The manager's incremental-save state: the baseline of its previous committed save
    (None when ``incremental`` is off) and what a save in flight may reference."""

    def __init__(self, enabled: bool) -> None:
        self.baseline = Baseline() if enabled else None

    def keep_only_if(self, committed: Iterable[str], where: str) -> None:
        """Forgets the baseline unless its step is among ``committed`` (step directory
        names): after a delete, rollback or set-aside the next save writes everything."""
        if self.baseline is not None and self.baseline.keep_only_if(committed):
            log.info("the incremental baseline's step left %s; the next save writes everything", where)

    def pinned(self) -> set[str]:
        """Files a save in flight may reference (``<step dir>/<file>``): the baseline's files
        hold every chunk the current or next save can reference; sweeps keep them."""
        return self.baseline.files() if self.baseline is not None else set()


class Inflight:
    """The save in flight (shared with the at-exit reporter, which must not hold the manager)."""

    def __init__(self) -> None:
        self.future: Future | None = None
        self.step: int | None = None


def report_uncollected(slot: Inflight, lock: DirectoryLock | None) -> None:
    fut = slot.future
    if fut is not None and fut.done() and fut.exception() is not None:
        log.error("checkpoint save of step %s failed and nobody called wait_until_finished() "
                  "or close(): %s", slot.step, fut.exception())
    if lock is not None:
        lock.release_quietly()
