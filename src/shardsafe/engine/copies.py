"""A rank's own copy of a save, written from the same staged bytes (stage once, write twice).

A save may carry copies (``Checkpointer.async_save(..., copies=[Copy(state, path)])``):
each is this rank's own complete checkpoint of ``state``, a per-rank view of the saved
state (the manager's local tier saves ``{"state": LocalView(state)}``), committed at
``path`` on its own, as a checkpoint of world size 1. It is written from the bytes the
save copies out of training memory anyway, so nothing leaves training memory twice:

* ``prepare_copy`` flattens the copy's state and matches its items with the items the
  save writes by memory (``plan.flatten.alias_key``: the very tensors the save stages,
  seen through another key path). A data file of the save whose every item matches is
  *mirrored*: the copy's file holds the same items in the same order, so its data
  section equals the save's byte for byte; only the safetensors header, which names
  the copy's keys, differs, and headers are padded to a page, so the two data sections
  differ by a page-aligned shift. A block file (compression) is mirrored whole: it has
  no header. The copy's other items (what other ranks of a collective save write, what
  an incremental save references instead of writing) go to the copy's *own* files,
  staged and written like the save's (named ``OWN_PART`` and up, so they never clash
  with a mirrored name).
* While the save writes a unit of a mirrored file, ``MirrorFile`` writes the same
  bytes into the copy's file, from the same staging buffer before it is released (so a
  memory budget covers both), and takes the block checksums the save computes; a
  mirrored block file is written from the same coded bytes (``MirrorBlocks``).
* The copy commits (``commit_copy``) once its files are durable, before and apart from
  the save's own commit. A mirror records its own errors instead of raising them, so a
  failure of one destination fails only that destination.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..comm import SingleProcessComm
from ..plan.flatten import TensorItem, alias_key, flatten
from ..plan.layout import FilePlan, block_file_name, data_file_name, plan_file
from ..plan.jax_shards import write_items
from ..plan.localize import localize
from ..storage import storage_for
from ..storage.base import RangeWriter, Storage
from ..storage.files import with_path
from . import commit
from .entries import CodedFile
from .handle import SaveHandle
from .prepared import PreparedSave, build_index, check_metadata, local_entries, split_coded

OWN_PART = 500  # part number of a copy's own files (a save's files are numbered from 0)


@dataclass(slots=True)
class Copy:
    """Also write this rank's own checkpoint of ``state`` at ``path`` (a local path).

    Attributes:
        state: This rank's view of the saved state (the same tensors, e.g. DTensors as
            their local shards); saved by this rank alone.
        path: Where the copy is committed (replacing a checkpoint there).
        metadata: JSON-serialisable metadata of the copy's index.
        handle: Set by the save that writes the copy: settles once the copy is
            committed (``result()`` returns) or has failed (it raises the error).
    """

    state: Mapping[str, Any]
    path: str
    metadata: Mapping[str, Any] | None = None
    handle: SaveHandle | None = field(default=None, init=False)


@dataclass(slots=True)
class PreparedCopy:
    """A copy planned next to its save.

    Attributes:
        prep: The copy as a save of its own (world size 1): ``plans`` are the mirrored
            data files, then its own; ``coded`` the mirrored block files, then its own.
        mirrors: Save plan index -> copy plan index, for every mirrored data file.
        coded_mirrors: Save block plan index -> copy block plan index.
        handle: The copy's outcome (settled when it commits or fails).
        rank: The save's rank (the copy's own file names carry it).
        targets: The mirror targets of the copy's mirrored files (filled when the writes
            are made).
        error: Why the copy cannot be written (set by ``begin_copy``), else None.
    """

    prep: PreparedSave
    mirrors: dict[int, int]
    coded_mirrors: dict[int, int]
    handle: SaveHandle
    rank: int = 0
    targets: list[Any] = field(default_factory=list)
    error: BaseException | None = None

    def own_block_name(self, part: int) -> str:
        """The name of part ``part`` of the copy's own block file."""
        return block_file_name(self.rank, OWN_PART + part)

    def own_plans(self) -> list[FilePlan]:
        return self.prep.plans[len(self.mirrors):]

    def own_coded(self) -> list[FilePlan]:
        return self.prep.coded[len(self.coded_mirrors):]


def _key(it: TensorItem) -> Hashable | None:
    """What makes a copy item the same bytes as a save item (None: never matched)."""
    if it.nbytes == 0:
        return ("empty", it.dtype, it.local_shape)
    key = alias_key(it.value)
    return None if key is None else (key, it.dtype)


def _match(plans: Sequence[FilePlan], pool: dict[Hashable, list[TensorItem]]) -> dict[int, list[TensorItem]]:
    """For each plan whose every item is in ``pool``: the matching copy items (taken out)."""
    out = {}
    for j, plan in enumerate(plans):
        taken: list[tuple[Hashable, TensorItem]] = []
        for it in plan.items:
            k = _key(it)
            if k is None or not pool.get(k):
                break
            taken.append((k, pool[k].pop()))
        else:
            out[j] = [c for _, c in taken]
            continue
        for k, c in taken:  # not mirrored: give the items back
            pool[k].append(c)
    return out


def _same_data(a: FilePlan, b: FilePlan) -> bool:
    """Whether two plans place their data sections identically (only headers differ)."""
    da, db = a.layout.data_start, b.layout.data_start
    return a.layout.size - da == b.layout.size - db and \
        all(x - da == y - db for x, y in zip(a.layout.offsets, b.layout.offsets))


def prepare_copy(save: PreparedSave, copy: Copy) -> PreparedCopy:
    """Plans ``copy`` next to ``save`` (flatten, match, lay out; writes nothing). The
    caller has given ``copy`` its ``handle``, whose ``nbytes`` become what is staged for
    the copy alone.

    Raises:
        TypeError: a value of the copy's state cannot be saved (naming its key path).
        ValueError: the metadata is not JSON.
    """
    tree, items = flatten(copy.state)
    comm = SingleProcessComm()
    localize(items, comm.group_rank)
    md = dict(copy.metadata or {})
    check_metadata(md)
    storage, spath = storage_for(copy.path)
    txn = commit.plan_transaction(storage, spath, overwrite=True, token=uuid.uuid4().hex[:16])
    pool: dict[Hashable, list[TensorItem]] = {}
    writes = write_items(items)  # jax.Arrays: their shards
    for it in reversed(writes):  # popped in order: the first of tied copies matches first
        k = _key(it)
        if k is not None:
            pool.setdefault(k, []).append(it)
    plans, mirrors = [], {}
    for j, matched in _match(save.plans, pool).items():
        mine = plan_file(save.plans[j].name, matched)
        if _same_data(mine, save.plans[j]):
            mirrors[j] = len(plans)
            plans.append(mine)
        else:
            for it in matched:
                pool.setdefault(_key(it), []).append(it)
    coded, coded_mirrors = [], {}
    for j, matched in _match(save.coded, pool).items():
        coded_mirrors[j] = len(coded)
        coded.append(FilePlan(save.coded[j].name, tuple(matched), save.coded[j].layout))
    left = {id(it) for its in pool.values() for it in its}
    own = [it for it in writes if id(it) in left or _key(it) is None]
    plain, own_coded = split_coded(own, save.compression)
    rank = save.comm.rank
    if plain:
        plans.append(plan_file(data_file_name(rank, OWN_PART), plain))
    if own_coded:
        coded.append(plan_file(block_file_name(rank, OWN_PART), own_coded))
    prep = PreparedSave(storage, txn, tree, items, plans, md, comm, compression=save.compression, coded=coded)
    assert copy.handle is not None
    out = PreparedCopy(prep, mirrors, coded_mirrors, copy.handle, rank)
    out.handle.nbytes = sum(p.layout.size for p in out.own_plans() + out.own_coded())  # staged for it alone
    return out


class MirrorFile:
    """Writes a save's data file's data section again into a copy's file, with its header.

    Args:
        copy: The copy (storage and working directory).
        plan: The copy's plan of this file.
        save_plan: The save's plan of the file it mirrors.

    Every method records its failure (``error``) instead of raising it.
    """

    def __init__(self, copy: PreparedCopy, plan: FilePlan, save_plan: FilePlan) -> None:
        self.storage: Storage = copy.prep.storage
        self.path = copy.prep.file_path(plan)
        self.plan = plan
        self.start_at = save_plan.layout.data_start  # save-file offset of the data section
        self.shift = plan.layout.data_start - self.start_at
        self.error: BaseException | None = None
        self.sums: list[list[int]] | None = None
        self.done = threading.Event()  # set by finish (the copy may commit once all are)
        self._writer: RangeWriter | None = None

    def _record(self, e: BaseException) -> None:
        if self.error is None:
            self.error = with_path(e, self.path)

    def start(self) -> None:
        """Creates the file and writes its header."""
        try:
            self._writer = self.storage.open_writer(self.path, self.plan.layout.size)
            if self._writer is None:
                raise ValueError(f"{self.path}: a copy needs a local path (ranged writes)")
            self._writer.write_at(0, memoryview(self.plan.layout.header))
        except Exception as e:  # noqa: BLE001 - recorded: only this copy fails
            self._record(e)

    def write(self, offset: int, data: memoryview) -> None:
        """Writes the data-section part of the save-file bytes ``data`` found at ``offset``."""
        if self.error is not None or self._writer is None:
            return
        skip = max(0, self.start_at - offset)
        if skip >= len(data):
            return
        try:
            self._writer.write_at(offset + skip + self.shift, data[skip:])
        except Exception as e:  # noqa: BLE001 - recorded: only this copy fails
            self._record(e)

    def write_gather(self, offset: int, views: Sequence[memoryview]) -> None:
        """``write`` of bytes given as consecutive pieces."""
        for v in views:
            self.write(offset, memoryview(v).cast("B"))
            offset += len(v)

    def finish(self, sums: list[list[int]] | None, error: BaseException | None = None) -> None:
        """Makes the file durable and keeps the save's checksums of it (``error``: the
        save could not produce them, so the copy fails too)."""
        if self.done.is_set():
            return
        if error is not None:
            self._record(error)
        w, self._writer = self._writer, None
        try:
            if w is not None and self.error is None:
                w.close(sync=True)
                self.sums = [list(s) for s in sums or []]
            elif w is not None:
                w.abort()
        except Exception as e:  # noqa: BLE001 - recorded: only this copy fails
            self._record(e)
            w.abort()
        finally:
            self.done.set()


class MirrorBlocks:
    """Writes a save's block file(s) again into a copy (the same bytes: no header).

    Args:
        copy: The copy (storage and working directory).
        plan: The copy's plan of the block file (its items, aligned with the save's).
        save_plan: The save's plan of the block file.
    """

    def __init__(self, copy: PreparedCopy, plan: FilePlan, save_plan: FilePlan) -> None:
        self.storage: Storage = copy.prep.storage
        self.path_of = copy.prep.path_of
        self._items = {id(s): c for s, c in zip(save_plan.items, plan.items)}
        self.error: BaseException | None = None
        self.coded: list[CodedFile] | None = None
        self.done = threading.Event()  # set by finish (the copy may commit once all are)
        self._writers: dict[str, RangeWriter] = {}

    def _record(self, e: BaseException, path: str) -> None:
        if self.error is None:
            self.error = with_path(e, path)

    def write_file(self, name: str, buffers: Sequence[memoryview]) -> None:
        """A whole part file, as the save writes it."""
        if self.error is None:
            try:
                self.storage.write(self.path_of(name), buffers)
            except Exception as e:  # noqa: BLE001 - recorded: only this copy fails
                self._record(e, self.path_of(name))

    def write_at(self, name: str, bound: int, offset: int, data: memoryview) -> None:
        """A range of a part file the save writes piece by piece (``bound``: its size limit)."""
        if self.error is not None:
            return
        try:
            w = self._writers.get(name)
            if w is None:
                w = self._writers[name] = self.storage.open_writer(self.path_of(name), bound)  # type: ignore[assignment]
            w.write_at(offset, data)
        except Exception as e:  # noqa: BLE001 - recorded: only this copy fails
            self._record(e, self.path_of(name))

    def finish(self, coded: Sequence[CodedFile] | None, error: BaseException | None = None) -> None:
        """Closes the files written piece by piece (at their final sizes, from ``coded``)
        and keeps what each part holds, with the copy's items."""
        if self.done.is_set():
            return
        try:
            self._finish(coded, error)
        finally:
            self.done.set()

    def _finish(self, coded: Sequence[CodedFile] | None, error: BaseException | None) -> None:
        if error is not None and self.error is None:
            self.error = error
        sizes = {c.name: c.size for c in coded or []}
        for name, w in self._writers.items():
            try:
                if self.error is None:
                    w.size = sizes[name]
                    w.close(sync=True)
                    continue
            except Exception as e:  # noqa: BLE001 - recorded: only this copy fails
                self._record(e, self.path_of(name))
            w.abort()
        self._writers = {}
        if self.error is None:
            self.coded = [replace(c, items=[self._items[id(it)] for it in c.items]) for c in coded or []]


def begin_copy(copy: PreparedCopy) -> None:
    """Creates the copy's working directory; a failure fails the copy alone (``error``)."""
    try:
        commit.begin(copy.prep.txn)
    except OSError as e:
        copy.error = with_path(e, copy.prep.txn.workdir)


def commit_copy(copy: PreparedCopy, own: Sequence[Any]) -> None:
    """Commits the copy once its mirrored files (``copy.targets``, waited for) and its own
    writes (``own``: the finished results of ``own_plans`` then ``own_coded``) are
    durable; else removes what it wrote. Settles ``copy.handle`` either way."""
    try:
        for t in copy.targets:
            t.done.wait()
            if t.error is not None:
                raise t.error
        n_plain = len(copy.own_plans())
        files = [t for t in copy.targets if isinstance(t, MirrorFile)]
        sums = [t.sums for t in files] + list(own[:n_plain])
        coded = [f for t in copy.targets if isinstance(t, MirrorBlocks) for f in t.coded or []]
        coded += [f for part in own[n_plain:] for f in part]
        commit.finish(copy.prep.txn, build_index(copy.prep, [local_entries(copy.prep, sums, coded)]))
    except BaseException as e:  # noqa: BLE001 - the copy's own outcome, delivered by its handle
        commit.abort_quietly(copy.prep.txn, "copy")
        copy.handle.settle(e)
        return
    copy.handle.settle(None)


def fail_copy(copy: PreparedCopy, error: BaseException) -> None:
    """The copy cannot be written (the save failed before writing): remove what it wrote."""
    for t in copy.targets:
        t.finish(None, error)
    commit.abort_quietly(copy.prep.txn, "copy")
    copy.handle.settle(error)


__all__ = ["Copy", "MirrorBlocks", "MirrorFile", "OWN_PART", "PreparedCopy", "begin_copy", "commit_copy",
           "fail_copy", "prepare_copy"]
