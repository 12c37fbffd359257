"""Each rank's part of the index as columns, and the chunk table built from all parts.

A rank describes the chunks it wrote, and those it references in earlier steps' files
(``ChunkRef``, incremental saves), as a few numpy arrays (``Entries``); a collective
save sends them to rank 0 as compact binary (``encode``/``decode``: a small JSON head
for the file list, then little-endian columns), and rank 0 concatenates every rank's
columns, orders the chunks and builds the ``ChunkTable`` directly (``columnar_index``)
without a Python object per chunk. Pure: no I/O, no communication.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator, Sequence
from itertools import chain
from dataclasses import dataclass, replace

import numpy as np

from ...errors import CheckpointError
from ...format.blockfile import DATA_START as BLOCK_FILE_DATA_START
from ...format.blockfile import RAW, BlockCoding, CodedBlock, block_raw_sizes
from ...format.index.chunk_table import ChunkTable, Split, detect_split
from ...format.codec import CODECS
from ...format.dtypes import lookup
from ...format.index.rows import FileEntry, split_reference
from ...format.index.model import ColumnarIndex, TensorInfo
from ...format.sub_blocks import SUB_BLOCK_SIZE, SubBlocks, num_sub_blocks
from ...format.tree import render_path
from ...plan.flatten import TensorItem
from ...plan.layout import FilePlan

I64 = np.dtype("<i8")
_COLS = ("item", "file", "offset", "nsums", "pos", "extent", "sums", "codec", "stored", "stored_sums")
_U4 = ("sums", "stored_sums")
_CODING = ("codec", "stored", "stored_sums")  # sent empty when the rank compressed nothing
_HEAD = struct.Struct("<Q")


class BlockSums(Sequence[list[int]]):
    """The block checksums of a file's items: item ``i``'s are ``flat[first[i]:first[i + 1]]``.

    Reads as a sequence of per-item lists (what the index builder and incremental saves
    take); ``flat`` and ``first`` give the same numbers as columns. ``sub`` holds the
    sub-block checksums (``format.sub_blocks``) of items larger than ``sub_size``, item
    ``i``'s at ``sub[sub_first[i]:sub_first[i + 1]]``, where they were computed.
    """

    def __init__(self, flat: np.ndarray, first: np.ndarray, sub: np.ndarray | None = None,
                 sub_first: np.ndarray | None = None, sub_size: int = 0) -> None:
        self.flat = flat
        self.first = first
        self.sub = sub
        self.sub_first = sub_first
        self.sub_size = sub_size

    def __len__(self) -> int:
        return len(self.first) - 1

    def __getitem__(self, i: int) -> list[int]:  # type: ignore[override]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        return self.flat[self.first[i] : self.first[i + 1]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        flat, first = self.flat.tolist(), self.first.tolist()
        return (flat[a:b] for a, b in zip(first, first[1:]))


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """Where the bytes of a chunk are stored already.

    Attributes:
        file: The data file, named ``<step directory>/<file>`` (relative to the manager
            directory), with its size, data start and rank.
        offset: Byte offset of the chunk in that file.
        checksums: The chunk's block checksums (CRC32C of the raw bytes), as in the index
            that wrote it.
        codec, stored, stored_checksums: Per block, for a chunk stored in a block file
            (docs/FORMAT.md section 12): codec id (``format.codec.CODECS``), stored size and
            CRC32C of the stored bytes; empty for a chunk stored raw in a safetensors file.
    """

    file: FileEntry
    offset: int
    checksums: tuple[int, ...]
    codec: tuple[int, ...] = ()
    stored: tuple[int, ...] = ()
    stored_checksums: tuple[int, ...] = ()


@dataclass(slots=True)
class Entries:
    """One rank's chunks (one row per chunk) and the data files it wrote.

    Attributes:
        files: The rank's data files; ``file`` indexes this list.
        item, file, offset, nsums: Per chunk: item id, file, byte offset, checksum count.
        pos, extent: Flat starts / shapes of the chunks (each chunk has its item's ndim).
        sums: Block checksums of every chunk, chunk by chunk (uint32).
        codec, stored, stored_sums: Per block (aligned with ``sums``): codec id
            (``format.codec.CODECS``), stored size and CRC32C of the stored bytes. Raw
            blocks (codec 0) leave the other two 0: ``columnar_index`` derives them.
        subs: The sub-block checksums (``format.sub_blocks``, ``SUB_BLOCK_SIZE``) of every
            chunk larger than one sub-block, chunk by chunk; None where some are not known
            (then the index records none).
    """

    files: list[FileEntry]
    item: np.ndarray
    file: np.ndarray
    offset: np.ndarray
    nsums: np.ndarray
    pos: np.ndarray
    extent: np.ndarray
    sums: np.ndarray
    codec: np.ndarray
    stored: np.ndarray
    stored_sums: np.ndarray
    subs: np.ndarray | None = None


def from_plans(plans: Sequence[FilePlan], checksums: Sequence[Sequence[Sequence[int]]], rank: int,
               refs: Sequence[tuple[TensorItem, ChunkRef]] = ()) -> Entries:
    """The entries of the files this rank wrote, given each file's per-item block checksums
    (a ``BlockSums`` is taken as columns), plus the chunks it references in earlier steps'
    files (``refs``, incremental saves; a referenced compressed chunk keeps its coding columns)."""
    cols: dict[str, list[np.ndarray]] = {c: [] for c in ("item", "file", "offset", "nsums", "sums")}
    pos: list[int] = []
    extent: list[int] = []
    for f, (plan, per_item) in enumerate(zip(plans, checksums)):
        items = plan.items
        cols["item"].append(np.fromiter((it.id for it in items), dtype=I64, count=len(items)))
        cols["file"].append(np.full(len(items), f, dtype=I64))
        cols["offset"].append(np.asarray(plan.layout.offsets, dtype=I64).reshape(len(items)))
        if isinstance(per_item, BlockSums):
            cols["nsums"].append(np.diff(per_item.first))
            cols["sums"].append(per_item.flat.astype(np.uint32, copy=False))
        else:
            cols["nsums"].append(np.array([len(s) for s in per_item], dtype=I64).reshape(len(items)))
            cols["sums"].append(np.array([x for s in per_item for x in s], dtype=np.uint32))
        pos.extend(chain.from_iterable(it.offsets for it in items))
        extent.extend(chain.from_iterable(it.local_shape for it in items))
    ref_files = reference_files(refs)
    ref_id = {f.name: len(plans) + i for i, f in enumerate(ref_files)}
    if refs:
        cols["item"].append(np.array([it.id for it, _ in refs], dtype=I64))
        cols["file"].append(np.array([ref_id[r.file.name] for _, r in refs], dtype=I64))
        cols["offset"].append(np.array([r.offset for _, r in refs], dtype=I64))
        cols["nsums"].append(np.array([len(r.checksums) for _, r in refs], dtype=I64))
        cols["sums"].append(np.array([x for _, r in refs for x in r.checksums], dtype=np.uint32))
        pos.extend(chain.from_iterable(it.offsets for it, _ in refs))
        extent.extend(chain.from_iterable(it.local_shape for it, _ in refs))
    files = [FileEntry(p.name, p.layout.size, p.layout.data_start, rank) for p in plans] + ref_files
    a = {c: np.concatenate(v) if v else np.zeros(0, dtype=np.uint32 if c == "sums" else I64)
         for c, v in cols.items()}
    sums = a.pop("sums")
    codec, stored, stored_sums = (np.zeros(len(sums), dtype=I64) for _ in range(3))
    if any(r.codec for _, r in refs):  # referenced compressed chunks keep their coding
        at = len(sums) - sum(len(r.checksums) for _, r in refs)
        for _, r in refs:
            n = len(r.checksums)
            if r.codec:
                codec[at : at + n], stored[at : at + n], stored_sums[at : at + n] = (
                    r.codec, r.stored, r.stored_checksums)
            at += n
    return Entries(files, a["item"], a["file"], a["offset"], a["nsums"], np.array(pos, dtype=I64),
                   np.array(extent, dtype=I64), sums, codec, stored, stored_sums.astype(np.uint32),
                   _plan_subs(checksums, refs))


def _plan_subs(checksums: Sequence[Sequence[Sequence[int]]], refs: Sequence[tuple[TensorItem, ChunkRef]]
               ) -> np.ndarray | None:
    """The sub-block checksums of the files' items, when every file's were computed and no
    referenced chunk needs any (references carry block checksums only)."""
    if not all(isinstance(c, BlockSums) and c.sub is not None and c.sub_size == SUB_BLOCK_SIZE for c in checksums):
        return None
    if any(math.prod(it.local_shape) * lookup(it.dtype).itemsize > SUB_BLOCK_SIZE for it, _ in refs):
        return None
    subs = [c.sub for c in checksums]  # type: ignore[attr-defined]
    return np.concatenate(subs).astype(np.uint32) if subs else np.zeros(0, dtype=np.uint32)


def reference_files(refs: Sequence[tuple[TensorItem, ChunkRef]]) -> list[FileEntry]:
    """The distinct files ``refs`` point at, in first-use order (each a reference name)."""
    seen: dict[str, FileEntry] = {}
    for _, ref in refs:
        if split_reference(ref.file.name) is None:
            raise ValueError(f"{ref.file.name!r} is not a reference name")
        seen.setdefault(ref.file.name, ref.file)
    return list(seen.values())


@dataclass(slots=True)
class CodedFile:
    """A block file as written (``engine.save.assembly``): per item, where its chunk
    starts and how each of its blocks is stored.

    Attributes:
        name: The file's name.
        size: Bytes of the file.
        items: The items whose chunks it holds, in file order.
        offsets: Absolute offset of each item's compressed chunk.
        sums, codec, stored, stored_sums: Per item, per block: raw CRC32C, codec id,
            stored size, stored CRC32C.
    """

    name: str
    size: int
    items: list[TensorItem]
    offsets: list[int]
    sums: list[list[int]]
    codec: list[list[int]]
    stored: list[list[int]]
    stored_sums: list[list[int]]

    @classmethod
    def empty(cls, name: str) -> CodedFile:
        """A block file holding nothing yet (its magic bytes)."""
        return cls(name, BLOCK_FILE_DATA_START, [], [], [], [], [], [])

    def begin_item(self, item: TensorItem) -> None:
        """Starts ``item``'s chunk at the end of the file."""
        self.items.append(item)
        self.offsets.append(self.size)
        for col in (self.sums, self.codec, self.stored, self.stored_sums):
            col.append([])

    def add_block(self, c: CodedBlock) -> None:
        """Appends block ``c`` to the chunk begun last."""
        self.sums[-1].append(c.raw_crc)
        self.codec[-1].append(CODECS.index(c.codec))
        self.stored[-1].append(0 if c.codec == RAW else len(c.data))
        self.stored_sums[-1].append(0 if c.codec == RAW else c.stored_crc)
        self.size += len(c.data)


def from_block_files(written: Sequence[CodedFile], rank: int) -> Entries:
    """The entries of the block files this rank wrote."""
    cols: dict[str, list[int]] = {c: [] for c in _COLS}
    files = []
    for f, w in enumerate(written):
        files.append(FileEntry(w.name, w.size, BLOCK_FILE_DATA_START, rank))
        for i, it in enumerate(w.items):
            cols["item"].append(it.id)
            cols["file"].append(f)
            cols["offset"].append(w.offsets[i])
            cols["nsums"].append(len(w.sums[i]))
            cols["pos"].extend(it.offsets)
            cols["extent"].extend(it.local_shape)
            for c in ("sums", "codec", "stored", "stored_sums"):
                cols[c].extend(getattr(w, c)[i])
    return Entries(files, **{c: np.array(v, dtype=np.uint32 if c in _U4 else I64) for c, v in cols.items()})


def join(parts: Sequence[Entries]) -> Entries:
    """One rank's entries from several groups of its files (file ids renumbered)."""
    files, cols = _concat(parts)
    return Entries(files, **cols, subs=_concat_subs(parts))


def _concat_subs(parts: Sequence[Entries]) -> np.ndarray | None:
    if any(p.subs is None for p in parts):
        return None
    return np.concatenate([p.subs for p in parts]) if parts else np.zeros(0, dtype=np.uint32)  # type: ignore[misc]


def encode(e: Entries) -> bytes:
    """Bytes of one rank's entries: u64 head length, JSON head, then the columns (the
    coding columns empty when every block is raw: an uncompressed save sends no more)."""
    skip = () if e.codec.any() else _CODING
    arrays = {c: getattr(e, c)[:0] if c in skip else getattr(e, c) for c in _COLS}
    head = json.dumps({"files": [[f.name, f.size, f.data_start, f.rank] for f in e.files],
                       "lengths": [len(arrays[c]) for c in _COLS], "subs": None if e.subs is None else len(e.subs)},
                      separators=(",", ":")).encode("utf-8")
    cols = [np.ascontiguousarray(arrays[c], dtype="<u4" if c in _U4 else I64).tobytes()
            for c in _COLS] + ([] if e.subs is None else [np.ascontiguousarray(e.subs, dtype="<u4").tobytes()])
    return b"".join([_HEAD.pack(len(head)), head, *cols])


def decode(data: bytes | bytearray) -> Entries:
    """Inverse of ``encode``.

    Raises:
        CheckpointError: the bytes are not a rank's entries (a bug or a foreign sender).
    """
    try:
        (n,) = _HEAD.unpack_from(data)
        head = json.loads(data[_HEAD.size : _HEAD.size + n].decode("utf-8"))
        at, cols = _HEAD.size + n, {}
        for c, length in zip(_COLS, head["lengths"], strict=True):
            dt = np.dtype("<u4" if c in _U4 else I64)
            cols[c] = np.frombuffer(data, dtype=dt, count=length, offset=at).astype(
                np.uint32 if c in _U4 else np.int64)
            at += length * dt.itemsize
        subs = None
        if head.get("subs") is not None:
            subs = np.frombuffer(data, dtype="<u4", count=head["subs"], offset=at).astype(np.uint32)
            at += 4 * len(subs)
        if at != len(data):
            raise ValueError("trailing bytes")
        for c in _CODING:
            if len(cols[c]) == 0 and len(cols["sums"]):  # every block raw (see encode)
                cols[c] = np.zeros(len(cols["sums"]), dtype=cols[c].dtype)
        return Entries([FileEntry(*f) for f in head["files"]], **cols, subs=subs)
    except (ValueError, KeyError, TypeError, struct.error) as e:
        raise CheckpointError(f"a rank sent malformed chunk entries: {e}") from None


def _concat(parts: Sequence[Entries]) -> tuple[list[FileEntry], dict[str, np.ndarray]]:
    files: list[FileEntry] = []
    cols: dict[str, list[np.ndarray]] = {c: [] for c in _COLS}
    for p in parts:
        for c in _COLS:
            cols[c].append(p.file + len(files) if c == "file" else getattr(p, c))
        files.extend(p.files)
    return files, {c: np.concatenate(v) if v else np.zeros(0, dtype=np.uint32 if c in _U4 else np.int64)
                   for c, v in cols.items()}


def _padded(flat: np.ndarray, ndim: np.ndarray, width: int, fill: int) -> np.ndarray:
    """``(chunks, width)`` matrix of per-chunk tuples stored back to back in ``flat``."""
    starts = np.cumsum(ndim) - ndim
    out = np.full((len(ndim), width), fill, dtype=np.int64)
    for k in range(width):
        has = ndim > k
        out[has, k] = flat[starts[has] + k]
    return out


def _gather_runs(values: np.ndarray, lengths: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``values`` holds runs of ``lengths``; returns the runs in ``order``."""
    starts = np.cumsum(lengths) - lengths
    ln = lengths[order]
    total = int(ln.sum())
    idx = np.repeat(starts[order] - (np.cumsum(ln) - ln), ln) + np.arange(total, dtype=np.int64)
    return values[idx]


def _table_slots(items: Sequence[TensorItem], item_ids: np.ndarray) -> np.ndarray:
    """The tensor-table position of each chunk's item (``item_ids`` are item ids)."""
    ids = np.fromiter((it.id for it in items), dtype=I64, count=len(items))
    if len(ids) and (ids == np.arange(len(ids))).all():  # a single process numbers them so
        t_of = item_ids.copy()
        unknown = (t_of < 0) | (t_of >= len(ids))
    else:
        sort = np.argsort(ids, kind="stable")
        at = np.minimum(np.searchsorted(ids[sort], item_ids), max(len(ids) - 1, 0))
        unknown = ids[sort][at] != item_ids if len(ids) else np.ones(len(item_ids), dtype=bool)
        t_of = sort[at] if len(ids) else np.zeros(len(item_ids), dtype=I64)
    if unknown.any():
        raise CheckpointError(f"a rank wrote chunks of unknown item {int(item_ids[np.argmax(unknown)])}")
    return t_of


def _splits(items: Sequence[TensorItem], counts: np.ndarray, starts: np.ndarray, pos: np.ndarray,
            ext: np.ndarray, file: np.ndarray) -> list[Split | None]:
    """Each tensor's split rule (see ``detect_split``), from the chunk rows sorted by tensor.

    A tensor with one whole chunk (every tensor of a single-process save) is decided from
    the columns at once, and its ``Split`` is shared with every tensor of the same first
    dimension and file (splits are immutable).
    """
    nt = len(items)
    shapes = [it.shape for it in items]
    width = pos.shape[1]
    gshape = np.ones((nt, width), dtype=I64)
    ndim = np.fromiter(map(len, shapes), dtype=I64, count=nt)
    if width and nt:
        dims = np.fromiter(chain.from_iterable(shapes), dtype=I64, count=int(ndim.sum()))
        gshape[np.arange(width) < ndim[:, None]] = dims
    first = np.minimum(starts[:-1], max(len(file) - 1, 0))
    whole = (counts == 1) & (ndim > 0) & (gshape.min(axis=1, initial=1) >= 1)
    if len(file):
        whole &= (pos[first] == 0).all(axis=1) & (ext[first] == gshape).all(axis=1)
    shared: dict[tuple[int, int], Split] = {}
    out: list[Split | None] = []
    rows0, files0 = first.tolist(), file[first].tolist() if len(file) else [0] * nt
    for t, (w, r, f) in enumerate(zip(whole.tolist(), rows0, files0)):
        if w:
            key = (shapes[t][0], f)
            sp = shared.get(key)
            if sp is None:
                sp = shared[key] = Split(0, int(shapes[t][0]), int(f), 0)
            out.append(sp)
        else:
            a, b, k = int(starts[t]), int(starts[t + 1]), len(shapes[t])
            out.append(detect_split(shapes[t], pos[a:b, :k], ext[a:b, :k], file[a:b]))
    return out


def columnar_index(items: Sequence[TensorItem], parts: Sequence[Entries], block_size: int,
                   **header: object) -> ColumnarIndex:
    """The columnar index of a save from every rank's entries (``header``: tree, world_size, ...).

    Raises:
        CheckpointError: the ranks' chunks do not hold exactly each tensor's elements.
        CorruptCheckpointError: the chunks overlap or do not fit their files (a bug).
    """
    files, c = _concat(parts)
    t_of = _table_slots(items, c["item"])
    ndims = np.fromiter((len(it.shape) for it in items), dtype=I64, count=len(items))
    nd = ndims[t_of] if len(t_of) else np.zeros(0, dtype=I64)
    width = int(ndims.max()) if len(ndims) else 0
    pos, ext = _padded(c["pos"], nd, width, 0), _padded(c["extent"], nd, width, 1)
    if len(t_of) and (np.diff(t_of) > 0).all():  # one chunk per tensor, in table order
        order = np.arange(len(t_of), dtype=I64)
    else:
        order = np.lexsort(tuple(pos[:, k] for k in reversed(range(width))) + (t_of,))
    _check_coverage(items, t_of[order], ext[order])
    counts = np.bincount(t_of, minlength=len(items))
    t_sorted, pos, ext = t_of[order], pos[order], ext[order]
    file, starts = c["file"][order], np.concatenate([[0], np.cumsum(counts)])
    splits = _splits(items, counts, starts, pos, ext, file)
    is_general = np.fromiter((s is None for s in splits), dtype=bool, count=len(splits))
    general = is_general[t_sorted] if len(t_sorted) else np.zeros(0, dtype=bool)
    keep = general[:, None] & (np.arange(width) < ndims[t_sorted][:, None])
    sizes = {d: lookup(d).itemsize for d in {it.dtype for it in items}}
    itemsizes = [sizes[it.dtype] for it in items]
    sums = _gather_runs(c["sums"], c["nsums"], order)
    nbytes = (np.prod(ext, axis=1, dtype=np.int64) * np.asarray(itemsizes, dtype=np.int64)[t_sorted]
              if len(order) else np.zeros(0, dtype=np.int64))
    table = ChunkTable.build(
        [it.shape for it in items], itemsizes, splits,
        counts.tolist(), c["offset"][order], file[general], pos[keep], ext[keep],
        sums, block_size,
        np.array([f.size for f in files], dtype=np.int64),
        np.array([f.data_start for f in files], dtype=np.int64),
        lambda t: render_path(items[t].path),
        _coding(c, order, sums, nbytes, block_size))
    subs = _concat_subs(parts)
    if subs is not None and len(subs):  # an index with no chunk above one sub-block records none
        pre = np.empty_like(nbytes)
        pre[order] = nbytes
        nsub = num_sub_blocks(pre, SUB_BLOCK_SIZE)
        if len(subs) != int(nsub.sum()):
            raise CheckpointError(f"the ranks sent {len(subs)} sub-block checksums, their chunks have {int(nsub.sum())}")
        table = replace(table, sub=SubBlocks.of(SUB_BLOCK_SIZE, _gather_runs(subs, nsub, order), nbytes))
    infos = tuple(map(TensorInfo, [it.path for it in items], [it.kind for it in items],
                      [it.dtype for it in items], [tuple(it.shape) for it in items]))
    return ColumnarIndex(tensors=infos, files=tuple(files), chunks=table, **header)  # type: ignore[arg-type]


def _coding(c: dict[str, np.ndarray], order: np.ndarray, sums: np.ndarray, nbytes: np.ndarray,
            block_size: int) -> BlockCoding | None:
    """The table's ``BlockCoding`` (None when no block is compressed): the ranks' per-block
    columns in chunk order, with raw blocks' stored size and checksum filled in."""
    codec = _gather_runs(c["codec"], c["nsums"], order)
    if not codec.any():
        return None
    stored = _gather_runs(c["stored"], c["nsums"], order)
    stored_sums = _gather_runs(c["stored_sums"], c["nsums"], order)
    raw = codec == 0
    block_start = np.concatenate([[0], np.cumsum(c["nsums"][order])])
    stored[raw] = block_raw_sizes(nbytes, block_start, block_size)[raw]
    stored_sums[raw] = sums[raw]
    return BlockCoding(CODECS, codec, stored, stored_sums)


def _check_coverage(items: Sequence[TensorItem], t_sorted: np.ndarray, ext: np.ndarray) -> None:
    """Every tensor's chunks (sorted by tensor) hold exactly its number of elements."""
    vol = np.prod(ext, axis=1, dtype=np.int64) if ext.shape[1] else np.ones(len(ext), np.int64)
    held = np.zeros(len(items), dtype=np.int64)
    np.add.at(held, t_sorted, vol)
    want = np.fromiter((math.prod(it.shape) for it in items), dtype=np.int64, count=len(items))
    for t in np.flatnonzero(held != want).tolist()[:1]:
        it = items[t]
        raise CheckpointError(f"the ranks' chunks of {render_path(it.path)!r} hold {int(held[t])} "
                              f"elements, its global shape {list(it.shape)} needs {math.prod(it.shape)}")
