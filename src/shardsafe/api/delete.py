"""Delete a committed checkpoint: un-commit it first (the index), then remove its data."""

from __future__ import annotations

import os

from ..engine.commit import is_committed
from ..engine.commit.sweep import retire
from ..errors import CheckpointNotFoundError
from ..storage import LocalStorage, storage_for


def delete(path: str | os.PathLike[str], *, storage_options: dict | None = None) -> None:
    """Deletes the committed checkpoint at ``path`` (a directory or fsspec URL).

    The index goes first, so from that moment the checkpoint is no longer committed:
    a crash half-way leaves data without an index, which no load, listing or restore
    takes for a checkpoint (``shardsafe gc`` removes it). Then the data files and the
    directory (or object prefix) are removed. The same crash-safe deletion as the
    manager's retention and ``shardsafe gc``. Not collective: under torch.distributed
    call it on one rank.

    A step of an incremental ``CheckpointManager`` directory may hold data that later
    steps reference: those files are kept (the directory is no longer a checkpoint and
    holds only them) until no committed sibling references them; retention or
    ``shardsafe gc`` then removes them. Every committed sibling stays loadable.

    Args:
        path: The checkpoint.
        storage_options: Passed to fsspec for URLs.

    Raises:
        CheckpointNotFoundError: nothing committed at ``path`` (it is left untouched, so
            a directory that is not a checkpoint is never deleted).
        CheckpointError: ``path`` is a symbolic link (nothing is deleted through a link:
            name the checkpoint by its own path).
    """
    storage, spath = storage_for(os.fspath(path), storage_options)
    if isinstance(storage, LocalStorage):  # "step_1/." or "." inside it name step_1, whose
        spath = os.path.abspath(spath)      # parent holds the siblings that may reference it
    if not is_committed(storage, spath):
        raise CheckpointNotFoundError(f"no committed checkpoint at {os.fspath(path)!r} to delete")
    retire(storage, spath)


__all__ = ["delete"]
