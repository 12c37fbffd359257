"""Load planning: intersect the region a reader wants with the chunks that were saved.

Pure functions over plain tuples; unit-tested with synthetic chunk lists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..format.index.rows import ChunkEntry

T = TypeVar("T")


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


def coalesce(items: Iterable[T], span: Callable[[T], tuple[str, int, int]], limit: int,
             max_gap: int = 0) -> list[list[T]]:
    """Groups byte ranges into reads: the read coalescer of objects (the load of whole
    raw chunks groups table rows likewise, on columns: ``ChunkReader.whole_tasks``).

    ``span(item)`` is ``(file, offset, nbytes)``. Items are taken in ``(file, offset)``
    order (stable); an item joins the group before it when it lies in the same file,
    starts between 0 and ``max_gap`` bytes after the group's last byte, and the group
    then spans at most ``limit`` bytes. Each group is read as one range, from its first
    item's offset to its furthest end.
    """
    keyed = sorted(((span(it), it) for it in items), key=lambda p: (p[0][0], p[0][1]))
    groups: list[list[T]] = []
    file: str | None = None
    start = end = 0
    for (name, offset, nbytes), it in keyed:
        gap = offset - end
        if groups and name == file and 0 <= gap <= max_gap and offset + nbytes - start <= limit:
            groups[-1].append(it)
            end = offset + nbytes  # gap >= 0: the item ends furthest
        else:
            groups.append([it])
            file, start, end = name, offset, offset + nbytes
    return groups
