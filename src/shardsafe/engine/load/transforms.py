"""Transforms: the middle stage of a load, between the bytes read and their destination.

- ``verify``: raw checksum blocks held in memory against their CRC32Cs (in the
  destination itself when the read went straight there, else in the scratch buffer it
  is copied out of);
- ``decode``: a compressed block's stored bytes checked, decoded straight into its
  destination and checked again (``format.block_verify``, docs/FORMAT.md section 12);
- ``verify_group``: the whole small chunks of one coalesced read, each checked, then
  moved to its destination;
- ``verify_partial``: the part of a raw chunk a resharded target needs, by the checksum
  sub-blocks the index records (docs/FORMAT.md section 15.7), else by whole blocks.

Nothing leaves this stage unchecked: a failing block raises ``CorruptCheckpointError``
naming the block, its file bytes, the file and the key.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

from ...format import block_verify
from ...format.block_verify import decode_block, verify_blocks
from ...format.checksum import crc32c
from ...format.index.rows import ChunkEntry
from ...format.sub_blocks import PartialRead


def verify(chunk: ChunkEntry, data: memoryview, block_size: int, key: str, first: int = 0) -> None:
    """Checks ``data`` (blocks ``first``, ``first + 1``, ... of ``chunk``) against its checksums.

    Raises:
        CorruptCheckpointError: a block does not match (names file, key and byte offsets).
    """
    verify_blocks(data, block_size, chunk.checksums, first, offset=chunk.offset + first * block_size,
                  file=chunk.file, key=key)


def decode(chunk: ChunkEntry, j: int, stored: memoryview, out: memoryview, key: str) -> None:
    """Checks block ``j`` of compressed ``chunk`` (its ``stored`` bytes), decodes it into
    ``out`` (its raw bytes) and checks the result.

    Raises:
        CorruptCheckpointError: the stored or the decoded bytes do not match.
    """
    decode_block(chunk, j, stored, out, key=key)


def verify_group(view: memoryview, address: int, start: int, dests: Sequence[int], offsets: Sequence[int],
                 sizes: Sequence[int], sums: Sequence[int], failed: Callable[[int, memoryview], None]) -> None:
    """Checks each whole one-block chunk of a coalesced read (``view`` holds the file's
    bytes from ``start`` on, at ``address``) against its checksum ``sums[i]``, then moves
    its bytes to address ``dests[i]``; ``failed(i, bytes)`` raises for a mismatch."""
    move, crc = ctypes.memmove, crc32c
    base = address - start
    for i, (d, o, n, want) in enumerate(zip(dests, offsets, sizes, sums)):
        data = view[o - start : o - start + n]
        if crc(data) != want:
            failed(i, data)
        move(d, base + o, n)


def verify_partial(chunk: ChunkEntry, data: memoryview, read: PartialRead, block_size: int, key: str) -> None:
    """Checks ``data``, the bytes ``read`` names of raw ``chunk``: first that the recorded
    sub-block checksums of every block it touches join into that block's checksum, then
    the sub-blocks (or whole blocks) it holds.

    Raises:
        CorruptCheckpointError: a checksum does not match, or the sub-block checksums do
            not join into their block's.
    """
    block_verify.verify_partial(chunk, data, read, block_size, key=key)


__all__ = ["decode", "verify", "verify_group", "verify_partial"]
