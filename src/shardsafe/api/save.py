"""Synchronous save: flatten, lay out, stage, write, commit."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import __version__
from ..comm import distributed_active, get_comm
from ..engine import commit, staging
from ..engine.buffers import HostBuffer
from ..format import index as fmt
from ..format.tree import Node
from ..plan.flatten import TensorItem, flatten
from ..plan.layout import FilePlan, chunk_entries, data_file_name, plan_file
from ..storage import Storage, storage_for
from . import collective

log = logging.getLogger("shardsafe")

BLOCK_SIZE = 16 << 20  # checksum block: partial (resharded) reads verify whole blocks


@dataclass(slots=True)
class PreparedSave:
    """Everything decided before any byte is copied."""

    storage: Storage
    txn: commit.Transaction
    tree: Node
    items: list[TensorItem]
    plans: list[FilePlan]
    metadata: dict[str, Any]


def prepare(state: Mapping[str, Any], path: str, *, overwrite: bool = False,
            metadata: Mapping[str, Any] | None = None,
            storage_options: dict | None = None) -> PreparedSave:
    """Flattens ``state`` and plans the files; raises before anything is written."""
    storage, spath = storage_for(path, storage_options)
    tree, items = flatten(state)
    md = dict(metadata or {})
    fmt.encode_index(fmt.Index(tree={"t": "dict", "k": [], "v": []}, tensors=(), files=(),
                               block_size=BLOCK_SIZE, metadata=md))  # metadata must be JSON
    txn = commit.plan_transaction(storage, spath, overwrite=overwrite)
    plans = [plan_file(data_file_name(0), items)]
    return PreparedSave(storage, txn, tree, items, plans, md)


def build_index(prep: PreparedSave, sums: list[list[list[int]]], world_size: int = 1) -> bytes:
    """The index bytes for a save whose files ``prep.plans`` have checksums ``sums``."""
    chunks: dict[int, fmt.ChunkEntry] = {}
    for plan, s in zip(prep.plans, sums):
        chunks.update(chunk_entries(plan, s))
    tensors = tuple(fmt.TensorEntry(key=it.path, kind=it.kind, dtype=it.dtype, shape=it.shape,
                                    chunks=(chunks[it.id],)) for it in prep.items)
    files = tuple(fmt.FileEntry(p.name, p.layout.size, p.layout.data_start, 0) for p in prep.plans)
    index = fmt.Index(tree=prep.tree, tensors=tensors, files=files, block_size=BLOCK_SIZE,
                      world_size=world_size, created=time.time(), metadata=prep.metadata,
                      library=f"shardsafe {__version__}")
    return fmt.encode_index(index)


def write_and_commit(prep: PreparedSave, buffers: list[HostBuffer]) -> None:
    """Checksums and writes the staged files, then publishes the index (commit)."""
    s, txn = prep.storage, prep.txn
    sums = [staging.checksums(p, b.array, BLOCK_SIZE) for p, b in zip(prep.plans, buffers)]
    commit.begin(txn)
    try:
        for p, b in zip(prep.plans, buffers):
            s.write(s.join(txn.workdir, p.name), [b.view(0, p.layout.size)])
        commit.finish(txn, build_index(prep, sums))
    except BaseException:
        commit.abort(txn)
        raise


def stage_all(prep: PreparedSave) -> list[HostBuffer]:
    """Copies every item into fresh page-aligned host buffers (one per data file)."""
    buffers = []
    for p in prep.plans:
        buf = HostBuffer(p.layout.size)
        staging.stage(p, buf.array)
        buffers.append(buf)
    return buffers


def save(state: Mapping[str, Any], path: str, *, overwrite: bool = False,
         metadata: Mapping[str, Any] | None = None, storage_options: dict | None = None,
         process_group: Any = None, timeout: float | None = None) -> None:
    """Saves ``state`` to ``path`` and returns once the checkpoint is committed and durable.

    Args:
        state: A mapping of tensors, arrays, containers, plain values and Stateful objects.
        path: Checkpoint directory (or fsspec URL).
        overwrite: Replace an existing committed checkpoint (atomically where possible).
        metadata: JSON-serialisable user metadata stored in the index.
        storage_options: Passed to fsspec for URLs.
        process_group: With torch.distributed initialised, the save is collective over
            this group (default: the world group); every rank must call it.
        timeout: Seconds a rank of a collective save waits for the others before
            raising CheckpointTimeoutError (default ``SHARDSAFE_TIMEOUT`` or 600).

    Raises:
        TypeError: A value cannot be saved safely (the message names its key path).
        CheckpointError: The path holds something that must not be overwritten, or
            another rank of a collective save failed.
        CheckpointTimeoutError: Another rank did not answer within ``timeout``.
    """
    if distributed_active(process_group):
        collective.save(state, path, get_comm(process_group), overwrite=overwrite,
                        metadata=metadata, storage_options=storage_options, timeout=timeout)
        return
    prep = prepare(state, path, overwrite=overwrite, metadata=metadata,
                   storage_options=storage_options)
    buffers = stage_all(prep)
    try:
        write_and_commit(prep, buffers)
    finally:
        for b in buffers:
            b.close()
