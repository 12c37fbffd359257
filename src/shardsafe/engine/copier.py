"""Copy a committed checkpoint to another path or store, verifying every block on the way.

The copy is a save at the destination: its files go to the transaction's working
directory (``engine.commit``) and its index is published last, so the destination holds
the whole copy or nothing (an interrupted copy leaves what ``shardsafe gc`` removes, and
can simply run again). Each data file streams through one buffer of ``PIECE`` bytes:
read from the source, checked by ``format.block_verify.BlockStream`` (raw blocks against
their CRC32C; compressed blocks against the stored and, decoded, the raw CRC32C), then
appended at the destination (``Storage.write_stream``). A bad block stops the copy with a
``CorruptCheckpointError`` naming the file and the key, before anything is committed.

The copy needs nothing from the source, and writes nothing outside the destination it
is given. The data files an incremental step references in sibling steps
(``<sibling>/<file>``, docs/FORMAT.md section 13) are carried inside the destination
checkpoint under names of its own (``detach.own_name``: ``ref<row>-<file>``), and its
index is the source's with those rows renamed: a reference names a directory of the
*source's* parent, which at the destination may be anything (a forged one could make the
copy write into someone else's directory), so it is never followed there.

``shardsafe cp --all`` copies a whole directory of steps into a destination directory;
there a reference stays a reference (``carry_references=False``): the sibling it names
lies inside the destination directory too, and the steps of one run share the files
again instead of each carrying its own. A sibling file the destination has already (from
copying another step of the same run) is verified against the chunks this step uses
instead of being written again; one that holds other bytes is refused. A sibling file is
written under a hidden temporary name and renamed into place once durable (on an object
store an upload appears whole or not at all), so an interrupted copy never leaves a
partial one that a new run would refuse; a failed copy removes the sibling files it wrote.

A destination that is a symbolic link is refused before anything is read: shardsafe never
writes through a link.

A copy onto its own source (the same path on the same store) has nothing to do: it is
reported as up to date, and a re-coding one (``engine.recode``) is refused where the
store cannot rename, since replacing the destination there deletes the source first.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..errors import CheckpointError, CorruptCheckpointError
from ..format import INDEX_NAME
from ..format.block_verify import BlockSpan, BlockStream, index_spans
from ..format.index.objects import Index
from ..format.index.rows import FileEntry
from ..format.index.versions import encode_renamed
from ..storage.base import Storage
from ..storage.local import LocalStorage
from . import commit
from .buffers import HostBuffer
from .detach import own_name
from .locations import data_file

log = logging.getLogger("shardsafe")

PIECE = 16 << 20  # bytes read, verified and written at a time (the memory a copy needs)


@dataclass(frozen=True, slots=True)
class CopyResult:
    """What ``copy_checkpoint`` did.

    Attributes:
        files: Data files copied (referenced ones included).
        nbytes: Bytes of data copied.
        skipped: The destination held this very checkpoint already (the same index):
            nothing was written.
    """

    files: int
    nbytes: int
    skipped: bool = False


def _spans_by_file(index: Index) -> dict[str, list[BlockSpan]]:
    spans: dict[str, list[BlockSpan]] = {}
    for s in index_spans(index):
        spans.setdefault(s.chunk.file, []).append(s)
    return spans


def _verified_pieces(storage: Storage, path: str, f: FileEntry, spans: list[BlockSpan],
                     block_size: int, buf: HostBuffer,
                     on_bytes: Callable[[int], None] | None) -> Iterator[memoryview]:
    """The bytes of data file ``f`` in pieces, each checked before it is handed out."""
    stream = BlockStream(spans, block_size)
    pos = 0
    while pos < f.size:
        view = buf.view(0, min(PIECE, f.size - pos))
        try:
            storage.read_into(path, pos, view)
        except EOFError:
            raise CorruptCheckpointError("data file is truncated", file=f.name) from None
        errors = stream.feed(pos, view)
        if errors:
            raise errors[0]
        pos += len(view)
        if on_bytes is not None:
            on_bytes(len(view))
        yield view
    if stream.missing():
        s = stream.missing()[0]
        raise CorruptCheckpointError(f"block {s.number} lies beyond the end of the file",
                                     file=f.name, key=s.key)


def copy_checkpoint(src: Storage, src_path: str, dst: Storage, dst_path: str, *,
                    overwrite: bool = False, on_bytes: Callable[[int], None] | None = None,
                    carry_references: bool = True) -> CopyResult:
    """Copies the committed checkpoint at ``src_path`` to ``dst_path`` (any two backends).

    ``on_bytes(n)`` is called as data passes (progress). Without ``overwrite`` a
    destination holding the same checkpoint already (the index it would get) is left as
    it is (``skipped``); one holding another committed checkpoint is refused. With
    ``carry_references`` (the default) referenced files are copied into the destination
    checkpoint itself; without, next to it, where the references name them (see the
    module docstring).

    Raises:
        CheckpointNotFoundError: no committed checkpoint at ``src_path``.
        CorruptCheckpointError: the source is damaged (nothing is committed then).
        CheckpointError: the destination is a symbolic link, holds another checkpoint and
            not ``overwrite``, something that is not a checkpoint, or a sibling file with
            other bytes.
    """
    data, index = commit.read_index_bytes(src, src_path)
    if dst.is_link(dst_path):
        raise CheckpointError(f"the destination {dst_path!r} is a symbolic link; shardsafe never "
                              f"writes through one: give the real path it points to")
    names = _destination_names(index) if carry_references else [f.name for f in index.files]
    if names != [f.name for f in index.files]:
        data = encode_renamed(index, names)
    if same_location(src, src_path, dst, dst_path) or (
            not overwrite and commit.is_committed(dst, dst_path) and _same_index(dst, dst_path, data)):
        return CopyResult(0, 0, skipped=True)
    txn = commit.plan_transaction(dst, dst_path, overwrite=overwrite)
    spans = _spans_by_file(index)
    buf = HostBuffer(PIECE, prefault=False)
    written: list[str] = []  # sibling files this copy created
    commit.begin(txn)
    try:
        for f, name in zip(index.files, names):
            fspans = spans.get(f.name, [])
            sibling = f.reference is not None and not carry_references
            if sibling and _sibling_holds(dst, dst_path, f, fspans, index.block_size, buf):
                continue
            pieces = _verified_pieces(src, data_file(src, src_path, f.name), f, fspans,
                                      index.block_size, buf, on_bytes)
            if sibling:
                written.append(_write_sibling(dst, dst_path, f, pieces))
            else:
                dst.write_stream(dst.join(txn.workdir, name), f.size, pieces)
        commit.finish(txn, data)
    except BaseException:
        abandon(txn, written)
        raise
    finally:
        buf.close()
    return CopyResult(len(index.files), sum(f.size for f in index.files))


def _destination_names(index: Index) -> list[str]:
    """The data file names of a copy that carries its referenced files: its own files keep
    their names, each referenced one gets a name of its own."""
    taken = {f.name for f in index.files if f.reference is None}
    names = []
    for i, f in enumerate(index.files):
        name = f.name if f.reference is None else own_name(i, f.reference[1], taken)
        taken.add(name)
        names.append(name)
    return names


def same_location(a: Storage, a_path: str, b: Storage, b_path: str) -> bool:
    """Whether ``a_path`` on ``a`` and ``b_path`` on ``b`` name the same checkpoint (the
    same real local directory, or the same path on one object store with the same options)."""
    if isinstance(a, LocalStorage) and isinstance(b, LocalStorage):
        return os.path.realpath(a_path) == os.path.realpath(b_path)
    fa, fb = getattr(a, "fs", None), getattr(b, "fs", None)
    if fa is None or fb is None:
        return False
    same_fs = fa is fb or (type(fa) is type(fb) and fa.storage_options == fb.storage_options)
    return same_fs and a_path.rstrip("/") == b_path.rstrip("/")


def abandon(txn: commit.Transaction, siblings: list[str] | None = None) -> None:
    """Removes what an unfinished copy wrote (its working directory and the sibling files
    it created); a failure to is logged (another error is on its way up)."""
    for path in siblings or ():
        try:
            txn.storage.delete(path)
        except OSError as e:
            log.warning("could not remove %s of the unfinished copy: %s", path, e)
    commit.abort_quietly(txn, "copy")


def _write_sibling(dst: Storage, dst_path: str, f: FileEntry, pieces: Iterator[memoryview]) -> str:
    """Writes referenced file ``f`` into the sibling directory it names next to the
    destination (created if need be); returns its path.

    On a file system the bytes go to a hidden temporary name first and are renamed into
    place once durable, so no partial file ever carries the real name.
    """
    directory, name = f.reference  # type: ignore[misc]
    dst.makedirs(dst.join(commit.split_path(dst_path)[0], directory))
    final = dst.sibling_file(dst_path, directory, name)
    if not dst.atomic_rename:  # an object store shows an upload whole or not at all
        dst.write_stream(final, f.size, pieces)
        return final
    tmp = dst.sibling_file(dst_path, directory, f".{name}{commit.TMP_MARKER}{uuid.uuid4().hex[:16]}")
    try:
        dst.write_stream(tmp, f.size, pieces)
        dst.rename(tmp, final)
    except BaseException:
        dst.delete(tmp)
        raise
    return final


def _sibling_holds(dst: Storage, dst_path: str, f: FileEntry, spans: list[BlockSpan], block_size: int,
                   buf: HostBuffer) -> bool:
    """Whether the destination has referenced file ``f`` already, with the chunks this step
    uses intact (copied with another step of the same run).

    Raises:
        CheckpointError: a file of that name is there but holds other bytes.
    """
    directory, name = f.reference  # type: ignore[misc]
    try:
        path = dst.sibling_file(dst_path, directory, name)
        if dst.size(path) != f.size:
            raise CheckpointError(f"{path!r} exists with another size: it is not the file the copy "
                                  f"references (copy into an empty directory)")
    except FileNotFoundError:
        return False
    try:
        for _ in _verified_pieces(dst, path, f, spans, block_size, buf, None):
            pass
    except CorruptCheckpointError as e:
        raise CheckpointError(f"{path!r} exists with other bytes than the file the copy references "
                              f"({e}); copy into an empty directory") from None
    return True


def _same_index(storage: Storage, path: str, data: bytes) -> bool:
    try:
        return storage.read(storage.join(path, INDEX_NAME)) == data
    except OSError:
        return False


__all__ = ["PIECE", "CopyResult", "abandon", "copy_checkpoint", "same_location"]
