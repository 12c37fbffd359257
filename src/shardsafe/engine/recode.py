"""Copy a checkpoint with another coding (``shardsafe cp --compression``), in bounded memory.

The tensors are read in batches of at most ``BATCH`` bytes with the engine's reader
(``ChunkReader``: every block verified, compressed blocks decoded), and each batch is
written with the engine's writer as its own data file (and block file, when compressed)
of the destination's working directory (``pipeline.prepare_part``,
``Checkpointer.write_part``); the index, with the source's tree and metadata, is
published once every batch is durable (``pipeline.commit_parts``). Each source chunk
stays a chunk, cut along its first dimension where it is larger than a batch, so memory
stays near ``BATCH`` (twice that while a batch is compressed) whatever the checkpoint
holds. A batch's files are named as a rank's (``data-r<batch>-000``): the index records
which batch wrote them.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator

from .. import tensors
from ..comm import ExternalRank
from ..format.codec import check_compression
from ..format.dtypes import lookup
from ..format.index import Index, TensorEntry
from ..plan.flatten import TensorItem
from ..storage.base import Storage
from . import commit, pipeline
from .checkpointer import Checkpointer
from .copier import abandon
from .reader import ChunkReader, ReadJob

BATCH = 128 << 20  # raw bytes read, then written, at a time


def _slabs(t: int, entry: TensorEntry, limit: int) -> Iterator[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """``(tensor, offsets, shape)`` of every chunk of ``entry``, cut along its first dimension
    into slabs of at most ``limit`` bytes (at least one row each)."""
    itemsize = lookup(entry.dtype).itemsize
    for c in entry.chunks:
        if not c.shape or c.shape[0] == 0:
            yield t, tuple(c.offsets), tuple(c.shape)
            continue
        row = math.prod(c.shape[1:]) * itemsize
        rows = max(1, limit // max(1, row))
        for r in range(0, c.shape[0], rows):
            n = min(rows, c.shape[0] - r)
            yield t, (c.offsets[0] + r, *c.offsets[1:]), (n, *c.shape[1:])


def _batches(index: Index, limit: int) -> Iterator[list[tuple[int, tuple[int, ...], tuple[int, ...]]]]:
    batch: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
    size = 0
    for t, entry in enumerate(index.tensors):
        itemsize = lookup(entry.dtype).itemsize
        for slab in _slabs(t, entry, limit):
            n = math.prod(slab[2]) * itemsize
            if batch and size + n > limit:
                yield batch
                batch, size = [], 0
            batch.append(slab)
            size += n
    if batch:
        yield batch


def recode_checkpoint(src: Storage, src_path: str, dst: Storage, dst_path: str, *,
                      compression: str | None, overwrite: bool = False,
                      on_bytes: Callable[[int], None] | None = None, limit: int = BATCH) -> int:
    """Copies the committed checkpoint at ``src_path`` to ``dst_path`` coded with
    ``compression`` (None: raw); returns the bytes of tensor data copied.

    Raises:
        CheckpointNotFoundError: no committed checkpoint at ``src_path``.
        CorruptCheckpointError: the source is damaged (nothing is committed then).
        CheckpointError: the destination holds a committed checkpoint and not
            ``overwrite``, or something that is not a checkpoint.
    """
    compression = check_compression(compression)
    index = commit.read_index(src, src_path)
    reader = ChunkReader(src, src_path, index)
    table = [TensorItem(t, e.key, None, e.kind, e.dtype, tuple(e.shape), (0,) * len(e.shape), replicated=False)
             for t, e in enumerate(index.tensors)]
    batches = list(_batches(index, limit))
    txn = commit.plan_transaction(dst, dst_path, overwrite=overwrite, token=uuid.uuid4().hex[:16])
    commit.begin(txn)
    total = 0
    try:
        parts = []
        with Checkpointer() as writer:
            for b, batch in enumerate(batches):
                items, jobs = [], []
                for t, offsets, shape in batch:
                    e = index.tensors[t]
                    value, dest = tensors.empty(e.kind, e.dtype, shape)
                    jobs.append(ReadJob(e, dest, offsets, shape))
                    items.append(TensorItem(t, e.key, value, e.kind, e.dtype, tuple(e.shape), offsets,
                                            replicated=False))
                reader.run(jobs)
                prep = pipeline.prepare_part(items, txn, ExternalRank(b, len(batches)), compression)
                parts.append(writer.write_part(prep))
                nbytes = sum(it.nbytes for it in items)
                total += nbytes
                if on_bytes is not None:
                    on_bytes(nbytes)
        pipeline.commit_parts(txn, index.tree, table, parts, index.metadata, index.world_size)
    except BaseException:
        abandon(txn)
        raise
    return total


__all__ = ["BATCH", "recode_checkpoint"]
