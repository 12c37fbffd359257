"""Planning a save: flatten the state, decide what this rank writes, open the transaction.

``prepare`` turns a ``SaveRequest`` into a ``PreparedSave``, the plain data every later
stage reads: the structure tree and tensor items of the state, this rank's files
(``plans``: data files; ``coded``: the block file of its compressed items), the
transaction and, for a collective save, the store channel of its two-phase commit.
With more than one rank the planning is a collective on the caller's thread
(``save.plan_exchange``: who writes what, the transaction token); with a baseline
(incremental saves) the chunks unchanged since the baseline's save are referenced
instead of written (``save.incremental``).

``prepare_part`` plans one rank's files of a save that another system plans and commits
(``shardsafe.dcp.Writer``, and ``shardsafe cp --compression``'s batches).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import knobs
from ..._version import __version__
from ...comm import Channel, Comm, ExternalRank
from ...format.index.container import check_metadata
from ...format.index.versions import WRITE_VERSION, encode_columnar
from ...format.tree import Node
from ...plan.flatten import TensorItem, flatten
from ...plan.layout import FilePlan, block_file_name, data_file_name, plan_file
from ...plan.localize import check_alone, localize, write_items
from ...storage import Deadline, Storage, storage_for
from .. import commit
from ..commit.entries import CodedFile, Entries, columnar_index, from_block_files, from_plans, join
from . import plan_exchange
from .incremental import Baseline, Delta
from .request import SaveRequest
from .units import BLOCK_SIZE

CODED_MIN = 64 << 10  # with compression, items from this size go to the block file


@dataclass(slots=True)
class PreparedSave:
    """Everything decided before any byte is copied.

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
        baseline: The manager's record of its previous save (incremental saves), advanced
            once this save commits.
        split: This rank's chunks divided into written and referenced (incremental saves).
        compression: How this rank codes the items of ``coded`` (None: nothing is coded).
        coded: The items this rank compresses, one plan per block file it begins (the
            assembler writes it in parts if large); its layout places the items in the
            staging image only (a block file has no safetensors header).
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
    baseline: Baseline | None = None
    split: Delta | None = None
    compression: str | None = None
    coded: list[FilePlan] = field(default_factory=list)

    def index_bytes(self, parts: Sequence[Entries]) -> bytes:
        """The index of the whole save from every rank's entries (``build_index``)."""
        return build_index(self.items, self.tree, self.comm.world_size, self.metadata, parts)

    @property
    def nbytes(self) -> int:
        """Bytes this rank writes (data files, headers included; compressed items at their raw size)."""
        return sum(p.layout.size for p in self.plans) + sum(p.layout.size for p in self.coded)

    def path_of(self, name: str) -> str:
        """Where the file ``name`` is written (inside the working directory)."""
        return self.storage.join(self.txn.workdir, name)


def prepare(req: SaveRequest, comm: Comm, compression: str | None) -> PreparedSave:
    """Flattens ``req.state`` and plans its save to ``req.path``; writes nothing.

    ``compression`` is the one this save uses, already checked
    (``format.codec.check_compression``; the request's own may be None: the
    Checkpointer's). With ``comm`` of more than one rank this is a collective call:
    every rank must make it.

    Raises:
        TypeError: a value cannot be saved (the message names its key path).
        CheckpointError: the path holds something that must not be overwritten, or
            (collective saves) another rank failed to prepare.
    """
    path, timeout, baseline = req.path, req.timeout, req.baseline
    storage, spath = storage_for(path, req.storage_options,
                                 deadline=Deadline.for_call(timeout, comm.rank, f"save to {path}"))
    md = dict(req.metadata or {})
    if comm.world_size > 1:
        wait = knobs.timeout() if timeout is None else float(timeout)
        p = plan_exchange.plan_collective(req.state, storage, spath, comm, overwrite=req.overwrite,
                                          metadata=md, timeout=wait)
        mine = write_items(p.mine)  # jax.Arrays: the shards this process writes
        split = baseline.split(mine, spath) if baseline is not None else None
        plain, coded = split_coded(split.write if split is not None else mine, compression)
        return PreparedSave(storage, p.txn, p.tree, p.items, [plan_file(data_file_name(comm.rank), plain)],
                            md, comm, comm.channel(p.token), wait, baseline=baseline, split=split,
                            compression=compression, coded=_block_plans(comm.rank, coded))
    tree, items = flatten(req.state)
    localize(items, comm.group_rank)  # DTensors on a one-rank mesh: their local tensor
    check_alone(items)
    writes = write_items(items)  # jax.Arrays: the shards this process writes
    check_metadata(md)
    txn = commit.plan_transaction(storage, spath, overwrite=req.overwrite, token=uuid.uuid4().hex[:16])
    split = baseline.split(writes, spath) if baseline is not None else None
    plain, coded = split_coded(split.write if split is not None else writes, compression)
    return PreparedSave(storage, txn, tree, items, [plan_file(data_file_name(comm.rank), plain)], md, comm,
                        baseline=baseline, split=split, compression=compression,
                        coded=_block_plans(comm.rank, coded))


def prepare_part(items: Sequence[TensorItem], txn: commit.Transaction, comm: ExternalRank,
                 compression: str | None = None) -> PreparedSave:
    """The files rank ``comm.rank`` writes into ``txn``'s working directory for a save that
    another system plans and commits (``items``' ids index the tensor table its
    coordinator builds). Its run ends with this rank's entries, not with a commit."""
    plain, coded = split_coded(items, compression)
    return PreparedSave(txn.storage, txn, {"t": "dict", "k": [], "v": []}, list(items),
                        [plan_file(data_file_name(comm.rank), plain)], {}, comm,
                        compression=compression, coded=_block_plans(comm.rank, coded))


def _block_plans(rank: int, items: Sequence[TensorItem]) -> list[FilePlan]:
    """The block file of this rank's compressed items (none without any)."""
    return [plan_file(block_file_name(rank), items)] if items else []


def split_coded(items: Sequence[TensorItem], compression: str | None) -> tuple[list[TensorItem], list[TensorItem]]:
    """This rank's items as (stored raw in its safetensors file, compressed in its block file).

    With compression, every item of at least ``CODED_MIN`` bytes is compressed; smaller
    ones stay raw (coding them saves next to nothing, and they stay memory-mappable).
    An incremental save passes only the items it writes (``Delta.write``).
    """
    if compression is None:
        return list(items), []
    return ([it for it in items if it.nbytes < CODED_MIN], [it for it in items if it.nbytes >= CODED_MIN])


def local_entries(prep: PreparedSave, sums: Sequence[Sequence[Sequence[int]]],
                  coded: Sequence[CodedFile] = ()) -> Entries:
    """This rank's chunk and file entries (columns), given the block checksums of its data
    files and what its block files hold, plus the chunks it references (incremental saves)."""
    plain = from_plans(prep.plans, sums, prep.comm.rank, prep.split.refs if prep.split else ())
    if not coded:
        return plain
    return join([plain, from_block_files(coded, prep.comm.rank)])


def build_index(items: Sequence[TensorItem], tree: Node, world_size: int, metadata: Mapping[str, Any],
                parts: Sequence[Entries]) -> bytes:
    """The index bytes (format ``WRITE_VERSION``) from every rank's entries, built as columns throughout.

    Raises:
        CheckpointError: the ranks' chunks do not hold exactly each tensor's elements.
    """
    index = columnar_index(items, parts, BLOCK_SIZE, tree=tree, world_size=world_size, created=time.time(),
                           metadata=dict(metadata), library=f"shardsafe {__version__}")
    return encode_columnar(index, WRITE_VERSION)


__all__ = ["CODED_MIN", "PreparedSave", "build_index", "local_entries", "prepare", "prepare_part", "split_coded"]
