"""Where the data files an index names live: in the checkpoint, or in a sibling checkpoint.

An incremental save (``CheckpointManager(incremental=True)``) references unchanged data
in a data file of an earlier step of the same manager directory: its index names the
file ``<step directory>/<file>`` (docs/FORMAT.md section 13). This module is the one
place that turns an index's file name into a backend path; readers, size checks,
``verify`` and ``export`` all go through it, so a reference is resolved explicitly
against the checkpoint's parent (``Storage.sibling_file``) and never by handing a path
with separators to the OS or an object store.
"""

from __future__ import annotations

from ..format.index.rows import split_reference
from ..storage.base import Storage


def data_file(storage: Storage, checkpoint: str, name: str) -> str:
    """The backend path of data file ``name`` (as listed in the index) of ``checkpoint``.

    Raises:
        CorruptCheckpointError: a referenced step directory is a symlink or not a directory.
        FileNotFoundError: a referenced step directory does not exist (local storage).
    """
    ref = split_reference(name)
    if ref is None:
        return storage.join(checkpoint, name)
    return storage.sibling_file(checkpoint, *ref)


class Locator:
    """``data_file`` for one checkpoint, resolving each name once (readers call it per read)."""

    def __init__(self, storage: Storage, checkpoint: str) -> None:
        self.storage = storage
        self.checkpoint = checkpoint
        self._paths: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        path = self._paths.get(name)
        if path is None:
            path = self._paths[name] = data_file(self.storage, self.checkpoint, name)
        return path
