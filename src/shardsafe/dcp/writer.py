"""``Writer``: DCP's ``StorageWriter`` that writes an ordinary shardsafe checkpoint.

DCP plans (which rank writes which chunk), gathers and scatters; the engine does the
rest, as for any shardsafe save:

- ``prepare_global_plan`` (the coordinator): the tensor table of every rank's plan
  (``translate.save_table``) and the transaction; the working directory is created.
- ``write_data`` (every rank): this rank's chunks go through the engine's save pipeline
  as a part (``engine.save.saver.Saver.write_part``): a data file per rank, CRC32C per
  16 MiB block, optional compression into a block file, fsynced. The rank's chunk
  entries ride back to the coordinator in its first ``WriteResult``; DCP's byte items
  (values DCP serialised itself), decoded into typed tree nodes where PyTorch's
  restricted unpickler allows (``byte_items``), ride in theirs.
- ``finish`` (the coordinator, once every rank's data is durable): the index, with the
  structure tree of DCP's key paths and DCP's metadata as JSON, is published atomically
  (``engine.save.prepare.build_index``). A save that fails or is killed before leaves nothing
  committed: at most the hidden working directory, which ``shardsafe gc`` removes.
"""

from __future__ import annotations

import io
import os
import uuid
from dataclasses import dataclass, replace
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from ..comm import ExternalRank, distributed_active
from ..engine import commit
from ..engine.commit import entries
from ..engine.save.options import SaveOptions
from ..engine.save.prepare import build_index
from ..engine.save.saver import Saver
from ..format.codec import Compression, check_compression
from ..plan.flatten import TensorItem
from ..storage import storage_for
from ..values.dtensor import is_dtensor
from ..values.torch import torch_dtype_name
from . import byte_items, translate


@dataclass(frozen=True, slots=True)
class _RankShare:
    """A rank's share of the save, sent with its plan (plain values: DCP pickles plans)."""

    rank: int
    world_size: int
    final: str
    workdir: str
    replace: bool
    ids: dict[str, int]  # tensor id by FQN, for this rank's tensor items
    paths: dict[str, tuple[Any, ...]]  # key path by FQN, likewise


@dataclass(frozen=True, slots=True)
class _Written:
    """A ``WriteResult``'s storage data: the rank's chunk entries (encoded), or a byte item's
    tree node (``pickle``: the node holds DCP's bytes, kept as they are)."""

    entries: bytes | None = None
    node: dict[str, Any] | None = None
    pickle: bool = False


class Writer(StorageWriter):
    """Makes ``dcp.save`` and ``dcp.async_save`` write a committed shardsafe checkpoint.

    ``dcp.save(state_dict, storage_writer=Writer("ckpt/step-100"))`` on every rank writes
    what ``shardsafe.save`` would: one data file per rank, CRC32C per block, an atomic
    commit, DCP's metadata as JSON (nothing pickled by shardsafe). ``shardsafe.load``,
    ``shardsafe verify``/``info``/``export`` and ``Reader`` read it. DCP's byte items
    (values that are not tensors, which DCP serialises itself with ``torch.save``) are
    decoded with PyTorch's restricted unpickler (``torch.load(weights_only=True)``) and
    stored as typed values, as ``shardsafe.save`` stores them (``shardsafe.load`` returns
    ``step`` as an int); only a value that unpickler refuses, or one holding tensors, is
    kept as DCP's bytes and marked as a pickle in the index.

    Args:
        path: The checkpoint's directory or fsspec URL (``dcp.save``'s ``checkpoint_id``
            replaces it when given).
        compression: As for ``shardsafe.save``: None, ``"zstd"`` or ``"auto"``.
        storage_options: Passed to fsspec for URLs.
        overwrite: Replace a committed checkpoint at ``path`` (refused otherwise).
    """

    def __init__(self, path: str | os.PathLike[str], *, compression: Compression | None = None,
                 storage_options: dict[str, Any] | None = None, overwrite: bool = False) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.compression = check_compression(compression)
        self.storage_options = storage_options
        self.overwrite = overwrite
        self._table: translate.SaveTable | None = None
        self._txn: commit.Transaction | None = None

    # ------------------------------------------------------------------ DCP's interface
    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """A new save begins (at ``checkpoint_id`` when given)."""
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._table, self._txn = None, None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Any path or fsspec URL can be written."""
        return isinstance(checkpoint_id, (str, os.PathLike))

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.path)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Refuses DCP's uncoordinated mode (``use_collectives=False``) on several ranks,
        where every rank would commit on its own."""
        if kwargs.get("use_collectives") is False and distributed_active():
            raise ValueError("shardsafe.dcp.Writer needs DCP's collectives (use_collectives=True): "
                             "one rank commits the checkpoint of all")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """The coordinator: the tensor table, the transaction, the working directory."""
        table, plans = translate.save_table(plans)
        storage, spath = storage_for(self.path, self.storage_options)
        txn = commit.plan_transaction(storage, spath, overwrite=self.overwrite, token=uuid.uuid4().hex[:16])
        commit.begin(txn)
        self._table, self._txn = table, txn
        out = []
        for rank, plan in enumerate(plans):
            fqns = [wi.index.fqn for wi in plan.items if wi.type != WriteItemType.BYTE_IO]
            part = _RankShare(rank, len(plans), txn.final, txn.workdir, txn.replace,
                         {f: table.ids[f] for f in fqns}, {f: table.items[table.ids[f]].path for f in fqns})
            out.append(replace(plan, storage_data=part))
        return out

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Writes this rank's chunks (durably) and returns their results."""
        part: _RankShare = plan.storage_data
        results: list[WriteResult] = []
        items: list[TensorItem] = []
        for wi in plan.items:
            data = planner.resolve_data(wi)
            if wi.type == WriteItemType.BYTE_IO:
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                node = byte_items.encode(raw)
                written = _Written(node=node) if node is not None else _Written(
                    node=byte_items.opaque(raw), pickle=True)
                results.append(WriteResult(wi.index, len(raw), written))
                continue
            items.append(_item(part, wi, data))
            results.append(WriteResult(wi.index, items[-1].nbytes, None))
        if items:
            storage, _ = storage_for(self.path, self.storage_options)
            txn = commit.Transaction(storage, part.final, part.workdir, part.replace)
            written = entries.encode(_engine().write_part(
                items, txn, ExternalRank(part.rank, part.world_size), self.compression))
            first = next(k for k, r in enumerate(results) if r.storage_data is None)
            results[first] = replace(results[first], storage_data=_Written(entries=written))
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The coordinator, once every rank's data is durable: publishes the index."""
        assert self._table is not None and self._txn is not None, "prepare_global_plan did not run"
        parts, nodes, pickles, raw = [], {}, [], []
        for rank_results in results:
            for r in rank_results:
                w = r.storage_data
                if isinstance(w, _Written) and w.entries is not None:
                    parts.append(entries.decode(w.entries))
                elif isinstance(w, _Written) and w.node is not None:
                    nodes[r.index.fqn] = w.node
                    if w.pickle:
                        pickles.append(r.index.fqn)
                    elif w.node.get("t") == "bytes":
                        raw.append(r.index.fqn)
        tree = translate.build_tree(self._table, nodes)
        commit.finish(self._txn, build_index(self._table.items, tree, len(results),
                                             {byte_items.DCP_KEY: byte_items.record(metadata, pickles, raw)}, parts))


def _item(part: _RankShare, wi: Any, data: Any) -> TensorItem:
    """The engine's item for one tensor write of this rank (its chunk of the global tensor)."""
    td = wi.tensor_data
    fqn = wi.index.fqn
    value = data.to_local() if is_dtensor(data) else data
    value = value.detach()
    return TensorItem(part.ids[fqn], part.paths[fqn], value, "torch", torch_dtype_name(value.dtype),
                      tuple(int(s) for s in td.size), tuple(int(o) for o in td.chunk.offsets),
                      replicated=False)


_saver: Saver | None = None


def _engine() -> Saver:
    """The engine that writes every Writer's parts in this process, its bounce buffers kept
    from one save to the next (two threads starting at once may each make one: both work)."""
    global _saver
    saver = _saver
    if saver is None or saver.closed:
        saver = _saver = Saver(SaveOptions())
    return saver


__all__ = ["Writer"]
