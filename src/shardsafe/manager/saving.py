"""How the manager starts one save: the single seam between manager and save engine.

``start_save`` returns once the state has been captured (copied into the Checkpointer's
reusable staging buffers, or fully written when ``background`` is False); the returned
handle's ``result()`` blocks until the checkpoint is committed and durable and re-raises
any error of the write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ..engine.checkpointer import Checkpointer
from ..format.codec import Compression


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
               background: bool, compression: Compression | None = None) -> SaveJob:
    """Starts saving ``state`` to ``path``; returns when the caller may mutate ``state``.

    Raises (before anything is written): TypeError for an unsaveable value, ValueError for
    metadata that is not JSON, CheckpointError when ``path`` must not be written.
    """
    opts = dict(storage_options) if storage_options is not None else None
    if not background:
        saver.save(state, path, metadata=metadata, storage_options=opts, compression=compression)
        return _Finished()
    return saver.async_save(state, path, staging="blocking", metadata=metadata, storage_options=opts,
                            compression=compression)
