"""A replica: this rank's own checkpoint of a save, written from the same staged bytes.

A save may carry replicas (``SaveRequest.replicas``, each a ``request.Replica``): each is this rank's own complete
checkpoint of ``state``, a per-rank view of the saved state (the manager's local tier
saves ``{"state": LocalView(state)}``), committed at ``path`` on its own, as a
checkpoint of world size 1. Its files are more sinks of the save's streams, so nothing
leaves training memory twice:

* ``prepare_replica`` flattens the replica's state and matches its items with the items
  the save writes by memory (``values.alias_key``: the very tensors the save
  stages, seen through another key path). A data file of the save whose every item
  matches is *mirrored*: the replica's file holds the same items in the same order, so
  its data section equals the save's byte for byte; only the safetensors header, which
  names the replica's keys, differs, and headers are padded to a page, so the two data
  sections differ by a page-aligned shift (``MirrorSink``). A block file (compression)
  is mirrored whole under the same name: it has no header. The replica's other items
  (what other ranks of a collective save write, what an incremental save references
  instead of writing) go to the replica's *own* streams, staged and written like the
  save's (named ``OWN_PART`` and up, so they never clash with a mirrored name).
* A replica commits (``commit_replica``) once its own sinks are durable, before and
  apart from the save's commit; a failure of one of its sinks fails the replica alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ...comm import SingleProcessComm
from ...plan.flatten import TensorItem, flatten
from ...plan.layout import FilePlan, block_file_name, data_file_name, plan_file
from ...plan.localize import localize, write_items
from ...storage import storage_for
from ...storage.base import Storage
from ...values import alias_key
from .. import commit
from ...format.index.container import check_metadata
from ..commit.entries import BlockSums, CodedFile
from .handle import SaveProgress
from .prepare import PreparedSave, local_entries, split_coded
from .request import Replica
from .sinks import FileSink, open_sink

OWN_PART = 500  # part number of a replica's own files (a save's files are numbered from 0)


@dataclass(slots=True, eq=False)
class PreparedReplica:
    """A replica planned next to its save.

    Attributes:
        prep: The replica as a save of its own (world size 1): ``plans`` are the
            mirrored data files, then its own; ``coded`` the mirrored block file, then its own.
        mirrors: Save plan index -> replica plan index, for every mirrored data file.
        coded_mirrors: Save block plan index -> replica block plan index.
        progress: The replica's outcome (settled when it commits or fails).
        rank: The save's rank (the replica's own file names carry it).
    """

    prep: PreparedSave
    mirrors: dict[int, int]
    coded_mirrors: dict[int, int]
    progress: SaveProgress
    rank: int = 0
    items_of: dict[int, TensorItem] = field(default_factory=dict)  # id(save item) -> replica item

    def own_block_name(self, part: int) -> str:
        """The name of part ``part`` of the replica's own block file."""
        return block_file_name(self.rank, OWN_PART + part)

    def own_plans(self) -> list[FilePlan]:
        return self.prep.plans[len(self.mirrors):]

    def own_coded(self) -> list[FilePlan]:
        return self.prep.coded[len(self.coded_mirrors):]


def _key(it: TensorItem) -> Hashable | None:
    """What makes a replica item the same bytes as a save item (None: never matched)."""
    if it.nbytes == 0:
        return ("empty", it.dtype, it.local_shape)
    key = alias_key(it.value)
    return None if key is None else (key, it.dtype)


def _match(plans: Sequence[FilePlan], pool: dict[Hashable, list[TensorItem]]) -> dict[int, list[TensorItem]]:
    """For each plan whose every item is in ``pool``: the matching replica items (taken out)."""
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


def prepare_replica(save: PreparedSave, replica: Replica) -> PreparedReplica:
    """Plans ``replica`` next to ``save`` (flatten, match, lay out; writes nothing); its
    progress's ``nbytes`` becomes what is staged for the replica alone.

    Raises:
        TypeError: a value of the replica's state cannot be saved (naming its key path).
        ValueError: the metadata is not JSON.
    """
    tree, items = flatten(replica.state)
    comm = SingleProcessComm()
    localize(items, comm.group_rank)
    md = dict(replica.metadata or {})
    check_metadata(md)
    storage, spath = storage_for(replica.path)
    txn = commit.plan_transaction(storage, spath, overwrite=True, token=uuid.uuid4().hex[:16])
    pool: dict[Hashable, list[TensorItem]] = {}
    writes = write_items(items)  # jax.Arrays: their shards
    for it in reversed(writes):  # popped in order: the first of tied items matches first
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
    coded, coded_mirrors, items_of = [], {}, {}
    for j, matched in _match(save.coded, pool).items():
        coded_mirrors[j] = len(coded)
        coded.append(FilePlan(save.coded[j].name, tuple(matched), save.coded[j].layout))
        items_of.update({id(s): c for s, c in zip(save.coded[j].items, matched)})
    left = {id(it) for its in pool.values() for it in its}
    own = [it for it in writes if id(it) in left or _key(it) is None]
    plain, own_coded = split_coded(own, save.compression)
    rank = save.comm.rank
    if plain:
        plans.append(plan_file(data_file_name(rank, OWN_PART), plain))
    if own_coded:
        coded.append(plan_file(block_file_name(rank, OWN_PART), own_coded))
    prep = PreparedSave(storage, txn, tree, items, plans, md, comm, compression=save.compression, coded=coded)
    out = PreparedReplica(prep, mirrors, coded_mirrors, replica.progress, rank, items_of)
    replica.progress.nbytes = sum(p.layout.size for p in out.own_plans() + out.own_coded())  # staged for it alone
    return out


class MirrorSink:
    """Writes a save's data file's data section again into a replica's file, with its
    own header (the protocol of ``sinks.Sink``; offsets are the save file's).

    Args:
        storage: The replica's storage (ranged writes: a local path).
        path: The replica's file.
        plan: The replica's plan of this file.
        save_plan: The save's plan of the file it mirrors.
    """

    ordered = False

    def __init__(self, storage: Storage, path: str, plan: FilePlan, save_plan: FilePlan) -> None:
        sink = open_sink(storage, path, plan.layout.size)
        if not isinstance(sink, FileSink):
            sink.abort()
            raise ValueError(f"{path}: a replica needs a local path (ranged writes)")
        self.path, self._sink = path, sink
        self.start_at = save_plan.layout.data_start  # save-file offset of the data section
        self.shift = plan.layout.data_start - self.start_at
        try:
            sink.write(0, memoryview(plan.layout.header))
        except BaseException:
            sink.abort()
            raise

    def write(self, offset: int, data: memoryview, padded: memoryview | None = None) -> None:
        skip = max(0, self.start_at - offset)
        if skip >= len(data):
            return
        self._sink.write(offset + skip + self.shift, data[skip:], padded[skip:] if padded is not None else None)

    def close(self, size: int) -> None:
        self._sink.close(size + self.shift)

    def abort(self) -> None:
        self._sink.abort()


def begin_replica(r: PreparedReplica) -> None:
    """Creates the replica's working directory."""
    commit.begin(r.prep.txn)


def commit_replica(r: PreparedReplica, sums: Sequence[BlockSums | list[list[int]]],
                   coded: Sequence[CodedFile]) -> None:
    """Publishes the replica's index (its files are durable): ``sums`` of each of its
    data plans in order, ``coded`` what its block files hold (mirrored parts with the
    save's items, which are mapped to the replica's). Settles ``r.progress``."""
    try:
        mine = [replace(c, items=[r.items_of.get(id(it), it) for it in c.items]) for c in coded]
        commit.finish(r.prep.txn, r.prep.index_bytes([local_entries(r.prep, sums, mine)]))
    except BaseException as e:  # noqa: BLE001 - the replica's own outcome, delivered by its handle
        fail_replica(r, e)
        return
    r.progress.settle(None)


def fail_replica(r: PreparedReplica, error: BaseException) -> None:
    """The replica cannot be committed: remove what it wrote and settle it with ``error``."""
    commit.abort_quietly(r.prep.txn, "copy")
    r.progress.settle(error)


__all__ = ["MirrorSink", "OWN_PART", "PreparedReplica", "Replica", "begin_replica", "commit_replica",
           "fail_replica", "prepare_replica"]
