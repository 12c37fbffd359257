"""Each rank's part of the index as columns, and the v2 chunk table built from all parts.

A rank describes the chunks it wrote as a few numpy arrays (``Entries``); a collective
save sends them to rank 0 as compact binary (``encode``/``decode``: a small JSON head
for the file list, then little-endian columns), and rank 0 concatenates every rank's
columns, orders the chunks and builds the v2 ``ChunkTable`` directly (``columnar_index``)
without a Python object per chunk. Pure: no I/O, no communication.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import CheckpointError
from ..format.blockfile import DATA_START as BLOCK_FILE_DATA_START
from ..format.blockfile import BlockCoding, block_raw_sizes
from ..format.chunk_table import ChunkTable, Split, detect_split
from ..format.codec import CODECS
from ..format.dtypes import lookup
from ..format.index_common import FileEntry
from ..format.index_v2 import ColumnarIndex, TensorInfo
from ..format.tree import render_path
from ..plan.flatten import TensorItem
from ..plan.layout import FilePlan

I64 = np.dtype("<i8")
_COLS = ("item", "file", "offset", "nsums", "pos", "extent", "sums", "codec", "stored", "stored_sums")
_U4 = ("sums", "stored_sums")
_CODING = ("codec", "stored", "stored_sums")  # sent empty when the rank compressed nothing
_HEAD = struct.Struct("<Q")


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


def from_plans(plans: Sequence[FilePlan], checksums: Sequence[Sequence[Sequence[int]]], rank: int) -> Entries:
    """The entries of the files this rank wrote, given each file's per-item block checksums."""
    item, file, offset, nsums, pos, extent, sums = [], [], [], [], [], [], []
    for f, (plan, per_item) in enumerate(zip(plans, checksums)):
        for it, off, s in zip(plan.items, plan.layout.offsets, per_item):
            item.append(it.id)
            file.append(f)
            offset.append(off)
            nsums.append(len(s))
            pos.extend(it.offsets)
            extent.extend(it.local_shape)
            sums.extend(s)
    files = [FileEntry(p.name, p.layout.size, p.layout.data_start, rank) for p in plans]
    a = [np.array(x, dtype=I64) for x in (item, file, offset, nsums, pos, extent)]
    zeros = np.zeros(len(sums), dtype=I64)
    return Entries(files, *a, np.array(sums, dtype=np.uint32), zeros, zeros,
                   zeros.astype(np.uint32))


@dataclass(slots=True)
class CodedFile:
    """A block file as written (``engine.block_writer``): per item, where its chunk
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
    return Entries(files, **cols)


def encode(e: Entries) -> bytes:
    """Bytes of one rank's entries: u64 head length, JSON head, then the columns (the
    coding columns empty when every block is raw: an uncompressed save sends no more)."""
    skip = () if e.codec.any() else _CODING
    arrays = {c: getattr(e, c)[:0] if c in skip else getattr(e, c) for c in _COLS}
    head = json.dumps({"files": [[f.name, f.size, f.data_start, f.rank] for f in e.files],
                       "lengths": [len(arrays[c]) for c in _COLS]},
                      separators=(",", ":")).encode("utf-8")
    cols = [np.ascontiguousarray(arrays[c], dtype="<u4" if c in _U4 else I64).tobytes()
            for c in _COLS]
    return b"".join([_HEAD.pack(len(head)), head, *cols])


def decode(data: bytes) -> Entries:
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
        if at != len(data):
            raise ValueError("trailing bytes")
        for c in _CODING:
            if len(cols[c]) == 0 and len(cols["sums"]):  # every block raw (see encode)
                cols[c] = np.zeros(len(cols["sums"]), dtype=cols[c].dtype)
        return Entries([FileEntry(*f) for f in head["files"]], **cols)
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


def columnar_index(items: Sequence[TensorItem], parts: Sequence[Entries], block_size: int,
                   **header: object) -> ColumnarIndex:
    """The v2 index of a save from every rank's entries (``header``: tree, world_size, ...).

    Raises:
        CheckpointError: the ranks' chunks do not hold exactly each tensor's elements.
        CorruptCheckpointError: the chunks overlap or do not fit their files (a bug).
    """
    files, c = _concat(parts)
    slot = {it.id: t for t, it in enumerate(items)}
    t_of = np.array([slot.get(i, -1) for i in c["item"].tolist()], dtype=np.int64)
    if (t_of < 0).any():
        raise CheckpointError(f"a rank wrote chunks of unknown item {int(c['item'][np.argmin(t_of)])}")
    ndims = np.array([len(it.shape) for it in items], dtype=np.int64)
    nd = ndims[t_of] if len(t_of) else np.zeros(0, dtype=np.int64)
    width = int(ndims.max()) if len(ndims) else 0
    pos, ext = _padded(c["pos"], nd, width, 0), _padded(c["extent"], nd, width, 1)
    order = np.lexsort(tuple(pos[:, k] for k in reversed(range(width))) + (t_of,))
    _check_coverage(items, t_of[order], ext[order])
    counts = np.bincount(t_of, minlength=len(items))
    t_sorted, pos, ext = t_of[order], pos[order], ext[order]
    file, starts = c["file"][order], np.concatenate([[0], np.cumsum(counts)])
    splits: list[Split | None] = []
    general = np.zeros(len(order), dtype=bool)
    for t, it in enumerate(items):
        a, b, k = int(starts[t]), int(starts[t + 1]), len(it.shape)
        split = detect_split(it.shape, pos[a:b, :k], ext[a:b, :k], file[a:b])
        splits.append(split)
        general[a:b] = split is None
    keep = general[:, None] & (np.arange(width) < ndims[t_sorted][:, None])
    itemsizes = [lookup(it.dtype).itemsize for it in items]
    sums = _gather_runs(c["sums"], c["nsums"], order)
    table = ChunkTable.build(
        [it.shape for it in items], itemsizes, splits,
        counts.tolist(), c["offset"][order], file[general], pos[keep], ext[keep],
        sums, block_size,
        np.array([f.size for f in files], dtype=np.int64),
        np.array([f.data_start for f in files], dtype=np.int64),
        lambda t: render_path(items[t].path),
        _coding(c, order, sums, np.prod(ext, axis=1, dtype=np.int64) * np.asarray(itemsizes, dtype=np.int64)[t_sorted]
                if len(order) else np.zeros(0, dtype=np.int64), block_size))
    infos = tuple(TensorInfo(it.path, it.kind, it.dtype, tuple(it.shape)) for it in items)
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
    for t in np.flatnonzero(held != np.array([math.prod(it.shape) for it in items], dtype=np.int64)).tolist()[:1]:
        it = items[t]
        raise CheckpointError(f"the ranks' chunks of {render_path(it.path)!r} hold {int(held[t])} "
                              f"elements, its global shape {list(it.shape)} needs {math.prod(it.shape)}")
