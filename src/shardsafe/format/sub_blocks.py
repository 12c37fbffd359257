"""Checksum sub-blocks: finer CRC32Cs inside each checksum block, for partial reads.

A chunk larger than the sub-block size also records the CRC32C of every ``sub_size``
slice of its raw bytes, counted from the chunk's start (docs/FORMAT.md section 15.7).
Sub-blocks tile the checksum blocks (``block_size`` is a multiple of ``sub_size``), and
the sub-block CRCs of a block combine (``crc_combine``) into the block's CRC32C. A reader
that needs part of a chunk reads and checks only the sub-blocks that hold it, and checks
that the recorded sub-block CRCs of every block it touches combine to the block's
recorded CRC32C: a forged sub-block column can pass no byte the block checksum would not.

This module holds the arithmetic (which sub-blocks a chunk has, which bytes a partial
read reads, joining sub-block CRCs into a block CRC) and ``SubBlocks``, the sub-block
column of a chunk table. Pure: no I/O, no threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .crc_combine import crc32c_combine

SUB_BLOCK_SIZE = 256 << 10
"""The sub-block size writers record (256 KiB): a partial read reads at most one sub-block
too many at each end of what it needs, so a piece of 2.5 MiB or more is read with at most
10% overhead on average, while the index grows by 4 bytes per 256 KiB of data (16 KiB
per GiB, 0.0015%)."""
MIN_SUB_BLOCK = 4096
"""The smallest sub-block size a reader accepts (so the column is at most 1/1024 of the data)."""

I64 = np.int64


def num_sub_blocks(nbytes: np.ndarray, sub_size: int) -> np.ndarray:
    """Sub-block CRCs per chunk: ``ceil(nbytes / sub_size)`` for a chunk larger than
    ``sub_size``, 0 for one that fits in one sub-block (its block CRC covers it)."""
    nbytes = np.asarray(nbytes, dtype=I64)
    return np.where(nbytes > sub_size, -(-nbytes // sub_size), 0).astype(I64)


def sub_size_problem(sub_size: object, block_size: int) -> str | None:
    """Why ``sub_size`` cannot be an index's sub-block size, or None: it must be an integer
    power of two, at least ``MIN_SUB_BLOCK``, that divides ``block_size``."""
    if type(sub_size) is not int or sub_size < MIN_SUB_BLOCK or sub_size & (sub_size - 1):
        return f"sub_block_size must be a power of two of at least {MIN_SUB_BLOCK}, not {sub_size!r}"
    if sub_size > block_size or block_size % sub_size:
        return f"sub_block_size {sub_size} must divide block_size {block_size}"
    return None


@dataclass(frozen=True, slots=True, eq=False)
class SubBlocks:
    """The sub-block CRC32Cs of a chunk table: chunk ``r``'s are ``checksums[start[r]:start[r + 1]]``.

    Attributes:
        size: The sub-block size in bytes.
        checksums: Every sub-block CRC32C (uint32), chunk by chunk in table order.
        start: ``(rows + 1,)`` where each chunk's begin (``num_sub_blocks`` of its bytes).
    """

    size: int
    checksums: np.ndarray
    start: np.ndarray

    @staticmethod
    def of(size: int, checksums: np.ndarray, nbytes: np.ndarray) -> SubBlocks:
        """The sub-blocks of chunks of ``nbytes`` bytes.

        Raises:
            ValueError: ``checksums`` does not hold exactly one value per sub-block.
        """
        start = np.concatenate([[0], np.cumsum(num_sub_blocks(nbytes, size))]).astype(I64)
        if len(checksums) != int(start[-1]):
            raise ValueError(f"the chunks have {int(start[-1])} sub-blocks of {size} bytes, "
                             f"{len(checksums)} sub-block checksums are given")
        return SubBlocks(size, np.asarray(checksums, dtype=np.uint32), start)

    def row(self, r: int) -> tuple[int, ...]:
        """Chunk ``r``'s sub-block CRC32Cs (empty for a chunk of one sub-block)."""
        return tuple(self.checksums[self.start[r] : self.start[r + 1]].tolist())

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """The sub-block CRC32Cs of ``rows``, chunk after chunk."""
        lo, hi = self.start[rows], self.start[np.asarray(rows) + 1]
        n = hi - lo
        idx = np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(int(n.sum()), dtype=I64)
        return self.checksums[idx]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SubBlocks):
            return NotImplemented
        return (self.size == other.size and np.array_equal(self.checksums, other.checksums)
                and np.array_equal(self.start, other.start))


# ----------------------------------------------------------------------------- combining


@lru_cache(maxsize=8)
def _shift_tables(n: int) -> tuple[tuple[int, ...], ...]:
    """Four 256-entry tables of the linear map "append ``n`` zero bytes" on a CRC state,
    one per byte of the state, built from its values on the 32 single bits."""
    bits = [crc32c_combine(1 << k, 0, n) for k in range(32)]
    tables = []
    for p in range(4):
        t = [0] * 256
        for v in range(1, 256):
            low = v & -v
            t[v] = t[v ^ low] ^ bits[8 * p + low.bit_length() - 1]
        tables.append(tuple(t))
    return tuple(tables)


def join_sub_crcs(crcs: Sequence[int], sub_size: int, last: int) -> int:
    """The CRC32C of a block from its sub-blocks' CRC32Cs (all ``sub_size`` bytes long
    but the last, which is ``last`` bytes long)."""
    t0, t1, t2, t3 = _shift_tables(sub_size)
    acc = crcs[0]
    for c in crcs[1:-1]:
        acc = t0[acc & 255] ^ t1[(acc >> 8) & 255] ^ t2[(acc >> 16) & 255] ^ t3[acc >> 24] ^ c
    if len(crcs) > 1:
        if last == sub_size:
            acc = t0[acc & 255] ^ t1[(acc >> 8) & 255] ^ t2[(acc >> 16) & 255] ^ t3[acc >> 24] ^ crcs[-1]
        else:
            acc = crc32c_combine(acc, crcs[-1], last)
    return acc


# ----------------------------------------------------------------------------- partial reads


@dataclass(frozen=True, slots=True)
class PartialRead:
    """What a reader reads of a chunk to get its bytes ``[lo, hi)``.

    Attributes:
        start, stop: The chunk's bytes to read, ``[start, stop)``.
        sub_size: The grain they are checked at: the sub-block size, or the block size
            where the chunk has no sub-blocks (or is compressed).
    """

    start: int
    stop: int
    sub_size: int


def partial_read(nbytes: int, subs: Sequence[int], compressed: bool, lo: int, hi: int,
                 block_size: int) -> PartialRead:
    """Which bytes of a chunk of ``nbytes`` bytes to read (and check) for its bytes ``[lo, hi)``:
    the sub-blocks that hold them when the chunk records sub-blocks (``subs``) and is stored
    raw, else the checksum blocks that hold them."""
    grain = block_size
    if subs and not compressed:
        grain = -(-nbytes // len(subs))  # the sub-block size, from the validated count
        grain = 1 << (grain - 1).bit_length()
    first, last = lo // grain, max(lo, hi - 1) // grain
    return PartialRead(first * grain, min((last + 1) * grain, nbytes), grain)


__all__ = ["MIN_SUB_BLOCK", "PartialRead", "SUB_BLOCK_SIZE", "SubBlocks", "join_sub_crcs", "num_sub_blocks",
           "partial_read", "sub_size_problem"]
