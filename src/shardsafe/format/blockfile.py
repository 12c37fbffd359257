"""Compressed chunks and block files (docs/FORMAT.md section 12).

A block file is ``MAGIC`` (8 bytes) followed by compressed chunks back to back; a
compressed chunk is its checksum blocks' stored forms back to back, each coded on its
own (``format.codec``), so blocks are coded and decoded in parallel and a partial read
decodes only the blocks it needs. Every block carries two CRC32Cs: of its stored bytes
(checked before decoding) and of its raw bytes (checked after).

This module holds the index's record of how blocks are stored (``BlockCoding``, the coding
columns of the binary index versions) and its validation, and codes one block; ``format.block_verify``
checks and decodes blocks.
Pure: no I/O, no threads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import codec
from .checksum import crc32c
from .index.rows import ChunkEntry
from .index.rules import bad

MAGIC = b"SSAFEBLK"
DATA_START = len(MAGIC)  # a block file's data_start; a safetensors file's is a multiple of 4096
RAW = codec.CODECS[0]  # the codec of a block stored as is
MAX_CODED_BLOCK = 1 << 26  # block_size limit of an index with compressed chunks (bounded decoding)
I64 = np.int64


@dataclass(frozen=True, slots=True, eq=False)
class BlockCoding:
    """How every checksum block is stored, for an index with compressed chunks (FORMAT.md 12.3).

    One value per block, aligned with ``ChunkTable.checksums``. A block whose codec is
    ``"raw"`` is stored as is (its stored size is its raw size and its stored checksum its
    raw one), so a chunk whose blocks are all raw reads like an uncompressed chunk.

    Attributes:
        codecs: Codec names; ``codec`` holds indexes into it.
        codec: Codec of each block (small ints).
        stored: Stored size of each block in bytes (int64).
        checksums: CRC32C of each block's stored bytes (uint32).
        starts: Filled by ``check_coding``: where each block's stored bytes begin in its chunk.
        chunk_nbytes: Filled by ``check_coding``: stored bytes of each chunk.
    """

    codecs: tuple[str, ...]
    codec: np.ndarray
    stored: np.ndarray
    checksums: np.ndarray
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=I64))
    chunk_nbytes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=I64))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockCoding):
            return NotImplemented
        return self.codecs == other.codecs and all(
            np.array_equal(getattr(self, a), getattr(other, a)) for a in ("codec", "stored", "checksums"))


def block_raw_sizes(nbytes: np.ndarray, block_start: np.ndarray, block_size: int) -> np.ndarray:
    """Raw size of every checksum block, chunk by chunk (``block_start``: first block of
    each chunk, plus the total, as in ``ChunkTable``)."""
    counts = np.diff(block_start)
    j = np.arange(int(block_start[-1]), dtype=I64) - np.repeat(block_start[:-1], counts)
    return np.minimum(block_size, np.repeat(nbytes, counts) - j * block_size)


def check_coding(cd: BlockCoding, nbytes: np.ndarray, block_start: np.ndarray,
                 tensor_start: np.ndarray, file: np.ndarray, checksums: np.ndarray,
                 block_size: int, data_starts: np.ndarray, name: Callable[[int], str]) -> None:
    """Checks that the stored form of every block is possible and bounded (FORMAT.md 12.4)
    and fills ``cd.starts`` and ``cd.chunk_nbytes``. The other arguments are the chunk
    table's columns (per chunk: ``nbytes``, ``file``; ``checksums`` per block).

    Names are known codecs; each block's codec id names one; a raw block's stored size
    and checksum are its raw ones; any other block stores between 1 and its raw size in
    bytes (so decoding never reads more than the tensor holds); a compressed chunk lies
    in a block file; ``block_size`` is at most ``MAX_CODED_BLOCK``. Vectorised: linear
    in the number of blocks.

    Raises:
        CorruptCheckpointError: naming the first rule broken (and the tensor).
    """
    total = len(checksums)

    def tensor_of_block(b: int) -> tuple[str, int]:
        row = int(np.searchsorted(block_start, b, side="right")) - 1
        return name(int(np.searchsorted(tensor_start, row, side="right")) - 1), b - int(block_start[row])

    if block_size > MAX_CODED_BLOCK:
        raise bad(f"block_size {block_size} is above {MAX_CODED_BLOCK} in an index with compressed chunks")
    if len(set(cd.codecs)) != len(cd.codecs) or any(c not in codec.CODECS for c in cd.codecs):
        raise bad(f"unknown or repeated codec in {list(cd.codecs)} (this shardsafe knows {list(codec.CODECS)})")
    if not (len(cd.codec) == len(cd.stored) == len(cd.checksums) == total):
        raise bad(f"coding columns hold {len(cd.codec)}/{len(cd.stored)}/{len(cd.checksums)} "
                  f"values for {total} blocks")
    ids = np.asarray(cd.codec, dtype=I64)
    if total and (int(ids.max()) >= len(cd.codecs) or int(ids.min()) < 0):
        raise bad(f"a block names codec {int(ids.max())}, the index lists {len(cd.codecs)}")
    raw = block_raw_sizes(nbytes, block_start, block_size)
    is_raw = np.isin(ids, [i for i, c in enumerate(cd.codecs) if c == RAW])
    stored = np.asarray(cd.stored, dtype=I64)
    wrong = np.where(is_raw, (stored != raw) | (cd.checksums != checksums), (stored < 1) | (stored > raw))
    if wrong.any():
        b = int(np.argmax(wrong))
        t, j = tensor_of_block(b)
        raise bad(f"tensor {t}: block {j} claims {int(stored[b])} stored bytes "
                  f"({cd.codecs[int(ids[b])]}) for {int(raw[b])} raw bytes")
    ends = np.cumsum(stored)
    firsts = block_start[:-1]
    chunk = np.add.reduceat(stored, firsts) if total else np.zeros(0, dtype=I64)
    object.__setattr__(cd, "chunk_nbytes", chunk.astype(I64))
    object.__setattr__(cd, "starts", ends - stored - np.repeat(ends[firsts] - stored[firsts], np.diff(block_start)))
    coded = np.logical_or.reduceat(~is_raw, firsts) if total else np.zeros(0, dtype=bool)
    # file ids are range-checked with the byte ranges next; clipped here only to index safely
    fid = np.clip(file, 0, max(len(data_starts) - 1, 0))
    outside = coded & (data_starts[fid] != DATA_START) if len(data_starts) else coded
    if outside.any():
        row = int(np.argmax(outside))
        t = name(int(np.searchsorted(tensor_start, row, side="right")) - 1)
        raise bad(f"tensor {t}: a compressed chunk lies in file {int(file[row])}, which is not a block file")


@dataclass(frozen=True, slots=True)
class CodedBlock:
    """One checksum block as stored: codec name, stored bytes, and the two CRC32Cs."""

    codec: str
    data: bytes | memoryview
    raw_crc: int
    stored_crc: int


def code_block(raw: memoryview, dtype: str, compression: codec.Compression) -> CodedBlock:
    """Codes one block of raw bytes (a whole number of ``dtype`` elements).

    The raw CRC32C is taken from the same bytes that are coded; a block that does not
    shrink is stored raw (``data`` is then ``raw`` itself).
    """
    raw_crc = crc32c(raw)
    name, data = codec.encode(raw, dtype, compression)
    if name == RAW:
        return CodedBlock(RAW, raw, raw_crc, raw_crc)
    return CodedBlock(name, data, raw_crc, crc32c(data))


def stored_span(chunk: ChunkEntry, j: int) -> tuple[int, int]:
    """File offset and stored length of block ``j`` of a compressed chunk."""
    assert chunk.stored is not None
    return chunk.offset + chunk.stored.starts[j], chunk.stored.sizes[j]
