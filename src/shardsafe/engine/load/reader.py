"""The units of a load: each target region cut into I/O-pool tasks, every task one read
of a source (``sources``), its transform (``transforms``: verification, decoding) and
the bytes' placement, so the stages of different units overlap across the pool's threads.

Units are at most one checksum block (16 MiB by default), so a single large tensor is
read (and verified) by every I/O thread at once, straight into the target's memory:

- a chunk of at least ``SPLIT_MIN`` bytes that fills its target: one task per checksum
  block, reading into the target's own bytes and verifying that block;
- small whole chunks: coalesced by file position into reads of up to one block into a
  per-thread scratch buffer, then verified and copied to each target (20,000 tiny
  tensors cost a few dozen system calls, not 20,000);
- a piece of a chunk (resharded load): only the checksum blocks covering the piece are
  read and verified, then the region is copied; a piece of whole rows that begins and
  ends on block bounds (a re-encoding copy's slabs) is read block by block straight into
  the target instead, with no temporary.

A compressed chunk (docs/FORMAT.md section 12) is read block by block whatever its size:
each block's stored bytes are checked, decoded straight into the target (or, for a
piece, into a temporary of the chunk's size of which only the needed blocks are
touched) and checked again (``format.block_verify.decode_block``).

Nothing is handed to the caller before its bytes pass their checksums: a failing block
raises ``CorruptCheckpointError`` naming the file and the key.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import CorruptCheckpointError
from ...format.blockfile import stored_span
from ...format.dtypes import lookup
from ...format.index.objects import Index, TensorEntry
from ...format.index.rows import ChunkEntry
from ...format.sub_blocks import partial_read
from ...format.tree import render_path
from ...plan.load_plan import CoverageError, Piece, pieces_for
from ...storage.base import Storage
from ...storage.memory import populate
from ..io_pool import io_pool, wait_all
from .sources import FileSource, groups, scratch as _scratch_buffer
from .transforms import decode, verify, verify_group, verify_partial

SPLIT_MIN = 1 << 20  # chunks from this size are read block by block straight into the target


@dataclass(slots=True)
class ReadJob:
    """Fill ``dest`` (a flat uint8 view of a host array of ``shape``) with a region of a tensor.

    ``offsets``/``shape`` give the region of the global tensor that ``dest`` holds;
    ``fresh``: ``dest`` is new memory, whose pages a read of a whole block faults in with
    one call first (``storage.memory.populate``), not page by page as it writes them.
    """

    entry: TensorEntry
    dest: np.ndarray
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    fresh: bool = False


@dataclass(slots=True)
class _Small:
    chunk: ChunkEntry
    dest: np.ndarray
    key: str


class ChunkReader:
    """Reads chunks of one checkpoint in parallel on the shared I/O pool."""

    def __init__(self, storage: Storage, path: str, index: Index) -> None:
        self.storage = storage
        self.path = path
        self.index = index
        self.block = index.block_size
        self.source = FileSource(storage, path)

    def _read(self, chunk: ChunkEntry, offset: int, out: memoryview, key: str) -> None:
        self.source.read(chunk.file, offset, out, lambda: key)

    # ------------------------------------------------------------------ task kinds
    def _read_block(self, chunk: ChunkEntry, j: int, dest: np.ndarray, key: str, base: int = 0) -> None:
        """Reads (and verifies) block ``j`` of ``chunk`` into ``dest``, which holds the
        chunk's bytes from ``base`` on."""
        lo, hi = j * self.block, min((j + 1) * self.block, chunk.nbytes)
        out = memoryview(dest)[lo - base : hi - base]
        if chunk.stored is not None:
            self._decode_block(chunk, j, out, key)
            return
        self._read(chunk, chunk.offset + lo, out, key)
        verify(chunk, out, self.block, key, first=j)

    def _read_fresh_block(self, chunk: ChunkEntry, j: int, dest: np.ndarray, key: str) -> None:
        populate(dest[j * self.block : min((j + 1) * self.block, chunk.nbytes)])
        self._read_block(chunk, j, dest, key)

    def _decode_block(self, chunk: ChunkEntry, j: int, out: memoryview, key: str) -> None:
        """Reads block ``j`` of a compressed chunk and decodes it into ``out`` (its raw bytes)."""
        offset, size = stored_span(chunk, j)  # validated: size <= len(out) <= block_size
        stored = memoryview(_scratch_buffer(size))
        self._read(chunk, offset, stored, key)
        decode(chunk, j, stored, out, key)

    def _read_small(self, group: Sequence[_Small]) -> None:
        start = group[0].chunk.offset
        end = max(s.chunk.offset + s.chunk.nbytes for s in group)
        buf = _scratch_buffer(end - start)
        self._read(group[0].chunk, start, memoryview(buf), group[0].key)
        for s in group:
            rel = s.chunk.offset - start
            data = buf[rel : rel + s.chunk.nbytes]
            verify(s.chunk, memoryview(data), self.block, s.key)
            s.dest[:] = data

    def _read_piece(self, p: Piece, job: ReadJob, key: str) -> None:
        itemsize = lookup(job.entry.dtype).itemsize
        c = p.chunk
        lo, hi = _byte_span(p, c.shape, itemsize)
        # np.empty of a large size is mapped lazily: only the pages read below are touched.
        tmp = np.empty(c.nbytes, dtype=np.uint8)
        if c.stored is not None:  # decode only the blocks that hold the piece
            b0, b1 = lo // self.block, max(lo, hi - 1) // self.block
            span = memoryview(tmp)[b0 * self.block : min((b1 + 1) * self.block, c.nbytes)]
            for j in range(b0, b1 + 1):
                self._decode_block(c, j, span[(j - b0) * self.block : (j - b0 + 1) * self.block], key)
        else:
            _read_verified(self, c, lo, hi, tmp, key)
        src = _as_bytes_nd(tmp, c.shape, itemsize)
        dst = _as_bytes_nd(job.dest, job.shape, itemsize)
        dst[_slices(p.dst)] = src[_slices(p.src)]

    def _aligned_blocks(self, p: Piece, job: ReadJob) -> range | None:
        """The checksum blocks of ``p.chunk`` that hold exactly the bytes of ``job.dest``,
        when ``p`` fills the job with rows of the chunk that begin and end on block bounds
        (the slabs of a re-encoding copy), else None: such a piece is read and verified
        block by block in place, without a temporary of the chunk."""
        c = p.chunk
        if not c.shape or any(src != (0, n) for src, n in zip(p.src[1:], c.shape[1:])):
            return None  # not a run of whole rows: its bytes are not contiguous in the chunk
        lo, hi = _byte_span(p, c.shape, lookup(job.entry.dtype).itemsize)
        if hi <= lo or lo % self.block or (hi % self.block and hi != c.nbytes):
            return None
        return range(lo // self.block, -(-hi // self.block))

    # ------------------------------------------------------------------ planning
    def tasks(self, jobs: Sequence[ReadJob]) -> list[tuple[Callable[..., None], tuple]]:
        """The I/O-pool tasks that fill ``jobs`` (planning only: no byte is read here).

        Per job, only the saved chunks that overlap its region become Python objects
        (``TensorEntry.overlapping``): a decoded index keeps the rest as columns.
        """
        tasks: list[tuple[Callable[..., None], tuple]] = []
        small: list[_Small] = []
        for job in jobs:
            key = render_path(job.entry.key)
            try:
                pieces = pieces_for(job.entry.overlapping(job.offsets, job.shape), job.offsets, job.shape)
            except CoverageError as e:
                raise CorruptCheckpointError(str(e), key=key) from None
            full = tuple((0, s) for s in job.shape)
            for p in pieces:
                blocks = self._aligned_blocks(p, job) if p.dst == full and not p.whole_chunk else None
                if blocks is not None:  # rows of the chunk on block bounds: straight into dest
                    base = blocks.start * self.block
                    tasks += [(self._read_block, (p.chunk, j, job.dest, key, base)) for j in blocks]
                elif not (p.whole_chunk and p.dst == full):
                    tasks.append((self._read_piece, (p, job, key)))
                elif p.chunk.nbytes >= SPLIT_MIN or p.chunk.stored is not None:
                    fn = self._read_fresh_block if job.fresh else self._read_block
                    for j in range(len(p.chunk.checksums)):
                        tasks.append((fn, (p.chunk, j, job.dest, key)))
                else:
                    small.append(_Small(p.chunk, job.dest, key))
        if small:
            ids = {f.name: i for i, f in enumerate(self.index.files)}
            order, bounds = groups([ids.get(s.chunk.file, -1) for s in small], [s.chunk.offset for s in small],
                                   [s.chunk.nbytes for s in small])
            order_l, bounds_l = order.tolist(), bounds.tolist()
            for a, b in zip(bounds_l, bounds_l[1:]):
                tasks.append((self._read_small, ([small[i] for i in order_l[a:b]],)))
        return tasks

    # ------------------------------------------------------------------ whole chunks, by address
    def whole_tasks(self, rows: np.ndarray, dests: Sequence[int], tensor_of: np.ndarray,
                    fresh: bool = False) -> list[tuple[Callable[..., None], tuple]]:
        """Tasks that read whole raw chunks (table ``rows``) into host memory at ``dests``.

        Each destination is a contiguous buffer of exactly the chunk's bytes, kept alive by
        the caller until the tasks ran (``tensor_of[i]`` names the tensor, for errors).
        Planned on the table's columns: chunks of at least ``SPLIT_MIN`` bytes are read
        block by block straight into their destination; smaller ones are grouped by file
        position (``sources.groups``) into reads of at most ``GROUP_MAX`` bytes into a
        scratch buffer, each then verified and moved out (``transforms.verify_group``).
        ``fresh``: the destinations are new
        memory; each block's pages are faulted in with one call before it is read into
        (``storage.memory.populate``; ~1.4x faster than faulting them one by one).
        """
        ct = self.index.table
        assert ct is not None
        rows = np.asarray(rows, dtype=np.int64)
        dests_a = np.asarray(dests, dtype=np.int64)
        nb = ct.nbytes[rows]
        big = nb >= SPLIT_MIN
        tasks: list[tuple[Callable[..., None], tuple]] = []
        for r, d, t in zip(rows[big].tolist(), dests_a[big].tolist(), tensor_of[big].tolist()):
            n = int(ct.nbytes[r])
            dest = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(d))
            chunk = self._chunk(r)
            key = self._key(t)
            fn = self._read_fresh_block if fresh else self._read_block
            tasks += [(fn, (chunk, j, dest, key)) for j in range(len(chunk.checksums))]
        empty = nb == 0  # nothing to read; its one checksum must be that of no bytes
        for r, t in zip(rows[empty].tolist(), tensor_of[empty].tolist()):
            verify(self._chunk(r), memoryview(b""), self.block, self._key(t))
        small = ~big & ~empty
        rows, dests_a, tensor_of = rows[small], dests_a[small], tensor_of[small]
        if not len(rows):
            return tasks
        file, off, nb = ct.file[rows], ct.offset[rows], ct.nbytes[rows]
        order, bounds = groups(file, off, nb)
        rows, dests_a, tensor_of, file, off, nb = (a[order] for a in (rows, dests_a, tensor_of, file, off, nb))
        sums = ct.checksums[ct.block_start[rows]]
        cols = [a.tolist() for a in (rows, dests_a, tensor_of, off, nb, sums)]
        bounds_l = bounds.tolist()
        names = [self.index.files[f].name for f in file[bounds[:-1]].tolist()]
        for g, name in enumerate(names):
            a, b = bounds_l[g], bounds_l[g + 1]
            tasks.append((self._read_group, (name, *(c[a:b] for c in cols))))
        return tasks

    def _read_group(self, file: str, rows: list[int], dests: list[int], tensors: list[int],
                    offsets: list[int], sizes: list[int], sums: list[int]) -> None:
        """One coalesced read of whole small chunks, each verified, then copied to its destination."""
        start = offsets[0]
        span = max(o + n for o, n in zip(offsets, sizes)) - start
        buf = _scratch_buffer(span)
        view = memoryview(buf)
        self.source.read(file, start, view, lambda: self._key(tensors[0]))

        def failed(i: int, data: memoryview) -> None:
            verify(self._chunk(rows[i]), data, self.block, self._key(tensors[i]))

        verify_group(view, buf.ctypes.data, start, dests, offsets, sizes, sums, failed)

    def _chunk(self, row: int) -> ChunkEntry:
        """Chunk ``row`` of the table as an entry (for the block reader and messages)."""
        ct = self.index.table
        t = int(np.searchsorted(ct.tensor_start, row, side="right")) - 1
        chunks = self.index.tensors[t].chunks
        return chunks[row - int(ct.tensor_start[t])]

    def _key(self, t: int) -> str:
        return render_path(self.index.tensors[t].key)

    def run_tasks(self, tasks: Sequence[tuple[Callable[..., None], tuple]]) -> None:
        """Runs ``tasks`` on the I/O pool (inline when there is one); re-raises the first
        error after every task stopped."""
        if len(tasks) == 1:
            fn, args = tasks[0]
            fn(*args)
        elif tasks:
            wait_all([io_pool().submit(fn, *args) for fn, args in tasks])

    def run(self, jobs: Sequence[ReadJob]) -> None:
        """Executes all jobs in parallel; re-raises the first error after all reads stopped."""
        self.run_tasks(self.tasks(jobs))


def _byte_span(p: Piece, shape: Sequence[int], itemsize: int) -> tuple[int, int]:
    """Bytes ``[lo, hi)`` of the row-major chunk that hold every element of ``p.src``."""
    if not shape:
        return 0, itemsize
    first = last = 0
    for (a, b), n in zip(p.src, shape):
        first = first * n + a
        last = last * n + (b - 1)
    return first * itemsize, (last + 1) * itemsize


def _as_bytes_nd(flat: np.ndarray, shape: Sequence[int], itemsize: int) -> np.ndarray:
    """Views flat bytes as an array of ``shape`` whose last axis is widened to raw bytes."""
    return flat.reshape(tuple(shape) + (itemsize,))


def _slices(region: Sequence[tuple[int, int]]) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in region)


def _read_verified(reader: ChunkReader, c: ChunkEntry, lo: int, hi: int, out: np.ndarray, key: str) -> None:
    """Reads into ``out`` (the chunk's bytes) what holds bytes ``[lo, hi)`` of raw chunk ``c``:
    its sub-blocks where the index records them, else its blocks; and verifies it
    (``format.sub_blocks.partial_read``, ``transforms.verify_partial``)."""
    read = partial_read(c.nbytes, c.sub_checksums, False, lo, hi, reader.block)
    span = memoryview(out)[read.start : read.stop]
    reader._read(c, c.offset + read.start, span, key)
    verify_partial(c, span, read, reader.block, key=key)
