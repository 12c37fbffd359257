"""Load planning over the columnar chunk table (``format.index.chunk_table``), vectorised with numpy.

A rank that loads an FSDP-style shard (rows ``[lo, hi)`` of dimension 0 of each tensor)
from a checkpoint whose tensors were split along dimension 0 needs, per tensor, only the
saved parts that overlap its rows; each overlap is one contiguous byte range, because
the rows of a row-major tensor are contiguous. ``even_shard_reads`` computes all of a
rank's byte-range reads for many tensors at once from the split rules and the table's
columns, without building a Python object per chunk, in time linear in the number of
reads (not in the size of the table).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..format.index.chunk_table import ChunkTable

I64 = np.int64


@dataclass(frozen=True, slots=True)
class Reads:
    """Byte-range reads, one per (tensor, saved chunk) overlap, as aligned arrays.

    Attributes:
        tensor: Tensor id of each read.
        row: Chunk row in the table (for its checksums: ``table.chunk_checksums(row)``).
        file: Data file id.
        offset: Absolute byte offset in the file.
        nbytes: Bytes to read.
        chunk_start: Where the read starts inside its chunk (bytes; selects the checksum blocks).
        dest: Byte offset of the read inside the rank's local shard of that tensor.
    """

    tensor: np.ndarray
    row: np.ndarray
    file: np.ndarray
    offset: np.ndarray
    nbytes: np.ndarray
    chunk_start: np.ndarray
    dest: np.ndarray

    def __len__(self) -> int:
        return len(self.tensor)


def row_split_tensors(table: ChunkTable) -> list[int]:
    """Tensors whose saved chunks follow a split along dimension 0 (``even_shard_reads`` takes these)."""
    return [t for t, s in enumerate(table.splits) if s is not None and s.dim == 0]


def even_shard_reads(table: ChunkTable, tensors: Sequence[int], rank: int, world: int) -> Reads:
    """The reads rank ``rank`` of ``world`` needs for its even dim-0 shard of each tensor.

    The shard is ``torch.chunk``'s (and FSDP2's): ``q = ceil(rows / world)`` rows per rank,
    rank ``m`` taking rows ``[m*q, min((m+1)*q, rows))`` (possibly none).

    Raises:
        ValueError: a tensor is not split along dimension 0 (see ``row_split_tensors``),
            or the checkpoint has compressed chunks (their bytes are not byte ranges of
            the raw tensor: ``engine.reader`` reads them block by block).
    """
    if table.coding is not None:
        raise ValueError("even_shard_reads plans raw byte ranges; this checkpoint has compressed chunks")
    ts = np.asarray(tensors, dtype=I64)
    if any(table.splits[t] is None or table.splits[t].dim != 0 for t in ts.tolist()):  # type: ignore[union-attr]
        raise ValueError("even_shard_reads needs tensors split along dimension 0")
    rows = np.array([table.shapes[t][0] for t in ts.tolist()], dtype=I64)
    step = np.array([table.splits[t].step for t in ts.tolist()], dtype=I64)  # type: ignore[union-attr]
    # bytes per row: a split part of `step` rows is nbytes / rows-in-part; use the first part
    first = table.tensor_start[ts]
    row_bytes = np.where(rows > 0, table.nbytes[first] // np.minimum(step, np.maximum(rows, 1)), 0)
    q = -(-rows // world)
    lo = np.minimum(rank * q, rows)
    hi = np.minimum(lo + q, rows)
    has = hi > lo
    i_lo = np.where(has, lo // step, 0)
    i_hi = np.where(has, (hi - 1) // step + 1, 0)
    n = i_hi - i_lo
    total = int(n.sum())
    which = np.repeat(np.arange(len(ts), dtype=I64), n)
    part = i_lo[which] + np.arange(total, dtype=I64) - np.repeat(np.cumsum(n) - n, n)
    a = np.maximum(lo[which], part * step[which])
    b = np.minimum(hi[which], (part + 1) * step[which])
    rb = row_bytes[which]
    row = table.tensor_start[ts[which]] + part
    within = (a - part * step[which]) * rb
    return Reads(tensor=ts[which], row=row, file=table.file[row], offset=table.offset[row] + within,
                 nbytes=(b - a) * rb, chunk_start=within, dest=(a - lo[which]) * rb)
