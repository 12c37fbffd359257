"""Load planning: intersect the region a reader wants with the chunks that were saved.

Pure functions over plain tuples and columns; unit-tested with synthetic chunk lists.
"""

from __future__ import annotations

from collections.abc import Sequence
import math
from dataclasses import dataclass

import numpy as np

from ..format.index.rows import ChunkEntry
from ..format.tiling import cover_problem


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

    Coverage is proven on the pieces' boxes, not on their volumes: the region must be
    covered exactly once (two chunks with one box hold as many elements as two halves).

    Raises:
        CoverageError: when the chunks leave part of the region uncovered or cover some
            of it twice.
    """
    out: list[Piece] = []
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
    if math.prod(shape) == 0:
        return out
    if len(out) == 1 and all(a == 0 and b == s for (a, b), s in zip(out[0].dst, shape)):
        return out  # one piece filling the region (every same-layout read)
    if not out:
        raise CoverageError(f"no saved chunk covers the wanted region {list(offsets)}+{list(shape)}")
    nd = len(shape)
    boxes = np.array([[a for a, _ in p.dst] + [b - a for a, b in p.dst] for p in out], dtype=np.int64)
    problem = cover_problem(boxes[:, :nd].reshape(len(out), nd), boxes[:, nd:].reshape(len(out), nd), shape)
    if problem is not None:
        raise CoverageError(f"saved chunks do not cover the wanted region {list(offsets)}+{list(shape)} "
                            f"exactly once: {problem}")
    return out


def coalesce(file: Sequence[int] | np.ndarray, offset: Sequence[int] | np.ndarray,
             nbytes: Sequence[int] | np.ndarray, limit: int, max_gap: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Groups byte ranges into reads, on columns: the one read coalescer (the reader's
    small chunks and whole raw chunks, ``shardsafe verify``'s blocks).

    Range ``i`` is bytes ``[offset[i], offset[i] + nbytes[i])`` of file ``file[i]`` (an
    id). Ranges are taken in ``(file, offset)`` order (stable); a range joins the read
    before it when it lies in the same file, starts between 0 and ``max_gap`` bytes after
    that read's last byte, and the read then spans at most ``limit`` bytes. Each read
    covers its ranges from its first range's offset to its last range's end.

    Returns ``(order, bounds)``: the ranges in that order, and where each read begins in
    it (read ``g`` is ``order[bounds[g]:bounds[g + 1]]``; ``bounds`` ends with the count).
    Vectorised but for one step per read of a run of neighbouring ranges longer than
    ``limit`` (20,000 tiny tensors cost a few numpy calls, not 20,000 Python steps).
    """
    f = np.asarray(file, dtype=np.int64)
    o = np.asarray(offset, dtype=np.int64)
    order = np.lexsort((o, f))
    f, o = f[order], o[order]
    e = o + np.asarray(nbytes, dtype=np.int64)[order]
    n = len(order)
    brk = np.ones(n, dtype=bool)  # a new run where the file changes, a gap opens or ranges overlap
    brk[1:] = (f[1:] != f[:-1]) | (o[1:] - e[:-1] > max_gap) | (o[1:] < e[:-1])
    runs = [*np.flatnonzero(brk).tolist(), n]
    bounds: list[int] = []
    for a, b in zip(runs, runs[1:]):
        if e[b - 1] - o[a] <= limit:
            bounds.append(a)
            continue
        i = a  # within a run the ends only grow: the next read starts at the first range past the limit
        while i < b:
            bounds.append(i)
            i = max(i + 1, a + int(np.searchsorted(e[a:b], o[i] + limit, side="right")))
    bounds.append(n)
    return order, np.asarray(bounds, dtype=np.int64)
