"""Copy a checkpoint with another coding (``shardsafe cp --compression``), in bounded memory.

A re-encoding copy is a save whose state is read from another checkpoint: a part written
by a ``Saver`` (``Saver.write_part``, one run of the save pipeline) whose feed,
``SourceFeed``, takes the items' bytes from the source instead of from training memory,
and committed here. The tensors are read batch by
batch with the engine's reader (``ChunkReader``: every block verified, compressed blocks
decoded) into one reused buffer of ``BATCH`` bytes, and from there copied unit by unit
into the pipeline's buffers, coded and written like any save's: the copy is one data file
and one block file, and its memory is one batch, the pipeline's ``UNITS`` units and the
blocks being coded, whatever the checkpoint holds. Each source chunk stays a chunk, cut
along its first dimension where it is larger than a batch (slabs that begin and end on
checksum blocks are read in place, ``ChunkReader``). The index, with the source's tree
and metadata, is published once the files are durable.

The copy's index metadata records what it was made from (``COPY_KEY``: the SHA-256 of the
source's index and the coding), so copying the same source the same way again finds the
destination up to date (an interrupted ``cp --all --compression`` runs again and codes
only what is missing). Re-coding a checkpoint onto itself is refused where the store
cannot rename (replacing it there deletes the source first).
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ...comm import ExternalRank
from ...errors import CheckpointError
from ...format.codec import check_compression
from ...format.dtypes import lookup
from ...format.index.objects import Index, TensorEntry
from ...plan.flatten import TensorItem
from ...storage.base import Storage
from .. import commit
from ..buffers import BouncePool, HostBuffer
from ..load.reader import ChunkReader, ReadJob
from ..save.feeds import Emit, PoolFeed, Stopped
from ..save.options import SaveOptions
from ..save.prepare import build_index
from ..save.saver import Saver
from ..save.units import HEADER, UNIT_SIZE
from .verbatim import CopyResult, abandon, same_location

BATCH = 16 << 20  # raw bytes read from the source at a time
# Batches are read when a unit needs them, never ahead, so a second buffer would only let a
# unit that spans two batches start on the next one before the others are past this one.
BATCHES = 1
# The pipeline's unit buffers (UNIT_SIZE each), which bound the blocks coded at once: two;
# the copy into a unit takes a fraction of its coding time, so a third buffer, filled
# ahead, costs 16 MiB and gains no speed.
UNITS = 2
COPY_KEY = "shardsafe.copy"  # index metadata of a re-coded copy: {"source": sha256, "compression": ...}

Slab = tuple[int, tuple[int, ...], tuple[int, ...]]  # (tensor, offsets, shape)


def _slabs(t: int, entry: TensorEntry, limit: int) -> Iterator[Slab]:
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


class SourceFeed(PoolFeed):
    """A ``PoolFeed`` whose items' bytes come from the source checkpoint, read batch by batch
    into ``buffers`` as the units that need them come up.

    The items are grouped into batches of at most ``limit`` bytes in the order the feed
    stages them (each stream's file order); with ``n`` buffers, batch ``b`` is read into
    buffer ``b % n`` once every unit that uses batch ``b - n`` has moved past it.

    Args:
        pool: The pipeline's unit buffers.
        reader: The source's reader.
        buffers: The batch buffers (``limit`` bytes each).
        on_bytes: Called with the bytes of each batch once read (progress).
    """

    def __init__(self, pool: BouncePool, reader: ChunkReader, buffers: Sequence[HostBuffer],
                 on_bytes: Callable[[int], None] | None) -> None:
        super().__init__(pool)
        self.reader, self.buffers, self.on_bytes = reader, list(buffers), on_bytes
        self.limit = min(b.nbytes for b in buffers)
        self.batches: list[list[ReadJob]] = []
        self.where: dict[int, tuple[int, int]] = {}  # id(item) -> (batch, address)
        self._cond = threading.Condition()
        self._loaded = -1  # batches [0, loaded] are in their buffers
        self._loading = False
        self._waiting: list[int] = []  # units of each batch not yet past it
        self._uses: dict[tuple[int, int], list[int]] = {}  # (id(stream), unit) -> its batches, in order
        self._failed: BaseException | None = None  # why a unit could not be copied

    def stage(self, streams: Sequence[Any], emit: Emit, stopped: Stopped, threads: int | None = None) -> None:
        at = self.limit
        for s in streams:
            items = s.units.plan.items
            for i in np.argsort(s.units.offsets, kind="stable").tolist():
                it = items[i]
                if at + it.nbytes > self.limit or not self.batches:
                    self.batches.append([])
                    at = 0
                b = len(self.batches) - 1
                dest = self.buffers[b % len(self.buffers)].array[at : at + it.nbytes]
                self.batches[-1].append(ReadJob(self.reader.index.tensors[it.id], dest, it.offsets,
                                                it.local_shape))
                self.where[id(it)] = (b, dest.ctypes.data)
                at += it.nbytes
        self._waiting = [0] * len(self.batches)
        for s in streams:
            items = s.units.plan.items
            for k in range(s.units.nunits):
                uses = sorted({self.where[id(items[i])][0] for i in s.units.parts(k).item if i != HEADER})
                self._uses[(id(s), k)] = uses
                for b in uses:
                    self._waiting[b] += 1
        super().stage(streams, emit, stopped, threads)

    def copy(self, stream: Any, k: int, buf: HostBuffer, start: int) -> None:
        """Copies unit ``k`` part by part, each batch read when its first part comes up and
        let go once the unit has moved past it (a unit may span more batches than there
        are buffers). A unit that fails lets go of the batches it did not reach, so that
        no other unit waits for it."""
        units = stream.units
        items, header = units.plan.items, units.plan.layout.header
        base = buf.array.ctypes.data - start
        uses = self._uses[(id(stream), k)]
        passed, loaded = 0, False  # batches of ``uses`` let go; ``uses[passed]`` is loaded
        try:
            for item, src, dst, n in zip(*units.parts(k)):
                if item == HEADER:
                    buf.array[dst - start : dst - start + n] = np.frombuffer(header, np.uint8, n, src)
                    continue
                b, addr = self.where[id(items[item])]
                if b != uses[passed] or not loaded:  # parts come in batch order (file order)
                    while uses[passed] != b:
                        self._done(uses[passed])
                        passed += 1
                    self._load_through(b)
                    loaded = True
                ctypes.memmove(base + dst, addr + src, n)
        except BaseException as e:
            with self._cond:
                self._failed = self._failed or e  # the other units stop at their next batch
            raise
        finally:
            for b in uses[passed:]:
                self._done(b)

    def skip(self, stream: Any, k: int) -> None:
        for b in self._uses[(id(stream), k)]:
            self._done(b)

    def _done(self, b: int) -> None:
        with self._cond:
            self._waiting[b] -= 1
            self._cond.notify_all()

    def _load_through(self, b: int) -> None:
        """Waits until batch ``b`` is in its buffer, reading batches in order meanwhile."""
        while True:
            with self._cond:
                if self._failed is not None:
                    raise self._failed
                if self._loaded >= b:
                    return
                nxt = self._loaded + 1
                if self._loading or (nxt >= len(self.buffers) and self._waiting[nxt - len(self.buffers)]):
                    self._cond.wait()
                    continue
                self._loading = True
            try:
                self.reader.run(self.batches[nxt])
            finally:
                with self._cond:
                    self._loading = False
                    self._cond.notify_all()
            with self._cond:
                self._loaded = nxt
                self._cond.notify_all()
            if self.on_bytes is not None:
                self.on_bytes(sum(j.dest.size for j in self.batches[nxt]))


def _items(index: Index, limit: int) -> list[TensorItem]:
    """The copy's items: each chunk of the source, cut into slabs of at most ``limit`` bytes."""
    out = []
    for t, e in enumerate(index.tensors):
        itemsize = lookup(e.dtype).itemsize
        for _, offsets, shape in _slabs(t, e, limit):
            out.append(TensorItem(t, e.key, None, e.kind, e.dtype, tuple(e.shape), offsets, replicated=False,
                                  local_shape=shape, nbytes=math.prod(shape) * itemsize))
    return out


def recode_checkpoint(src: Storage, src_path: str, dst: Storage, dst_path: str, *,
                      compression: str | None, overwrite: bool = False,
                      on_bytes: Callable[[int], None] | None = None, limit: int = BATCH) -> CopyResult:
    """Copies the committed checkpoint at ``src_path`` to ``dst_path`` coded with
    ``compression`` (None: raw), reading ``limit`` bytes at a time. ``nbytes`` of the
    result counts tensor data; a destination that is a copy of this very source coded
    the same way is left as it is (``skipped``) unless ``overwrite``.

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
    table = [TensorItem(t, e.key, None, e.kind, e.dtype, tuple(e.shape), (0,) * len(e.shape), replicated=False)
             for t, e in enumerate(index.tensors)]
    buffers = [HostBuffer(limit, prefault=False) for _ in range(BATCHES)]
    pool = BouncePool(UNIT_SIZE, UNITS)
    saver = Saver(SaveOptions(unit_size=UNIT_SIZE))
    txn = commit.plan_transaction(dst, dst_path, overwrite=overwrite, token=uuid.uuid4().hex[:16])
    commit.begin(txn)
    try:
        items = _items(index, limit)
        feed = SourceFeed(pool, ChunkReader(src, src_path, index), buffers, on_bytes)
        part = saver.write_part(items, txn, ExternalRank(0, index.world_size), compression, feed)
        commit.finish(txn, build_index(table, index.tree, index.world_size,
                                       {**index.metadata, COPY_KEY: made_from}, [part]))
    except BaseException:
        abandon(txn)
        raise
    finally:
        saver.close()
        pool.close()
        for b in buffers:
            b.close()
    return CopyResult(len(commit.read_index(dst, dst_path).files), sum(it.nbytes for it in items))


def _copied_from(storage: Storage, path: str) -> object:
    """The ``COPY_KEY`` record of the committed checkpoint at ``path``, or None."""
    if not commit.is_committed(storage, path):
        return None
    try:
        return commit.read_index(storage, path).metadata.get(COPY_KEY)
    except CheckpointError:
        return None


__all__ = ["BATCH", "COPY_KEY", "recode_checkpoint"]
