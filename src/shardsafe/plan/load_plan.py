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
