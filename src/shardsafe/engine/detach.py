"""Make a checkpoint self-contained: its references become files of its own.

A step of an incremental manager references data files of earlier steps
(``<step directory>/<file>``, docs/FORMAT.md section 13), so it loads only next to them.
A rollback moves newer steps aside under new names; a step moved aside whose references
name another moved step would then not load, neither where it lies nor when it is renamed
back. ``detach`` gives such a step a hard link of every file it references, under a name
of its own, and republishes its index naming those links: the step then loads wherever it
is moved, and shares the bytes (no copy) with the steps it referenced.

Crash safety: the links are made (and the directory synced) before the new index is
published atomically, so a crash leaves the old index (extra, unnamed links that cost no
space) or the new one, both loadable.
"""

from __future__ import annotations

import os
import shutil

from ..errors import CheckpointError, CorruptCheckpointError
from ..format import INDEX_NAME
from ..format.index.versions import encode_renamed
from ..format.index.rows import FILE_NAME, LINK_PREFIX
from ..storage.base import Storage
from ..storage.files import check_regular
from ..storage.local import LocalStorage
from .commit import read_index


def detach(storage: Storage, path: str) -> list[str]:
    """Hard-links every file the checkpoint at ``path`` references into it and republishes
    its index to name them; returns the references replaced (empty: nothing to do).

    Raises:
        CheckpointError: ``storage`` is not a local file system (no hard links there).
        CorruptCheckpointError: a referenced file is missing, not a regular file, or not
            the size the index records.
    """
    index = read_index(storage, path)
    refs = [(i, f) for i, f in enumerate(index.files) if f.reference is not None]
    if not refs:
        return []
    if not isinstance(storage, LocalStorage):
        raise CheckpointError(f"cannot make {path!r} self-contained: only a local file system "
                              f"has hard links")
    names = [f.name for f in index.files]
    taken = set(names) | set(storage.list(path))
    for i, f in refs:
        directory, base = f.reference  # type: ignore[misc]
        src = storage.sibling_file(path, directory, base)
        try:
            if check_regular(src) != f.size:
                raise CorruptCheckpointError(f"referenced file is not {f.size} bytes", file=f.name)
        except FileNotFoundError:
            raise CorruptCheckpointError("data file is missing", file=f.name) from None
        names[i] = own_name(i, base, taken)
        taken.add(names[i])
        _link(src, os.path.join(path, names[i]))
    storage.sync_dir(path)
    storage.publish(storage.join(path, INDEX_NAME), encode_renamed(index, names))
    return [f.name for _, f in refs]


def own_name(i: int, base: str, taken: set[str]) -> str:
    """A plain file name, not in ``taken``, for the checkpoint's own copy (or link) of the
    file its reference row ``i`` names (``base``), keeping the file's extension."""
    for name in (f"{LINK_PREFIX}{i:05d}-{base}", f"{LINK_PREFIX}{i:05d}{os.path.splitext(base)[1]}"):
        if FILE_NAME.fullmatch(name) and name not in taken:
            return name
    n = 0
    while f"{LINK_PREFIX}{i:05d}.{n}" in taken:
        n += 1
    return f"{LINK_PREFIX}{i:05d}.{n}"


def _link(src: str, dst: str) -> None:
    """``dst`` becomes a hard link of ``src`` (a copy where the file system has no links)."""
    try:
        os.link(src, dst)
    except FileExistsError:  # created since the directory was listed (a crash's leftover
        # links are listed, so they keep their names and a new name is chosen)
        os.remove(dst)
        os.link(src, dst)
    except OSError:  # EPERM, EXDEV, EMLINK: no hard link possible here
        shutil.copyfile(src, dst, follow_symlinks=False)
