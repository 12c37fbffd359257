"""Read tensors of a checkpoint into host memory, verifying every checksum block."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptCheckpointError
from ..format.checksum import crc32c
from ..format.dtypes import lookup
from ..format.index import ChunkEntry, Index, TensorEntry
from ..format.tree import render_path
from ..plan.load_plan import CoverageError, Piece, block_span, byte_span, pieces_for
from ..storage.base import Storage
from ..storage.local import io_pool


def verify(chunk: ChunkEntry, data: memoryview, block_size: int, key: str,
           first_block: int = 0) -> None:
    """Raises CorruptCheckpointError if ``data`` fails its checksums.

    ``data`` is the whole chunk, or (partial reads) whole blocks from ``first_block`` on.
    """
    n = len(data)
    if n == 0:
        blocks = [data]
    else:
        blocks = [data[i : i + block_size] for i in range(0, n, block_size)]
    for i, (blk, want) in enumerate(zip(blocks, chunk.checksums[first_block:]), first_block):
        if crc32c(blk) != want:
            raise CorruptCheckpointError(
                f"checksum mismatch in block {i} (bytes {chunk.offset + i * block_size}+)",
                file=chunk.file, key=key)


@dataclass(slots=True)
class ReadJob:
    """Fill ``dest`` (a flat uint8 view of a host array of ``shape``) with a region of a tensor.

    ``offsets``/``shape`` give the region of the global tensor that ``dest`` holds.
    """

    entry: TensorEntry
    dest: np.ndarray
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    done: Callable[[], None] | None = None


class Reader:
    """Reads chunks of one checkpoint in parallel on the shared I/O pool."""

    def __init__(self, storage: Storage, path: str, index: Index) -> None:
        self.storage = storage
        self.path = path
        self.index = index

    def _read_chunk(self, chunk: ChunkEntry, out: memoryview, key: str, first_block: int = 0) -> None:
        """Reads the chunk (or its blocks from ``first_block`` on, as many as ``out`` holds)."""
        start = first_block * self.index.block_size
        try:
            self.storage.read_into(self.storage.join(self.path, chunk.file), chunk.offset + start, out)
        except EOFError:
            raise CorruptCheckpointError("data file is truncated", file=chunk.file, key=key) from None
        verify(chunk, out, self.index.block_size, key, first_block)

    def _fill(self, job: ReadJob) -> None:
        key = render_path(job.entry.key)
        try:
            pieces = pieces_for(job.entry.chunks, job.offsets, job.shape)
        except CoverageError as e:
            raise CorruptCheckpointError(str(e), key=key) from None
        itemsize = lookup(job.entry.dtype).itemsize
        for p in pieces:
            if p.whole_chunk and p.dst == tuple((0, s) for s in job.shape):
                self._read_chunk(p.chunk, memoryview(job.dest), key)  # straight into the target
            else:
                self._copy_piece(p, job, itemsize, key)
        if job.done is not None:
            job.done()

    def _copy_piece(self, p: Piece, job: ReadJob, itemsize: int, key: str) -> None:
        # read only the checksum blocks that hold the piece (a rank loading a resharded
        # tensor reads its rows, not whole chunks); np.empty leaves the rest untouched
        lo, hi = byte_span(p, itemsize)
        first, _, start, stop = block_span(lo, hi, p.chunk.nbytes, self.index.block_size)
        tmp = np.empty(p.chunk.nbytes, dtype=np.uint8)
        self._read_chunk(p.chunk, memoryview(tmp)[start:stop], key, first)
        src = _as_bytes_nd(tmp, p.chunk.shape, itemsize)
        dst = _as_bytes_nd(job.dest, job.shape, itemsize)
        dst[_slices(p.dst)] = src[_slices(p.src)]

    def run(self, jobs: Sequence[ReadJob]) -> None:
        """Executes all jobs in parallel; re-raises the first error after all finish."""
        if len(jobs) == 1:
            self._fill(jobs[0])
            return
        futures: list[Future] = [io_pool().submit(self._fill, j) for j in jobs]
        first: BaseException | None = None
        for f in futures:
            exc = f.exception()
            if exc is not None and first is None:
                first = exc
        if first is not None:
            raise first


def _as_bytes_nd(flat: np.ndarray, shape: Sequence[int], itemsize: int) -> np.ndarray:
    """Views flat bytes as an array of ``shape`` whose last axis is widened to raw bytes."""
    return flat.reshape(tuple(shape) + (itemsize,))


def _slices(region: Sequence[tuple[int, int]]) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in region)
