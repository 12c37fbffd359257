"""Mark and sweep: remove the data files that no committed checkpoint of a directory uses.

With incremental saves a checkpoint references data files of sibling checkpoints (the
``<step directory>/<file>`` names of docs/FORMAT.md section 13), so deleting a step may
not remove all of its files. Deleting is therefore two steps, each safe under SIGKILL:

1. un-commit: remove the step's index (``commit.uncommit``); from then on no reader,
   lister or retention takes it for a checkpoint;
2. sweep (``sweep``): *mark* every data file that any committed checkpoint directly
   under the parent names (its own files and its references), then remove the unmarked
   files of the given non-committed directories, and each directory left empty.

A crash between or during the two leaves at worst unreferenced data, which the next
sweep (retention, ``delete``, ``shardsafe gc``) removes; a file a committed checkpoint
names is never removed, so every committed checkpoint stays loadable. Callers pass the
files of a save still in flight (``pinned``): its references are in no committed index
yet. An index that cannot be read (I/O error) stops the sweep; one that is damaged
(it fails validation: that checkpoint cannot load anyway) marks nothing and is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..errors import CorruptCheckpointError
from ..format import INDEX_NAME
from ..format.index.rules import MAX_INDEX_BYTES
from ..format.index.versions import decode_index
from ..storage.base import Storage
from .commit import is_committed, list_entries, split_path, uncommit

log = logging.getLogger("shardsafe")


def _index_files(storage: Storage, path: str) -> list[str]:
    """The data file names the committed index at ``path`` lists (decoded and validated)."""
    index_path = storage.join(path, INDEX_NAME)
    if storage.size(index_path) > MAX_INDEX_BYTES:
        raise CorruptCheckpointError("index is too large", file=INDEX_NAME)
    return [f.name for f in decode_index(storage.read(index_path)).files]


def marked(storage: Storage, parent: str, ignore: Iterable[str] = ()) -> dict[str, set[str]]:
    """Directory name -> names of its files that a committed checkpoint under ``parent`` uses.

    ``ignore``: checkpoints to treat as un-committed already (``gc --dry-run``).

    Raises:
        OSError: an index could not be read (nothing may be swept then).
    """
    out: dict[str, set[str]] = {}
    skip = set(ignore)
    for name in list_entries(storage, parent):
        path = storage.join(parent, name)
        if name.startswith(".") or name in skip or not is_committed(storage, path):
            continue
        try:
            files = _index_files(storage, path)
        except FileNotFoundError:
            continue  # un-committed meanwhile
        except CorruptCheckpointError as e:
            log.warning("sweep: %s has a damaged index (%s); it cannot load and marks nothing", path, e)
            continue
        out.setdefault(name, set()).add(INDEX_NAME)
        for f in files:
            directory, _, base = f.rpartition("/")
            out.setdefault(directory or name, set()).add(base)
    return out


def plan_sweep(storage: Storage, parent: str, names: Iterable[str], pinned: Iterable[str] = (),
               ignore: Iterable[str] = ()) -> dict[str, tuple[list[str], list[str]]]:
    """What ``sweep`` would do (reads only): per non-committed directory of ``names``, the
    files it removes and the files it keeps because a committed checkpoint uses them.

    ``ignore``: checkpoints to treat as un-committed (they are in ``names`` too). Only
    directories are swept: a name that is a symbolic link, a file, a FIFO or a device is
    left alone (nothing outside ``parent`` is ever deleted).
    """
    skip = set(ignore)
    todo = [n for n in names if n in skip or not is_committed(storage, storage.join(parent, n))]
    todo = [n for n in todo if _sweepable(storage, parent, n)]
    if not todo:
        return {}
    keep = marked(storage, parent, skip)
    for p in pinned:
        directory, _, base = p.rpartition("/")
        keep.setdefault(directory, set()).add(base)
    out = {}
    for name in todo:
        files = storage.list(storage.join(parent, name))
        used = keep.get(name, set())
        out[name] = ([f for f in files if f not in used], [f for f in files if f in used])
    return out


def _sweepable(storage: Storage, parent: str, name: str) -> bool:
    path = storage.join(parent, name)
    if storage.is_directory(path):
        return True
    if storage.exists(path) or storage.is_link(path):
        log.warning("sweep: leaving %s alone: a symbolic link or not a directory", path)
    return False


def sweep(storage: Storage, parent: str, names: Iterable[str], pinned: Iterable[str] = ()) -> list[str]:
    """Removes the unmarked files of the non-committed directories ``names`` under ``parent``.

    ``pinned``: more files to keep, as ``<directory>/<file>`` names (a save in flight).
    Committed directories in ``names`` are left alone. Returns the names of the
    directories it removed anything from.

    Raises:
        OSError: listing, reading an index, or deleting failed (what was removed stays removed).
    """
    removed = []
    for name, (drop, kept) in plan_sweep(storage, parent, names, pinned).items():
        d = storage.join(parent, name)
        if is_committed(storage, d):  # committed meanwhile (cannot happen to a retired step)
            continue
        for f in drop:
            storage.delete(storage.join(d, f))
        if not kept:
            storage.delete(d)
        if drop or not kept:
            removed.append(name)
    return removed


def retire(storage: Storage, path: str, pinned: Iterable[str] = ()) -> list[str]:
    """Deletes the checkpoint at ``path`` crash-safely: un-commits it, then removes those of
    its files that no committed sibling references (see the module docstring).

    Returns what ``sweep`` returns (kept files stay in the directory, which is no longer a
    checkpoint, until no committed checkpoint references them).
    """
    uncommit(storage, path)
    parent, name = split_path(path)
    return sweep(storage, parent, [name], pinned)
