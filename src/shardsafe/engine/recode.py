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

The copy's index metadata records what it was made from (``COPY_KEY``: the SHA-256 of the
source's index and the coding), so copying the same source the same way again finds the
destination up to date (an interrupted ``cp --all --compression`` runs again and codes
only what is missing). Re-coding a checkpoint onto itself is refused where the store
cannot rename (replacing it there deletes the source first).
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Callable, Iterator

from .. import tensors
from ..comm import ExternalRank
from ..errors import CheckpointError
from ..format.codec import check_compression
from ..format.dtypes import lookup
from ..format.index.objects import Index, TensorEntry
from ..plan.flatten import TensorItem
from ..storage.base import Storage
from . import commit, pipeline
from .checkpointer import Checkpointer
from .copier import CopyResult, abandon, same_location
from .reader import ChunkReader, ReadJob

BATCH = 128 << 20  # raw bytes read, then written, at a time
COPY_KEY = "shardsafe.copy"  # index metadata of a re-coded copy: {"source": sha256, "compression": ...}


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
                      on_bytes: Callable[[int], None] | None = None, limit: int = BATCH) -> CopyResult:
    """Copies the committed checkpoint at ``src_path`` to ``dst_path`` coded with
    ``compression`` (None: raw). ``nbytes`` of the result counts tensor data; a
    destination that is a copy of this very source coded the same way is left as it is
    (``skipped``) unless ``overwrite``.

    Raises:
        CheckpointNotFoundError: no committed checkpoint at ``src_path``.
        CorruptCheckpointError: the source is damaged (nothing is committed then).
        CheckpointError: the destination holds another committed checkpoint and not
            ``overwrite``, something that is not a checkpoint, or is the source itself on
            a store that cannot rename.
    """
    compression = check_compression(compression)
    data, index = commit.read_index_bytes(src, src_path)
    made_from = {"source": hashlib.sha256(data).hexdigest(), "compression": compression or "none"}
    if same_location(src, src_path, dst, dst_path) and not dst.atomic_rename:
        raise CheckpointError(f"{dst_path!r} is the source itself: this store cannot replace a "
                              f"checkpoint without deleting it first; copy it to another path")
    if not overwrite and _copied_from(dst, dst_path) == made_from:
        return CopyResult(0, 0, skipped=True)
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
        pipeline.commit_parts(txn, index.tree, table, parts, {**index.metadata, COPY_KEY: made_from},
                              index.world_size)
    except BaseException:
        abandon(txn)
        raise
    return CopyResult(len(commit.read_index(dst, dst_path).files), total)


def _copied_from(storage: Storage, path: str) -> object:
    """The ``COPY_KEY`` record of the committed checkpoint at ``path``, or None."""
    if not commit.is_committed(storage, path):
        return None
    try:
        return commit.read_index(storage, path).metadata.get(COPY_KEY)
    except CheckpointError:
        return None


__all__ = ["BATCH", "COPY_KEY", "recode_checkpoint"]
