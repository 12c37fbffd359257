"""What a directory holds: the committed, unfinished and damaged checkpoints of a scan,
with the bytes each owns and references (``ls``, ``gc``, ``verify``, ``cp``)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.commit import is_committed, read_index
from ..errors import CheckpointError, CheckpointNotFoundError
from ..format.index.objects import Index
from ..manager.steps import StepDirectory, StepEntry, recorded
from ..storage import LocalStorage, Storage


@dataclass(slots=True)
class Entry:
    """A checkpoint (or the leftover of an unfinished save) found in a directory.

    Attributes:
        name: Name inside the directory.
        path: Backend path.
        state: ``committed``, ``partial`` (an unfinished or crashed save) or ``corrupt``
            (committed, but its index or file sizes fail validation).
        index: The index of a committed checkpoint.
        error: Why it is corrupt.
        named_step: The step its name belongs to (``manager.steps.classify``).
    """

    name: str
    path: str
    state: str
    index: Index | None = None
    error: str | None = None
    named_step: int | None = None

    @property
    def step(self) -> int | None:
        """The step: as the manager recorded it in the index, else from the name."""
        return recorded(self.index).get("step", self.named_step) if self.index is not None else self.named_step

    @property
    def metrics(self) -> dict[str, Any]:
        """The metrics the manager recorded (as stored: JSON values)."""
        return recorded(self.index).get("metrics", {}) if self.index is not None else {}

    @property
    def size(self) -> int | None:
        """Bytes of the checkpoint's own data files (not those it references)."""
        return own_bytes(self.index) if self.index is not None else None

    @property
    def referenced(self) -> int | None:
        """Bytes of the chunks it references in sibling steps (incremental saves)."""
        return referenced_bytes(self.index) if self.index is not None else None


def own_bytes(index: Index) -> int:
    """Bytes of the data files the checkpoint holds itself."""
    return sum(f.size for f in index.files if f.reference is None)


def referenced_bytes(index: Index) -> int:
    """Bytes the chunks stored in data files of sibling steps (references) occupy there
    (compressed chunks: their stored bytes)."""
    ids = [i for i, f in enumerate(index.files) if f.reference is not None]
    if not ids:
        return 0
    t = index.table  # every decoded index has its chunk table
    return int(t.stored_nbytes()[np.isin(t.file, np.array(ids, dtype=np.int64))].sum())


def _entry(storage: Storage, parent: str, listed: StepEntry) -> Entry:
    """The command's view of a listed entry: a committed one's index is read (and
    validated); an unfinished save, an interrupted delete or a save in progress on an
    object store is ``partial`` (a temporary's index may be published already)."""
    path = storage.join(parent, listed.name)
    if listed.kind == "set-aside":
        return Entry(listed.name, path, "corrupt", error="set aside as damaged", named_step=listed.step)
    if not listed.committed or listed.kind == "temporary":
        return Entry(listed.name, path, "partial", named_step=listed.step)
    try:
        return Entry(listed.name, path, "committed", index=read_index(storage, path), named_step=listed.step)
    except CheckpointError as e:
        return Entry(listed.name, path, "corrupt", error=str(e), named_step=listed.step)


def scan(storage: Storage, path: str) -> list[Entry]:
    """Checkpoints and unfinished saves directly under ``path``, steps in order; symbolic
    links are left out (never followed, see ``engine.commit.list_entries``).

    Raises:
        CheckpointNotFoundError: ``path`` does not exist.
    """
    # listing a prefix needs one request per child on object stores: do them concurrently
    with ThreadPoolExecutor(8) as pool:
        listed = StepDirectory(storage, path).entries(every=True, map_fn=pool.map)
        if not listed and not storage.exists(path):
            raise CheckpointNotFoundError(f"{path!r} does not exist")
        found = list(pool.map(lambda e: _entry(storage, path, e), listed))
    return sorted(found, key=lambda e: (e.step is None, e.step or 0, e.name))


def checkpoints_at(storage: Storage, path: str) -> list[Entry]:
    """``path`` itself when it is a committed checkpoint, else the checkpoints under it."""
    if is_committed(storage, path):
        name = path.rstrip("/").rsplit("/", 1)[-1] or path
        try:
            return [Entry(name, path, "committed", index=read_index(storage, path))]
        except CheckpointError as e:
            return [Entry(name, path, "corrupt", error=str(e))]
    return scan(storage, path)


def modified(storage: Storage, path: str) -> float | None:
    """Newest modification time (POSIX seconds) of ``path`` or the files directly in it."""
    if isinstance(storage, LocalStorage):
        try:
            times = [os.stat(path).st_mtime]
            times += [os.stat(os.path.join(path, n)).st_mtime for n in storage.list(path)]
        except FileNotFoundError:
            return None
        return max(times)
    get = getattr(storage, "modified", None)
    if get is None:
        return None
    times = [t for t in (get(storage.join(path, n)) for n in storage.list(path)) if t is not None]
    return max(times) if times else None
