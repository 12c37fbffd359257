"""The save pipeline, in phases that sync, async and distributed saves share.

    (a) flatten   state -> structure tree + tensor items           (caller thread)
    (b) plan      which items this rank writes, file layouts,
                  transaction (token agreed through ``comm``)       (caller thread)
    (c) stage     copy into host buffers (async) or bounce per unit (sync)
    (d) write     checksum + write every unit, fsync each file      (I/O pool)
    (e) commit    gather chunk entries; the coordinator publishes the index

Collectives go through a ``comm.Comm`` (``SingleProcess`` for world size 1), the seam
where distributed saves plug in: phase (b) asks ``assign`` which items this rank
writes, phase (e) gathers every rank's chunk entries on rank 0.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._version import __version__
from ..comm import Comm, SingleProcess
from ..errors import CheckpointError
from ..format import index as fmt
from ..format.tree import Node
from ..plan.flatten import TensorItem, flatten
from ..plan.layout import FilePlan, data_file_name, plan_file
from ..storage import Storage, storage_for
from . import commit
from .units import item_nbytes, item_shape

log = logging.getLogger("shardsafe")

BLOCK_SIZE = 16 << 20  # checksum block: partial (resharded) reads verify whole blocks
UNIT_SIZE = 16 << 20  # write/staging unit: big enough for full-speed direct I/O, small
#                       enough that writes start while later units are still staged

#: Chooses the items this rank writes (phase b). World size 1: all of them.
Assign = Callable[[Sequence[TensorItem], Comm], list[TensorItem]]


def write_all(items: Sequence[TensorItem], comm: Comm) -> list[TensorItem]:
    """The single-process assignment: this rank writes every item."""
    return list(items)


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
    """

    storage: Storage
    txn: commit.Transaction
    tree: Node
    items: list[TensorItem]
    plans: list[FilePlan]
    metadata: dict[str, Any]
    comm: Comm

    @property
    def nbytes(self) -> int:
        """Bytes this rank writes (data files, headers included)."""
        return sum(p.layout.size for p in self.plans)

    def file_path(self, plan: FilePlan) -> str:
        return self.storage.join(self.txn.workdir, plan.name)


def prepare(state: Mapping[str, Any], path: str, *, overwrite: bool = False,
            metadata: Mapping[str, Any] | None = None, storage_options: dict | None = None,
            comm: Comm | None = None, assign: Assign = write_all) -> PreparedSave:
    """Phases (a) and (b): flattens ``state`` and plans the save; writes nothing.

    Raises:
        TypeError: a value cannot be saved (the message names its key path).
        CheckpointError: the path holds something that must not be overwritten.
    """
    comm = comm or SingleProcess()
    storage, spath = storage_for(path, storage_options)
    tree, items = flatten(state)
    md = dict(metadata or {})
    fmt.encode_index(fmt.Index(tree={"t": "dict", "k": [], "v": []}, tensors=(), files=(),
                               block_size=BLOCK_SIZE, metadata=md))  # metadata must be JSON
    token = comm.broadcast(uuid.uuid4().hex[:16] if comm.rank == 0 else None)
    txn = commit.plan_transaction(storage, spath, overwrite=overwrite, token=token)
    mine = assign(items, comm)
    plans = [plan_file(data_file_name(comm.rank), mine)]
    return PreparedSave(storage, txn, tree, items, plans, md, comm)


def begin(prep: PreparedSave) -> None:
    """Creates the working directory (coordinator) before any rank writes into it."""
    if prep.comm.rank == 0:
        commit.begin(prep.txn)
    prep.comm.barrier()


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
        # plan.layout.chunk_entries, with the item sizes read the fast way
        for it, off, blocks in zip(plan.items, plan.layout.offsets, s):
            c = fmt.ChunkEntry(file=plan.name, offset=off, nbytes=item_nbytes(it), offsets=it.offsets,
                               shape=item_shape(it), checksums=tuple(blocks))
            by_item.setdefault(it.id, []).append(c)
    files = [fmt.FileEntry(p.name, p.layout.size, p.layout.data_start, prep.comm.rank)
             for p in prep.plans]
    return by_item, files


def commit_save(prep: PreparedSave, sums: Sequence[list[list[int]]]) -> None:
    """Phase (e): gathers every rank's entries; the coordinator publishes the index.

    Raises:
        CheckpointError: the coordinator failed to commit (on every rank).
    """
    parts = prep.comm.gather(local_entries(prep, sums))
    failure: str | None = None
    if prep.comm.rank == 0:
        try:
            commit.finish(prep.txn, build_index(prep, parts or []))
        except (OSError, CheckpointError) as e:
            failure = f"{type(e).__name__}: {e}"
            prep.comm.broadcast(failure)
            raise
    failure = prep.comm.broadcast(failure)
    if failure is not None:
        raise CheckpointError(f"the coordinator failed to commit {prep.txn.final!r}: {failure}")


def abort(prep: PreparedSave) -> None:
    """Removes what a failed save wrote (never a committed checkpoint); logs cleanup errors.

    Called while another error propagates, so a failure to clean up is logged rather
    than raised over the error that matters.
    """
    if prep.comm.rank != 0:
        return
    try:
        commit.abort(prep.txn)
    except OSError as e:
        log.warning("could not remove the unfinished save %s: %s", prep.txn.workdir, e)
