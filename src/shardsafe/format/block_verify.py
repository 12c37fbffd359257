"""Checksum-block verification: the one block verifier of the package.

Every chunk's bytes are covered by checksum blocks (docs/FORMAT.md). A raw block is
checked against its CRC32C; a block of a compressed chunk (section 12) has its stored
bytes checked against their CRC32C, is decoded (never beyond its raw size) and the
decoded bytes are checked against the raw CRC32C.

- ``verify_blocks`` checks raw blocks held in memory (the reader, the memory-mapped load);
- ``verify_partial`` checks the part of a raw chunk that a partial read read, by its
  sub-blocks (``format.sub_blocks``) where the chunk records them, after checking that
  they combine to the recorded block checksums;
- ``decode_block`` checks and decodes one compressed block (the same readers);
- ``index_spans`` lists every block of an index, for ``BlockStream``;
- ``BlockStream`` checks the blocks of a data file from its bytes fed in file order, in
  pieces of any size, raw and compressed alike (``shardsafe verify``; a streaming copy).
  A raw block's CRC32C is carried from piece to piece, so a block larger than the
  pieces costs no memory; a compressed block is decoded once its stored bytes are all
  in (at most ``MAX_CODED_BLOCK`` of them are held).

Every mismatch is a ``CorruptCheckpointError`` naming the block, its file bytes, the
file and the key. Pure: no I/O, no threads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptCheckpointError
from . import codec
from .blockfile import stored_span
from .checksum import blocks, crc32c
from .index.objects import Index
from .index.rows import ChunkEntry
from .sub_blocks import PartialRead, join_sub_crcs
from .tree import render_path


def _raw_mismatch(number: int, start: int, length: int, file: str | None,
                  key: str | None) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"checksum mismatch in block {number} (file bytes "
                                  f"{start}-{start + length})", file=file, key=key)


def verify_blocks(data: memoryview, block_size: int, checksums: Sequence[int], first: int = 0, *,
                  offset: int = 0, file: str | None = None, key: str | None = None) -> None:
    """Checks ``data``, blocks ``first``, ``first + 1``, ... of a raw chunk, against their checksums.

    Args:
        data: Whole blocks of one chunk, back to back (the chunk's last block may be shorter).
        block_size: The checkpoint's checksum block size.
        checksums: The chunk's checksums; block ``i`` is checked against ``checksums[i]``.
        first: The number of the first block in ``data``.
        offset: The file offset of ``data``'s first byte (for the message).
        file: The data file, relative to the checkpoint (for the error).
        key: The key path of the value the chunk belongs to (for the error).

    Raises:
        CorruptCheckpointError: a block does not match; names the block, its file bytes,
            the file and the key.
    """
    pos = offset
    for i, block in enumerate(blocks(data, block_size), start=first):
        if crc32c(block) != checksums[i]:
            raise _raw_mismatch(i, pos, len(block), file, key)
        pos += len(block)


def verify_partial(chunk: ChunkEntry, data: memoryview, read: PartialRead, block_size: int, *,
                   key: str | None = None) -> None:
    """Checks ``data``, the bytes ``[read.start, read.stop)`` of raw ``chunk``.

    Read by sub-blocks, each sub-block is checked against its recorded CRC32C, and the
    recorded sub-block CRC32Cs of every block the read touches must combine to that
    block's recorded CRC32C (so the sub-block column proves nothing the block checksum
    would not). Read by blocks, each block is checked as ``verify_blocks`` does.

    Raises:
        CorruptCheckpointError: a sub-block or block does not match, or the sub-block
            checksums of a block do not combine to its checksum; names the file and the key.
    """
    if read.sub_size == block_size or not chunk.sub_checksums:
        verify_blocks(data, block_size, chunk.checksums, read.start // block_size,
                      offset=chunk.offset + read.start, file=chunk.file, key=key)
        return
    sub, subs = read.sub_size, chunk.sub_checksums
    per = block_size // sub
    for j in range(read.start // block_size, (read.stop - 1) // block_size + 1):
        a, b = j * per, min((j + 1) * per, len(subs))
        last = min(block_size, chunk.nbytes - j * block_size) - (b - a - 1) * sub
        if a >= b or join_sub_crcs(subs[a:b], sub, last) != chunk.checksums[j]:
            raise CorruptCheckpointError(f"the sub-block checksums of block {j} do not combine to its "
                                         "checksum (forged index)", file=chunk.file, key=key)
    pos = chunk.offset + read.start
    for i, piece in enumerate(blocks(data, sub), start=read.start // sub):
        if crc32c(piece) != subs[i]:
            raise CorruptCheckpointError(f"checksum mismatch in sub-block {i} (file bytes "
                                         f"{pos}-{pos + len(piece)})", file=chunk.file, key=key)
        pos += len(piece)


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
    start, size = stored_span(chunk, j)
    where = f"block {j} (stored at file bytes {start}-{start + size}, {st.codecs[j]})"
    if crc32c(stored) != st.checksums[j]:
        raise CorruptCheckpointError(f"stored checksum mismatch in {where}", file=chunk.file, key=key)
    try:
        codec.decode(st.codecs[j], stored, out)
    except codec.CodecError as e:
        raise CorruptCheckpointError(f"cannot decode {where}: {e}", file=chunk.file, key=key) from None
    if crc32c(out) != chunk.checksums[j]:
        raise CorruptCheckpointError(f"checksum mismatch in {where} after decoding",
                                     file=chunk.file, key=key)


@dataclass(frozen=True, slots=True)
class BlockSpan:
    """Checksum block ``number`` of ``chunk``: ``length`` bytes at ``offset`` of its data file
    (for a compressed chunk: the block's stored bytes). ``key``: the value's key path."""

    offset: int
    length: int
    key: str
    number: int
    chunk: ChunkEntry


def chunk_spans(chunk: ChunkEntry, block_size: int, key: str) -> list[BlockSpan]:
    """The checksum blocks of ``chunk`` in file order (an empty chunk has one, of 0 bytes)."""
    if chunk.stored is not None:
        starts, sizes = chunk.stored.starts, chunk.stored.sizes
        return [BlockSpan(chunk.offset + starts[i], sizes[i], key, i, chunk) for i in range(len(sizes))]
    return [BlockSpan(chunk.offset + i * block_size, max(0, min(block_size, chunk.nbytes - i * block_size)),
                      key, i, chunk) for i in range(len(chunk.checksums))]


def index_spans(index: Index) -> list[BlockSpan]:
    """The checksum blocks of every chunk of ``index``, tensor by tensor (keys rendered)."""
    return [s for t in index.tensors for c in t.chunks
            for s in chunk_spans(c, index.block_size, render_path(t.key))]


class BlockStream:
    """Verifies checksum blocks of one data file from its bytes, fed in file order.

    ``spans`` are the blocks to check (any order; non-empty ones must not overlap).
    ``feed`` takes the file's bytes piece by piece, each piece starting where the
    previous one ended; bytes outside the spans (a header, padding, chunks not asked
    for) pass unchecked. Failures are returned, not raised, so a caller may report every
    damaged block, or stop at the first.
    """

    def __init__(self, spans: Iterable[BlockSpan], block_size: int) -> None:
        self._spans = sorted(spans, key=lambda s: (s.offset, s.length))
        self._block_size = block_size
        self._next = 0  # the first span not checked yet
        self._pos: int | None = None  # where the next piece must start
        self._crc = 0  # of the current raw span's bytes so far
        self._seen = 0  # bytes of the current span so far
        self._held: bytearray | None = None  # the current compressed span's stored bytes
        self._out: np.ndarray | None = None  # decoding buffer, reused

    def feed(self, offset: int, data: memoryview) -> list[CorruptCheckpointError]:
        """Checks every block that ends within ``data`` (the file's bytes from ``offset``).

        Raises:
            ValueError: ``data`` does not continue the previous piece, or the first piece
                starts after the first span's beginning (bytes would go unchecked).
        """
        if self._pos is not None and offset != self._pos:
            raise ValueError(f"piece at {offset} does not continue the stream at {self._pos}")
        end = offset + len(data)
        bad: list[CorruptCheckpointError] = []
        while self._next < len(self._spans):
            s = self._spans[self._next]
            resume = s.offset + self._seen
            if resume > end or (resume == end and self._seen < s.length):
                break  # begins (or goes on) in a later piece
            if resume < offset:
                raise ValueError(f"block {s.number} of {s.chunk.file} begins at {s.offset}, "
                                 f"before the stream's first byte {offset}")
            stop = min(s.offset + s.length, end)
            self._take(s, data[resume - offset : stop - offset])
            if self._seen < s.length:
                break
            err = self._check(s, data[s.offset - offset : stop - offset] if self._held is None else None)
            if err is not None:
                bad.append(err)
            self._next, self._crc, self._seen, self._held = self._next + 1, 0, 0, None
        self._pos = end
        return bad

    def missing(self) -> list[BlockSpan]:
        """The blocks not (completely) fed yet: after the last piece, those cut off."""
        return self._spans[self._next :]

    def _take(self, s: BlockSpan, piece: memoryview) -> None:
        if s.chunk.stored is None:
            self._crc = crc32c(piece, self._crc)
        elif self._seen or len(piece) < s.length:  # a stored block cut between pieces
            if self._held is None:
                self._held = bytearray()
            self._held += piece
        self._seen += len(piece)

    def _check(self, s: BlockSpan, whole: memoryview | None) -> CorruptCheckpointError | None:
        c = s.chunk
        if c.stored is None:
            if self._crc == c.checksums[s.number]:
                return None
            return _raw_mismatch(s.number, s.offset, s.length, c.file, s.key)
        stored = memoryview(self._held) if whole is None else whole
        raw = min(self._block_size, c.nbytes - s.number * self._block_size)
        if self._out is None or len(self._out) < raw:
            self._out = np.empty(raw, dtype=np.uint8)
        try:
            decode_block(c, s.number, stored, memoryview(self._out)[:raw], key=s.key)
        except CorruptCheckpointError as e:
            return e
        return None
