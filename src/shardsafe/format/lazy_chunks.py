"""One tensor's chunks of a v2 index, as ``ChunkEntry`` objects built only on demand.

``format.index`` gives each tensor of a decoded v2 index a ``LazyChunks``: it behaves
like the tuple of ``ChunkEntry`` that a v1 index holds, but reads the columns of the
``ChunkTable`` and builds Python objects only when they are asked for, and
``overlapping`` selects the chunks that meet a region with numpy first. A rank that loads
its shard of a 16,384-rank checkpoint thus builds a handful of objects per tensor, not
one per saved chunk.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from .chunk_table import Split
from .index_common import ChunkEntry
from .index_v2 import ColumnarIndex, chunk_rows, stored_blocks


class LazyChunks(Sequence[ChunkEntry]):
    """Tensor ``t``'s chunks of ``index`` (a read-only sequence of ``ChunkEntry``)."""

    __slots__ = ("_index", "_t", "_all")

    def __init__(self, index: ColumnarIndex, t: int) -> None:
        self._index = index
        self._t = t
        self._all: tuple[ChunkEntry, ...] | None = None

    def _entries(self) -> tuple[ChunkEntry, ...]:
        if self._all is None:
            self._all = tuple(ChunkEntry(*row) for row in chunk_rows(self._index, self._t))
        return self._all

    def __len__(self) -> int:
        ts = self._index.chunks.tensor_start
        return int(ts[self._t + 1] - ts[self._t])

    @overload
    def __getitem__(self, i: int) -> ChunkEntry: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[ChunkEntry, ...]: ...
    def __getitem__(self, i: int | slice) -> ChunkEntry | tuple[ChunkEntry, ...]:
        return self._entries()[i]

    def __iter__(self) -> Iterator[ChunkEntry]:
        return iter(self._entries())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (LazyChunks, tuple, list)):
            return self._entries() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._entries())

    def __repr__(self) -> str:
        return f"LazyChunks(tensor={self._t}, chunks={len(self)})"

    @property
    def nbytes(self) -> int:
        """Bytes of all the tensor's chunks (from the columns)."""
        ct = self._index.chunks
        a, b = int(ct.tensor_start[self._t]), int(ct.tensor_start[self._t + 1])
        return int(ct.nbytes[a:b].sum())

    def overlapping(self, offsets: Sequence[int], shape: Sequence[int]) -> list[ChunkEntry]:
        """The chunks that share at least one element with the region (in table order)."""
        ct = self._index.chunks
        split = ct.splits[self._t]
        if split is not None and self._all is None:
            return self._split_overlapping(split, offsets, shape)
        c = ct.tensor_chunks(self._t)
        lo = np.maximum(c.pos, np.asarray(offsets, dtype=np.int64))
        hi = np.minimum(c.pos + c.extent, np.asarray(offsets, dtype=np.int64) + np.asarray(shape, dtype=np.int64))
        keep = np.flatnonzero((hi > lo).all(axis=1)) if c.pos.shape[1] else np.arange(len(c.file))
        if self._all is not None:
            return [self._all[i] for i in keep.tolist()]
        return [self._entry(c.start + i, c.pos[i], c.extent[i]) for i in keep.tolist()]

    def _split_overlapping(self, split: Split, offsets: Sequence[int],
                           shape: Sequence[int]) -> list[ChunkEntry]:
        """``overlapping`` from the split rule: the parts that meet ``[lo, hi)`` along the cut."""
        if any(s <= 0 for s in shape):
            return []
        full = self._index.chunks.shapes[self._t]
        d, step = split.dim, split.step
        first = max(0, offsets[d] // step)
        last = min(len(self) - 1, (offsets[d] + shape[d] - 1) // step)
        start = int(self._index.chunks.tensor_start[self._t])
        out = []
        for i in range(first, last + 1):
            pos = [0] * len(full)
            ext = list(full)
            pos[d], ext[d] = i * step, min(step, full[d] - i * step)
            out.append(self._entry(start + i, np.asarray(pos), np.asarray(ext)))
        return out

    def _entry(self, row: int, pos: Any, extent: Any) -> ChunkEntry:
        ct = self._index.chunks
        return ChunkEntry(self._index.files[int(ct.file[row])].name, int(ct.offset[row]),
                          int(ct.nbytes[row]), tuple(pos.tolist()), tuple(extent.tolist()),
                          tuple(ct.chunk_checksums(row).tolist()), stored_blocks(ct, row))


class LazyTensors(Sequence[Any]):
    """The tensor table of a decoded v2 index as ``TensorEntry`` objects, each built (with
    its ``LazyChunks``) the first time it is asked for: a load that works on the columns
    builds none of them, one that looks at a few tensors builds those.

    ``make(key, kind, dtype, shape, chunks)`` builds an entry (``format.index.TensorEntry``).
    """

    __slots__ = ("_index", "_make", "_built")

    def __init__(self, index: ColumnarIndex, make: Any) -> None:
        self._index = index
        self._make = make
        self._built: list[Any] = [None] * len(index.tensors)

    def __len__(self) -> int:
        return len(self._built)

    def _entry(self, t: int) -> Any:
        e = self._built[t]
        if e is None:
            i = self._index.tensors[t]
            e = self._built[t] = self._make(i.key, i.kind, i.dtype, i.shape, LazyChunks(self._index, t))
        return e

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Any, ...]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return tuple(self._entry(t) for t in range(len(self))[i])
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self._entry(i % len(self))

    def __iter__(self) -> Iterator[Any]:
        return (self._entry(t) for t in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (LazyTensors, tuple, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"LazyTensors({len(self)} tensors)"
