"""Load planning: intersect the region a reader wants with the chunks that were saved.

Pure functions over plain tuples; unit-tested with synthetic chunk lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..format.index import ChunkEntry


@dataclass(frozen=True, slots=True)
class Piece:
    """Copy ``chunk[src]`` into ``dest[dst]``; slices are per-dimension ``(start, stop)``."""

    chunk: ChunkEntry
    src: tuple[tuple[int, int], ...]
    dst: tuple[tuple[int, int], ...]

    @property
    def whole_chunk(self) -> bool:
        return all(a == 0 and b == s for (a, b), s in zip(self.src, self.chunk.shape))


class CoverageError(ValueError):
    """The saved chunks do not cover the wanted region."""


def pieces_for(chunks: Sequence[ChunkEntry], offsets: Sequence[int],
               shape: Sequence[int]) -> list[Piece]:
    """The pieces of saved ``chunks`` that fill the region ``offsets``/``shape``.

    Raises:
        CoverageError: when the chunks leave part of the region uncovered.
    """
    out: list[Piece] = []
    covered = 0
    for c in chunks:
        src, dst = [], []
        for co, cs, wo, ws in zip(c.offsets, c.shape, offsets, shape):
            lo, hi = max(co, wo), min(co + cs, wo + ws)
            if lo >= hi:
                break
            src.append((lo - co, hi - co))
            dst.append((lo - wo, hi - wo))
        else:
            if len(shape) == 0 or all(b > a for a, b in dst):
                out.append(Piece(c, tuple(src), tuple(dst)))
                vol = 1
                for a, b in dst:
                    vol *= b - a
                covered += vol
    want = 1
    for s in shape:
        want *= s
    if want and covered < want:
        raise CoverageError(f"saved chunks cover {covered} of the {want} wanted elements")
    return out


def byte_span(piece: Piece, itemsize: int) -> tuple[int, int]:
    """Bytes ``[lo, hi)`` of the piece's chunk that contain its source region.

    A chunk is row-major, so the region lies between the byte of its first element and
    the end of its last; a slab of whole rows is exactly that range, a column slice the
    smallest range around it.
    """
    shape = piece.chunk.shape
    first = last = 0
    stride = 1
    for (a, b), n in zip(reversed(piece.src), reversed(shape)):
        first += a * stride
        last += (b - 1) * stride
        stride *= n
    return first * itemsize, (last + 1) * itemsize


def block_span(lo: int, hi: int, nbytes: int, block_size: int) -> tuple[int, int, int, int]:
    """Rounds bytes ``[lo, hi)`` of a chunk out to whole checksum blocks.

    Returns:
        ``(first_block, stop_block, start, stop)``: the blocks to verify and the chunk
        bytes ``[start, stop)`` to read for them.
    """
    first, stop_block = lo // block_size, max(1, -(-hi // block_size))
    return first, stop_block, first * block_size, min(stop_block * block_size, nbytes)
