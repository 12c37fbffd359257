"""Block files: the data files of compressed chunks (docs/FORMAT.md section 12).

A block file is ``MAGIC`` (8 bytes) followed by compressed chunks back to back; a
compressed chunk is its checksum blocks' stored forms back to back, each coded on its
own (``format.codec``), so blocks are coded and decoded in parallel and a partial read
decodes only the blocks it needs. Every block carries two CRC32Cs: of its stored bytes
(checked before decoding) and of its raw bytes (checked after).

This module codes and decodes one block, with both checks; it does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CorruptCheckpointError
from . import codec
from .checksum import crc32c
from .chunk_table import BLOCK_FILE_DATA_START, RAW
from .index_common import ChunkEntry

MAGIC = b"SSAFEBLK"
DATA_START = BLOCK_FILE_DATA_START
assert len(MAGIC) == DATA_START


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


def decode_block(chunk: ChunkEntry, j: int, stored: memoryview, out: memoryview, *,
                 key: str | None) -> None:
    """Decodes block ``j`` of a compressed chunk from its stored bytes into ``out``.

    ``out`` is the block's raw bytes (its length comes from the chunk's shape, never
    from the stream), so decoding writes nothing beyond it whatever the stream says.

    Raises:
        CorruptCheckpointError: the stored bytes fail their checksum, do not decode to
            exactly ``len(out)`` bytes, or decode to bytes that fail the raw checksum
            (names the block, the file and the key).
    """
    st = chunk.stored
    assert st is not None
    where = f"block {j} (stored at file bytes {chunk.offset + st.starts[j]}-" \
            f"{chunk.offset + st.starts[j] + st.sizes[j]}, {st.codecs[j]})"
    if crc32c(stored) != st.checksums[j]:
        raise CorruptCheckpointError(f"stored checksum mismatch in {where}", file=chunk.file, key=key)
    try:
        codec.decode(st.codecs[j], stored, out)
    except codec.CodecError as e:
        raise CorruptCheckpointError(f"cannot decode {where}: {e}", file=chunk.file, key=key) from None
    if crc32c(out) != chunk.checksums[j]:
        raise CorruptCheckpointError(f"checksum mismatch in {where} after decoding",
                                     file=chunk.file, key=key)
