"""A decoded index as Python objects: ``Index`` with a ``TensorEntry`` per tensor, whose
chunks are ``ChunkEntry`` objects built only on demand.

``from_columnar`` gives each tensor of a decoded index (any version) a ``LazyChunks``: it
behaves like a tuple of ``ChunkEntry``, but reads the columns of the ``ChunkTable`` and
builds Python objects only when they are asked for, and ``overlapping`` selects the
chunks that meet a region with numpy first. A rank that loads its shard of a 16,384-rank
checkpoint thus builds a handful of objects per tensor, not one per saved chunk.
``to_columnar`` goes the other way, for an ``Index`` built as objects (tests, tools).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

from .. import tree
from ..blockfile import RAW, BlockCoding
from ..codec import CODECS
from ..dtypes import lookup
from .chunk_table import ChunkTable, Split, detect_split
from .model import ColumnarIndex, IndexHeader, TensorInfo
from .rows import ChunkEntry, FileEntry, StoredBlocks


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """A tensor (or numpy array) of the state, made of one or more chunks.

    Attributes:
        key: Key path of the tensor in the state.
        kind: ``torch`` or ``numpy``: what load rebuilds.
        dtype: Element type name (see format.dtypes).
        shape: Global shape.
        chunks: Chunks that together cover the global tensor exactly once.
    """

    key: tree.KeyPath
    kind: str
    dtype: str
    shape: tuple[int, ...]
    chunks: Sequence[ChunkEntry]

    @property
    def nbytes(self) -> int:
        if isinstance(self.chunks, LazyChunks):
            return self.chunks.nbytes
        return sum(c.nbytes for c in self.chunks)

    def overlapping(self, offsets: Sequence[int], shape: Sequence[int]) -> Sequence[ChunkEntry]:
        """The chunks that may overlap the region ``offsets``/``shape`` (of a decoded index,
        selected with numpy so that only those become Python objects; of one built as
        objects, all of them)."""
        if isinstance(self.chunks, LazyChunks):
            return self.chunks.overlapping(offsets, shape)
        return self.chunks


@dataclass(frozen=True, slots=True)
class Index(IndexHeader):
    """A checkpoint index as objects: decoded (``from_columnar``) or built by hand.

    Decoded, ``table`` holds every chunk as columns, ``infos`` each tensor's key path,
    kind, dtype and shape, and each tensor's ``chunks`` is a ``LazyChunks`` that builds
    ``ChunkEntry`` objects only when asked (``TensorEntry.overlapping`` builds just the
    ones a region needs). Built by hand, ``table`` and ``infos`` are None until encoded.
    """

    tree: tree.Node
    tensors: Sequence[TensorEntry]
    files: tuple[FileEntry, ...]
    block_size: int
    format_version: int = 1
    table: ChunkTable | None = field(default=None, compare=False, repr=False)
    infos: tuple[TensorInfo, ...] | None = field(default=None, compare=False, repr=False)


def from_columnar(ci: ColumnarIndex, version: int) -> Index:
    """The ``Index`` of a decoded index of format ``version``: tensor entries and their
    chunks are built from the columns when asked for (``LazyTensors``)."""
    return Index(tree=ci.tree, tensors=LazyTensors(ci), files=ci.files, block_size=ci.block_size,
                 world_size=ci.world_size, created=ci.created, metadata=ci.metadata,
                 library=ci.library, format_version=version, table=ci.chunks, infos=ci.tensors)


class LazyChunks(Sequence[ChunkEntry]):
    """Tensor ``t``'s chunks of ``index`` (a read-only sequence of ``ChunkEntry``)."""

    __slots__ = ("_index", "_t", "_all")

    def __init__(self, index: ColumnarIndex, t: int) -> None:
        self._index = index
        self._t = t
        self._all: tuple[ChunkEntry, ...] | None = None

    def _entries(self) -> tuple[ChunkEntry, ...]:
        if self._all is None:
            self._all = tuple(chunk_entries(self._index, self._t))
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
                          tuple(ct.chunk_checksums(row).tolist()), stored_blocks(ct, row),
                          () if ct.sub is None else ct.sub.row(row))


class LazyTensors(Sequence[TensorEntry]):
    """The tensor table of a decoded index as ``TensorEntry`` objects, each built (with
    its ``LazyChunks``) the first time it is asked for: a load that works on the columns
    builds none of them, one that looks at a few tensors builds those.

    """

    __slots__ = ("_index", "_built")

    def __init__(self, index: ColumnarIndex) -> None:
        self._index = index
        self._built: list[TensorEntry | None] = [None] * len(index.tensors)

    def __len__(self) -> int:
        return len(self._built)

    def _entry(self, t: int) -> TensorEntry:
        e = self._built[t]
        if e is None:
            i = self._index.tensors[t]
            e = self._built[t] = TensorEntry(i.key, i.kind, i.dtype, i.shape, LazyChunks(self._index, t))
        return e

    @overload
    def __getitem__(self, i: int) -> TensorEntry: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[TensorEntry, ...]: ...
    def __getitem__(self, i: int | slice) -> TensorEntry | tuple[TensorEntry, ...]:
        if isinstance(i, slice):
            return tuple(self._entry(t) for t in range(len(self))[i])
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self._entry(i % len(self))

    def __iter__(self) -> Iterator[TensorEntry]:
        return (self._entry(t) for t in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (LazyTensors, tuple, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"LazyTensors({len(self)} tensors)"


def to_columnar(index: Index) -> ColumnarIndex:
    """The columnar form of an ``Index`` built as objects (tensors split evenly get a ``Split`` rule)."""
    file_id = {f.name: i for i, f in enumerate(index.files)}
    splits: list[Split | None] = []
    offsets, gfile, pos, ext, sums = [], [], [], [], []
    coded: list[tuple[str, int | None, int]] = []  # per block: codec, stored size, stored CRC
    for t in index.tensors:
        nd = len(t.shape)
        if any(c.file not in file_id for c in t.chunks):
            raise ValueError(f"tensor {tree.render_path(t.key)} names a file that is not listed")
        f = np.array([file_id[c.file] for c in t.chunks], dtype=np.int64)
        p = np.array([c.offsets for c in t.chunks], dtype=np.int64).reshape(len(f), nd)
        e = np.array([c.shape for c in t.chunks], dtype=np.int64).reshape(len(f), nd)
        split = detect_split(t.shape, p, e, f)
        splits.append(split)
        if split is None:
            gfile.append(f)
            pos.append(p.reshape(-1))
            ext.append(e.reshape(-1))
        offsets.append(np.array([c.offset for c in t.chunks], dtype=np.int64))
        sums.extend(s for c in t.chunks for s in c.checksums)
        for c in t.chunks:
            st = c.stored
            coded.extend(zip(*(st.codecs, st.sizes, st.checksums)) if st is not None else
                         [(RAW, None, s) for s in c.checksums])

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    infos = tuple(TensorInfo(t.key, t.kind, t.dtype, tuple(t.shape)) for t in index.tensors)
    files = tuple(FileEntry(f.name, f.size, f.data_start, f.rank) for f in index.files)
    table = ChunkTable.build(
        [i.shape for i in infos], [lookup(i.dtype).itemsize for i in infos], splits,
        [len(t.chunks) for t in index.tensors], cat(offsets), cat(gfile), cat(pos), cat(ext),
        np.array(sums, dtype=np.uint32), index.block_size,
        np.array([f.size for f in files], dtype=np.int64),
        np.array([f.data_start for f in files], dtype=np.int64),
        coding=_coding_of(coded, [t.chunks for t in index.tensors], index.block_size))
    return ColumnarIndex(tree=index.tree, tensors=infos, files=files, chunks=table,
                         world_size=index.world_size, created=index.created,
                         metadata=index.metadata, library=index.library)


def _coding_of(blocks: list[tuple[str, int | None, int]], chunks: list[Any],
               block_size: int) -> BlockCoding | None:
    """The ``BlockCoding`` of ``to_columnar``'s blocks (None when no chunk is compressed)."""
    if all(c.stored is None for cs in chunks for c in cs):
        return None
    raw = [min(block_size, c.nbytes - j * block_size) for cs in chunks for c in cs
           for j in range(len(c.checksums))]
    for name, _, _ in blocks:
        if name not in CODECS:
            raise ValueError(f"unknown codec {name!r}")
    return BlockCoding(CODECS, np.array([CODECS.index(n) for n, _, _ in blocks], dtype=np.int64),
                       np.array([r if n is None else n for (_, n, _), r in zip(blocks, raw)], dtype=np.int64),
                       np.array([s for _, _, s in blocks], dtype=np.uint32))


def chunk_entries(index: ColumnarIndex, t: int) -> list[ChunkEntry]:
    """Tensor ``t``'s chunks as ``ChunkEntry`` objects: for what wants objects, not for
    planning at scale."""
    ct = index.chunks
    c = ct.tensor_chunks(t)
    names = [index.files[i].name for i in c.file.tolist()]
    return [ChunkEntry(names[i], int(c.offset[i]), int(c.nbytes[i]), tuple(c.pos[i].tolist()),
             tuple(c.extent[i].tolist()), tuple(ct.chunk_checksums(c.start + i).tolist()),
             stored_blocks(ct, c.start + i), () if ct.sub is None else ct.sub.row(c.start + i))
            for i in range(len(names))]


def stored_blocks(ct: ChunkTable, row: int) -> StoredBlocks | None:
    """Chunk ``row``'s ``StoredBlocks`` (None unless some block of it is compressed)."""
    coding = ct.chunk_coding(row)
    if coding is None:
        return None
    codecs, sizes, sums = coding
    return StoredBlocks(codecs, tuple(sizes.tolist()), tuple(sums.tolist()))
