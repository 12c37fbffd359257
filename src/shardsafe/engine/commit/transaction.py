"""The commit protocol: what "committed" means, and how a save becomes committed.

A checkpoint is committed exactly when ``<path>/index.json`` exists: the index is
published atomically, after every data file is durable. ``is_committed`` is the one
function listers, loaders and retention use.

On filesystems with atomic rename, a save writes into a hidden sibling directory
``.<name>.shardsafe-tmp-<id>`` and renames it into place once its index is published,
so the final path only ever holds complete checkpoints (an overwrite swaps the two
directories atomically). On object stores the data objects are written under the final
prefix and the index object is written last.
"""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import uuid
from dataclasses import dataclass

from ...errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError
from ...format import INDEX_NAME
from ...format.index.objects import Index
from ...format.index.rules import MAX_INDEX_BYTES
from ...format.index.versions import decode_index
from ...format.tree import render_path
from ...storage.base import Storage
from .locations import data_file

TMP_MARKER = ".shardsafe-tmp-"
log = logging.getLogger("shardsafe")


def is_committed(storage: Storage, path: str) -> bool:
    """True when ``path`` holds a committed checkpoint (its index has been published)."""
    return storage.exists(storage.join(path, INDEX_NAME))


def list_entries(storage: Storage, parent: str) -> list[str]:
    """Sorted names directly under ``parent``, symbolic links left out.

    A checkpoint directory's entries are never followed through a link, for listing or
    for deleting (docs/FORMAT.md section 9): a ``step_N`` link to another directory is
    neither a step of this directory nor something its retention or clean-up may touch.
    Each link is logged once (a warning) and otherwise ignored.
    """
    out = []
    for name in storage.list(parent):
        path = storage.join(parent, name)
        if storage.is_link(path):
            if path not in _LINKS_SEEN:
                _LINKS_SEEN.add(path)
                log.warning("ignoring %s: a symbolic link (shardsafe never lists or deletes "
                            "through one)", path)
            continue
        out.append(name)
    return out


_LINKS_SEEN: set[str] = set()  # links already warned about by ``list_entries``


def is_temporary(name: str) -> bool:
    """True for the hidden working directories of unfinished saves."""
    return name.startswith(".") and TMP_MARKER in name


def read_index(storage: Storage, path: str) -> Index:
    """Reads and validates the index of the checkpoint at ``path``.

    Raises:
        CheckpointNotFoundError: ``path`` holds no committed checkpoint.
        CorruptCheckpointError: the index is damaged or a data file is truncated.
    """
    return read_index_bytes(storage, path)[1]


def read_index_bytes(storage: Storage, path: str) -> tuple[bytes, Index]:
    """``read_index``, also returning the index bytes (a collective load broadcasts them)."""
    index_path = storage.join(path, INDEX_NAME)
    try:
        # size first: a forged multi-GB index must not be read into memory to be refused
        if storage.size(index_path) > MAX_INDEX_BYTES:
            raise CorruptCheckpointError(f"index is larger than the {MAX_INDEX_BYTES} bytes allowed",
                                         file=INDEX_NAME)
        data = storage.read(index_path)
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointNotFoundError(f"no committed checkpoint at {path!r} "
                                      f"(no {INDEX_NAME})") from None
    index = decode_index(data)
    check_data_files(storage, path, index)
    return data, index


def check_data_files(storage: Storage, path: str, index: Index) -> None:
    """Every data file ``index`` lists exists with the size it says (one request each).

    Raises:
        CheckpointNotFoundError: the checkpoint was deleted meanwhile.
        CorruptCheckpointError: a file is missing or of another size (truncated?).
    """
    for f in index.files:
        try:
            size = storage.size(data_file(storage, path, f.name))
        except FileNotFoundError:
            if not is_committed(storage, path):  # deleted (retention) while we read it
                raise CheckpointNotFoundError(f"checkpoint at {path!r} was deleted while "
                                              f"being read") from None
            raise CorruptCheckpointError("data file is missing", file=f.name,
                                         key=_first_key_beyond(index, f.name, 0)) from None
        if size != f.size:
            raise CorruptCheckpointError(f"data file has {size} bytes, index says {f.size} "
                                         f"(truncated? a symlink?)", file=f.name,
                                         key=_first_key_beyond(index, f.name, size))


def _first_key_beyond(index: Index, file: str, size: int) -> str | None:
    """The first key with bytes at or past ``size`` in ``file`` (what a truncation lost)."""
    for t in index.tensors:
        for c in t.chunks:
            if c.file == file and c.offset + c.stored_nbytes > size:
                return render_path(t.key)
    return None


@dataclass(frozen=True, slots=True)
class Transaction:
    """An unfinished save: files go to ``workdir``; ``final`` is where it commits."""

    storage: Storage
    """Backend of the checkpoint."""
    final: str
    """Path of the committed checkpoint."""
    workdir: str
    """Where the data files and the index are written (``final`` itself on object stores)."""
    replace: bool
    """A committed checkpoint is at ``final`` and is replaced (``overwrite=True``)."""


def _is_file(storage: Storage, path: str) -> bool:
    """Whether ``path`` is there but is neither a directory nor a link (a file, a FIFO, ...)."""
    return storage.exists(path) and not storage.is_directory(path) and not storage.is_link(path)


def _split(path: str) -> tuple[str, str]:
    p = path.rstrip("/")
    return posixpath.dirname(p), posixpath.basename(p)


def plan_transaction(storage: Storage, path: str, *, overwrite: bool, token: str | None = None) -> Transaction:
    """Checks that a save to ``path`` is allowed and names its working directory.

    Pure apart from reads; every rank of a distributed save computes the same result
    when given the same ``token``. A local path that ends in ``.`` or ``..`` (``ckpt/.``,
    ``.`` from inside it) is made absolute, so the checkpoint is renamed into place under
    its own name.
    """
    if storage.atomic_rename and _split(path)[1] in (".", ".."):
        path = os.path.abspath(path)
    committed = is_committed(storage, path)
    if committed and not overwrite:
        raise CheckpointError(f"a committed checkpoint already exists at {path!r}; "
                              f"pass overwrite=True (on the command line --overwrite) to replace it")
    if not committed and storage.list(path):
        if storage.atomic_rename:
            raise CheckpointError(f"{path!r} exists and is not a shardsafe checkpoint; refusing to "
                                  f"write over it")
    elif not committed and storage.atomic_rename and _is_file(storage, path):
        raise CheckpointError(f"{path!r} is an existing file, not a checkpoint directory; refusing to "
                              f"write over it (remove it, or save to another path)")
    if not storage.atomic_rename:
        return Transaction(storage, path, path, committed)
    parent, name = _split(path)
    work = storage.join(parent or ".", f".{name}{TMP_MARKER}{token or uuid.uuid4().hex[:16]}")
    return Transaction(storage, path, work, committed)


def begin(txn: Transaction) -> None:
    """Prepares the working directory (on object stores: un-commits what is replaced)."""
    s = txn.storage
    if not s.atomic_rename and txn.replace:
        delete_checkpoint(s, txn.final)
    s.makedirs(txn.workdir)


def finish(txn: Transaction, index_bytes: bytes) -> None:
    """Publishes the index (the commit point) and moves the checkpoint into place."""
    s = txn.storage
    s.sync_dir(txn.workdir)
    s.publish(s.join(txn.workdir, INDEX_NAME), index_bytes)
    if not s.atomic_rename:
        return
    if s.exists(txn.final) and txn.replace:
        s.rename(txn.workdir, txn.final, exchange=True)
        s.delete(txn.workdir)  # now holds the replaced checkpoint
    else:
        # rename(2) replaces an empty directory the user created, and fails (ENOTDIR,
        # ENOTEMPTY) on a file or on anything that appeared since plan_transaction:
        # never delete what is at the final path.
        try:
            s.rename(txn.workdir, txn.final)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
            if s.is_link(txn.final):
                raise CheckpointError(f"cannot commit the save to {txn.final!r}: it is a symbolic "
                                      f"link, and shardsafe never writes through one (give the "
                                      f"real path)") from None
            if _is_file(s, txn.final):
                raise CheckpointError(f"cannot commit the save to {txn.final!r}: it is an existing "
                                      f"file, not a checkpoint directory (remove it, or save to "
                                      f"another path)") from None
            what = ("another save committed a checkpoint there first" if is_committed(s, txn.final)
                    else "something else appeared there")
            raise CheckpointError(f"cannot commit the save to {txn.final!r}: {what} "
                                  f"(two writers on one path?)") from None


def abort(txn: Transaction) -> None:
    """Removes what an unfinished save wrote; never touches a committed checkpoint."""
    s = txn.storage
    if s.atomic_rename:
        s.delete(txn.workdir)
    elif not is_committed(s, txn.final):
        s.delete(txn.final)


def abort_quietly(txn: Transaction, what: str = "save") -> None:
    """``abort`` while another error propagates: a failure to clean up is logged (naming
    the unfinished ``what``), never raised over the error that matters."""
    try:
        abort(txn)
    except OSError as e:
        log.warning("could not remove the unfinished %s %s: %s", what, txn.workdir, e)


def uncommit(storage: Storage, path: str) -> None:
    """Removes the index of the checkpoint at ``path`` (durably): it is no longer committed.

    Raises:
        CheckpointError: ``path`` is a symbolic link (what it points to is not deleted).
    """
    if storage.is_link(path):
        raise CheckpointError(f"refusing to delete {path!r}: it is a symbolic link to "
                              f"{_link_target(path)!r}; delete a checkpoint by its own path")
    storage.delete(storage.join(path, INDEX_NAME))
    if storage.atomic_rename and storage.exists(path):
        storage.sync_dir(path)


def _link_target(path: str) -> str:
    try:
        return os.readlink(path.rstrip("/") or path)
    except OSError:
        return "?"


def split_path(path: str) -> tuple[str, str]:
    """``(parent, name)`` of a checkpoint path (the parent is ``.`` for a bare name)."""
    parent, name = _split(path)
    return parent or ".", name


def delete_checkpoint(storage: Storage, path: str) -> None:
    """Deletes a checkpoint crash-safely: un-commit first (index), then the data.

    Removes every file of the checkpoint; a checkpoint whose files sibling checkpoints
    may reference (incremental saves) is retired with ``engine.commit.sweep.retire`` instead.
    """
    uncommit(storage, path)
    storage.delete(path)
