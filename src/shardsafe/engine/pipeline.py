"""The save pipeline, in phases that sync, async and distributed saves share.

    (a) flatten   state -> structure tree + tensor items           (caller thread)
    (b) plan      which items this rank writes, file layouts,
                  transaction (token agreed through ``comm``)       (caller thread)
    (c) stage     copy into host buffers (async) or bounce per unit (sync)
    (d) write     checksum + write every unit, fsync each file      (I/O pool)
    (e) commit    gather chunk entries; the coordinator publishes the index

Collectives go through a ``comm.Comm`` (``SingleProcess`` for world size 1). With
more than one rank, ``engine.collective`` supplies phase (b) (a planning collective on
the caller's thread: who writes what, the transaction token) and the store-only
begin/commit/abort that may run on a background thread (a two-phase commit with a
bounded ``timeout``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._version import __version__
from ..comm import Channel, Comm, get_comm
from ..format import index as fmt
from ..format.tree import Node
from ..plan.flatten import TensorItem, flatten
from ..plan.layout import FilePlan, chunk_entries, data_file_name, plan_file
from ..plan.sharding import localize
from ..storage import Storage, storage_for
from . import collective, commit

log = logging.getLogger("shardsafe")

BLOCK_SIZE = 16 << 20  # checksum block: partial (resharded) reads verify whole blocks
UNIT_SIZE = 16 << 20  # write/staging unit: big enough for full-speed direct I/O, small
#                       enough that writes start while later units are still staged

@dataclass(slots=True)
class PreparedSave:
    """Everything decided before any byte is copied (phases a and b).

    Attributes:
        storage: Backend of the checkpoint.
        txn: The transaction (working directory, final path).
        tree: Structure tree of the whole state.
        items: Every tensor item of the state (index order).
        plans: The data files this rank writes.
        metadata: User metadata for the index.
        comm: The group of ranks taking part.
        channel: Store channel of this save (None for world size 1).
        timeout: Seconds a rank waits for the others (collective saves).
        reported: This rank has told rank 0 how its part went (collective saves).
    """

    storage: Storage
    txn: commit.Transaction
    tree: Node
    items: list[TensorItem]
    plans: list[FilePlan]
    metadata: dict[str, Any]
    comm: Comm
    channel: Channel | None = None
    timeout: float = 0.0
    reported: bool = False

    @property
    def nbytes(self) -> int:
        """Bytes this rank writes (data files, headers included)."""
        return sum(p.layout.size for p in self.plans)

    def file_path(self, plan: FilePlan) -> str:
        return self.storage.join(self.txn.workdir, plan.name)


def prepare(state: Mapping[str, Any], path: str, *, overwrite: bool = False,
            metadata: Mapping[str, Any] | None = None, storage_options: dict | None = None,
            comm: Comm | None = None, timeout: float | None = None) -> PreparedSave:
    """Phases (a) and (b): flattens ``state`` and plans the save; writes nothing.

    With ``comm`` of more than one rank (default: the initialised torch.distributed
    world, if any) this is a collective call: every rank must make it.

    Raises:
        TypeError: a value cannot be saved (the message names its key path).
        CheckpointError: the path holds something that must not be overwritten, or
            (collective saves) another rank failed to prepare.
    """
    comm = comm or get_comm()
    storage, spath = storage_for(path, storage_options)
    md = dict(metadata or {})

    def check_metadata() -> None:  # raises TypeError/ValueError unless it is JSON
        fmt.encode_index(fmt.Index(tree={"t": "dict", "k": [], "v": []}, tensors=(), files=(),
                                   block_size=BLOCK_SIZE, metadata=md))

    if comm.world_size > 1:
        p = collective.plan_collective(state, storage, spath, comm, overwrite=overwrite,
                                       check_metadata=check_metadata)
        wait = collective.default_timeout() if timeout is None else float(timeout)
        return PreparedSave(storage, p.txn, p.tree, p.items, [plan_file(data_file_name(comm.rank), p.mine)],
                            md, comm, comm.channel(p.token), wait)
    tree, items = flatten(state)
    localize(items, comm.group_rank)  # DTensors on a one-rank mesh: their local tensor
    check_metadata()
    txn = commit.plan_transaction(storage, spath, overwrite=overwrite, token=uuid.uuid4().hex[:16])
    plans = [plan_file(data_file_name(comm.rank), items)]
    return PreparedSave(storage, txn, tree, items, plans, md, comm)


def begin(prep: PreparedSave) -> None:
    """Creates the working directory (coordinator) before any rank writes into it."""
    if prep.channel is not None:
        collective.begin(prep)
    else:
        commit.begin(prep.txn)


def build_index(prep: PreparedSave, parts: Sequence[tuple[dict[int, list[fmt.ChunkEntry]],
                                                          list[fmt.FileEntry]]]) -> bytes:
    """The index bytes from every rank's ``(chunks by item id, files)``."""
    chunks: dict[int, list[fmt.ChunkEntry]] = {}
    files: list[fmt.FileEntry] = []
    for by_item, fs in parts:
        for i, cs in by_item.items():
            chunks.setdefault(i, []).extend(cs)
        files.extend(fs)
    tensors = tuple(fmt.TensorEntry(key=it.path, kind=it.kind, dtype=it.dtype, shape=it.shape,
                                    chunks=_ordered(chunks.get(it.id, [])))
                    for it in prep.items)
    index = fmt.Index(tree=prep.tree, tensors=tensors, files=tuple(files), block_size=BLOCK_SIZE,
                      world_size=prep.comm.world_size, created=time.time(), metadata=prep.metadata,
                      library=f"shardsafe {__version__}")
    return fmt.encode_index(index)


def _ordered(cs: list[fmt.ChunkEntry]) -> tuple[fmt.ChunkEntry, ...]:
    """Chunks in global-offset order (most tensors have one: skip the sort)."""
    return tuple(cs) if len(cs) < 2 else tuple(sorted(cs, key=lambda c: c.offsets))


def local_entries(prep: PreparedSave, sums: Sequence[list[list[int]]]
                  ) -> tuple[dict[int, list[fmt.ChunkEntry]], list[fmt.FileEntry]]:
    """This rank's chunk and file entries, given the block checksums of its files."""
    by_item: dict[int, list[fmt.ChunkEntry]] = {}
    for plan, s in zip(prep.plans, sums):
        for item_id, c in chunk_entries(plan, s):
            by_item.setdefault(item_id, []).append(c)
    files = [fmt.FileEntry(p.name, p.layout.size, p.layout.data_start, prep.comm.rank)
             for p in prep.plans]
    return by_item, files


def commit_save(prep: PreparedSave, sums: Sequence[list[list[int]]]) -> None:
    """Phase (e): the coordinator publishes the index once every rank's files are durable.

    Collective saves use the store-only two-phase commit of ``engine.collective``
    (safe on a background thread).

    Raises:
        CheckpointError: the commit failed (collective saves: on every rank).
        CheckpointTimeoutError: another rank did not answer within the timeout.
    """
    if prep.channel is None:
        commit.finish(prep.txn, build_index(prep, [local_entries(prep, sums)]))
        return
    collective.commit_save(prep, collective.encode_entries(*local_entries(prep, sums)), build_index)


def abort(prep: PreparedSave, error: BaseException | None = None) -> None:
    """Removes what a failed save wrote (never a committed checkpoint); logs cleanup errors.

    Called while another error propagates, so a failure to clean up is logged rather
    than raised over the error that matters. In a collective save it also tells the
    other ranks (``error`` says why), so nothing commits and nobody waits for this rank.
    """
    if prep.channel is not None:
        collective.abort(prep, error)
    if prep.comm.rank != 0:
        return
    try:
        commit.abort(prep.txn)
    except OSError as e:
        log.warning("could not remove the unfinished save %s: %s", prep.txn.workdir, e)
