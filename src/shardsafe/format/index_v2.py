"""Index format version 2: the binary container (``format.container``) with the chunk
table as little-endian columns (docs/FORMAT.md section 11 is the byte-by-byte spec).

The JSON part holds what v1 holds except the chunks: metadata, files, tensors (each with
its chunk count and, for an even split, the split rule), the tree, and each column's
element type and length. Decoding checks everything ``chunk_table`` and the rules of
FORMAT.md section 9 ask, with numpy, in time and memory linear in the index size.
``TensorInfo`` and ``ColumnarIndex`` are what every index version decodes into.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import itemgetter, mul
from typing import Any, NamedTuple, Protocol

import numpy as np

from . import tree
from .checksum import ALGORITHM
from .blockfile import RAW, BlockCoding
from .codec import CODECS
from .chunk_table import ChunkTable, Split, check_tensor_rows, detect_split
from .container import dumps, narrowest, open_container, read_columns, seal
from .dtypes import lookup
from .index_common import (IndexHeader, MAX_DIM, MAX_EXTENT_BYTES, MAX_NDIM, TENSOR_KINDS, FileEntry,
                           StoredBlocks, bad, check_int, check_tree, decode_files, encode_files, header_fields,
                           tensor_header, tensor_key)

VERSION = 2
COLUMNS = ("offset", "file", "pos", "extent", "crc32c")
# Present only in an index with compressed chunks, after COLUMNS (FORMAT.md 12.2): per block,
# its codec (index into the JSON member "codecs"), stored size and stored CRC32C.
CODED_COLUMNS = ("codec", "stored", "stored_crc32c")


class TensorInfo(NamedTuple):
    """A tensor of a v2 index (its chunks are rows of the ``ChunkTable``)."""

    key: tree.KeyPath
    kind: str
    dtype: str
    shape: tuple[int, ...]


FileInfo = FileEntry  # a data file of a v2 index: the same members as v1's ``files[]``


@dataclass(frozen=True, slots=True, eq=False)
class ColumnarIndex(IndexHeader):
    """A decoded, validated v2 index; ``chunks`` holds every chunk as columns."""

    tree: tree.Node
    tensors: tuple[TensorInfo, ...]
    files: tuple[FileInfo, ...]
    chunks: ChunkTable

    @property
    def block_size(self) -> int:
        return self.chunks.block_size

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ColumnarIndex):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in
                   ("tree", "tensors", "files", "chunks", "world_size", "created", "metadata", "library"))


# ----------------------------------------------------------------------------- encoding


def stored_columns(ct: ChunkTable) -> dict[str, np.ndarray]:
    """The arrays a v2 index stores (split tensors keep neither file ids nor positions)."""
    general = np.zeros(ct.num_chunks, dtype=bool)
    for t, s in enumerate(ct.splits):
        if s is None:
            general[ct.tensor_start[t] : ct.tensor_start[t + 1]] = True
    cols = {"offset": ct.offset, "file": ct.file[general], "pos": ct.pos, "extent": ct.extent,
            "crc32c": ct.checksums}
    if ct.coding is not None:
        cols.update(codec=ct.coding.codec, stored=ct.coding.stored, stored_crc32c=ct.coding.checksums)
    return cols


def header_members(index: ColumnarIndex) -> dict[str, Any]:
    """The JSON members that open a v2 or v3 index, in order (library to files)."""
    return {"library": index.library, "created": index.created, "world_size": index.world_size,
            "checksum": ALGORITHM, "block_size": index.chunks.block_size, "metadata": index.metadata,
            "files": encode_files(index.files)}


def encode(index: ColumnarIndex) -> bytes:
    """The bytes of a v2 index."""
    ct = index.chunks
    cols = stored_columns(ct)
    kinds = {n: ("<u4" if n.endswith("crc32c") else narrowest(a)) for n, a in cols.items()}
    names = COLUMNS + (CODED_COLUMNS if ct.coding is not None else ())
    body = header_members(index)
    rest: dict[str, Any] = {"columns": {n: [kinds[n], len(cols[n])] for n in names}}
    if ct.coding is not None:
        rest["codecs"] = list(ct.coding.codecs)
    rest["tree"] = index.tree
    head, tail = dumps(body), dumps(rest)
    # the JSON of {**body, "tensors": [...], **rest}, with the rows written as text
    js = "".join([head[:-1], ',"tensors":[', _tensor_rows(index.tensors, ct), "],", tail[1:]]).encode("utf-8")
    return seal(js, [cols[n] for n in names], [kinds[n] for n in names], VERSION)


def _tensor_rows(tensors: Sequence[TensorInfo], ct: ChunkTable) -> str:
    """The ``tensors`` rows as JSON text, as ``json.dumps`` writes them (one format per row:
    everything after the key is the same text for tensors of one kind, dtype, shape,
    chunk count and split, and is made once)."""
    esc = json.encoder.encode_basestring  # what json.dumps uses with ensure_ascii=False
    counts = np.diff(ct.tensor_start).tolist()
    tails: dict[tuple[Any, ...], str] = {}
    rows = []
    for info, count, split in zip(tensors, counts, ct.splits):
        key = info.key
        if len(key) == 1 and type(key[0]) is str:
            kt = "[" + esc(key[0]) + "]"
        elif all(type(k) is str or type(k) is int for k in key):
            kt = "[" + ",".join(esc(k) if type(k) is str else str(k) for k in key) + "]"
        else:
            kt = dumps(tree.encode_key_path(key))
        tk = (info.kind, info.dtype, info.shape, count, split)
        tail = tails.get(tk)
        if tail is None:
            row: dict[str, Any] = {"kind": info.kind, "dtype": info.dtype, "shape": list(info.shape),
                                   "chunks": int(count)}
            if split is not None:
                row["split"] = [split.dim, split.step, split.file0, split.file_stride]
            tail = tails[tk] = "," + dumps(row)[1:]
        rows.append('{"key":' + kt + tail)
    return ",".join(rows)


# ----------------------------------------------------------------------------- v1 objects
# format.index's Index/TensorEntry/ChunkEntry/FileEntry, described structurally so that this
# module does not import format.index (which imports this one to read and write v2).


class _Chunk(Protocol):
    file: str
    offset: int
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    checksums: tuple[int, ...]
    stored: Any  # format.index_common.StoredBlocks | None


class _Tensor(Protocol):
    key: tree.KeyPath
    kind: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[_Chunk, ...]


class _File(Protocol):
    name: str
    size: int
    data_start: int
    rank: int


class _Index(Protocol):
    tree: tree.Node
    tensors: tuple[_Tensor, ...]
    files: tuple[_File, ...]
    block_size: int
    world_size: int
    created: float
    metadata: dict[str, Any]
    library: str


def from_index(index: _Index) -> ColumnarIndex:
    """The columnar form of a v1 ``Index`` (tensors split evenly get a ``Split`` rule)."""
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
    files = tuple(FileInfo(f.name, f.size, f.data_start, f.rank) for f in index.files)
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
    """The ``BlockCoding`` of ``from_index``'s blocks (None when no chunk is compressed)."""
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


ChunkRow = tuple[str, int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...], Any]


def chunk_rows(index: ColumnarIndex, t: int) -> list[ChunkRow]:
    """Tensor ``t``'s chunks as ``ChunkEntry`` fields: (file, offset, nbytes, offsets,
    shape, checksums, stored). Builds Python objects: for compatibility, not for planning at scale."""
    ct = index.chunks
    c = ct.tensor_chunks(t)
    names = [index.files[i].name for i in c.file.tolist()]
    return [(names[i], int(c.offset[i]), int(c.nbytes[i]), tuple(c.pos[i].tolist()),
             tuple(c.extent[i].tolist()), tuple(ct.chunk_checksums(c.start + i).tolist()),
             stored_blocks(ct, c.start + i))
            for i in range(len(names))]


def stored_blocks(ct: ChunkTable, row: int) -> StoredBlocks | None:
    """Chunk ``row``'s ``StoredBlocks`` (None unless some block of it is compressed)."""
    coding = ct.chunk_coding(row)
    if coding is None:
        return None
    codecs, sizes, sums = coding
    return StoredBlocks(codecs, tuple(sizes.tolist()), tuple(sums.tolist()))


# ----------------------------------------------------------------------------- decoding


def _tensor(t: Any) -> tuple[TensorInfo, int, int, Split | None]:
    """One tensor row: (info, itemsize, chunk count, split)."""
    key = tensor_key(t)
    name = tree.render_path(key)
    kind, dt, shape_t = tensor_header(t, name)
    count = check_int(t.get("chunks"), f"chunk count of {name}", 0, 1 << 40)
    split = None
    if "split" in t:
        s = t["split"]
        if not isinstance(s, list) or len(s) != 4:
            raise bad(f"tensor {name}: split must be [dim, step, file0, file_stride]")
        split = Split(*(check_int(v, f"split of {name}") for v in s))
    return TensorInfo(key, kind, dt.name, shape_t), dt.itemsize, count, split


_ROW = itemgetter("key", "kind", "dtype", "shape", "chunks")


def _tensor_columns(rows: list[Any]) -> tuple[tuple[TensorInfo, ...], list[int], list[int],
                                              list[Split | None]] | None:
    """``_tensor`` of every row at once, checked column by column (set and min/max tests
    over all rows instead of a Python function per row). None when any row is unusual in
    any way, even a valid one: the caller then checks row by row, which names the problem.
    """
    if not rows:
        return (), [], [], []
    if set(map(type, rows)) != {dict}:
        return None
    try:
        keys, kinds, dtypes, shapes, counts = zip(*map(_ROW, rows))
        dts = {d: lookup(d) for d in set(dtypes)}
    except (KeyError, TypeError, ValueError):  # a member missing, an unhashable or unknown dtype
        return None
    if set(map(type, keys)) != {list} or not set(kinds) <= set(TENSOR_KINDS):
        return None
    if not set(map(type, chain.from_iterable(keys))) <= {str, int}:  # bool is not int here
        return None
    if any(k == "numpy" and dts[d].numpy is None for k, d in set(zip(kinds, dtypes))):
        return None
    if set(map(type, shapes)) != {list} or max(map(len, shapes)) > MAX_NDIM:
        return None
    dims = list(chain.from_iterable(shapes))
    if not set(map(type, dims)) <= {int} or (dims and (min(dims) < 1 or max(dims) > MAX_DIM)):
        return None  # (zero-size tensors: the extent bound needs max(dim, 1), row by row)
    if set(map(type, counts)) != {int} or min(counts) < 0 or max(counts) > 1 << 40:
        return None
    shape_t = list(map(tuple, shapes))
    itemsizes = [dts[d].itemsize for d in dtypes]
    if max(map(mul, map(math.prod, shape_t), itemsizes)) > MAX_EXTENT_BYTES:
        return None
    splits = _split_rules(list(map(dict.get, rows, repeat("split"))))
    if splits is None:
        return None
    infos = tuple(map(TensorInfo, map(tuple, keys), kinds, dtypes, shape_t))
    return infos, itemsizes, list(counts), splits


def _split_rules(raw: list[Any]) -> list[Split | None] | None:
    """The ``split`` members as ``Split`` objects (one shared object per distinct rule), or
    None when one is not a list of 4 integers."""
    rules: dict[tuple[int, ...], Split] = {}
    out: list[Split | None] = []
    for s in raw:
        if s is None:
            out.append(None)
            continue
        if type(s) is not list or len(s) != 4:
            return None
        key = tuple(s)
        sp = rules.get(key)
        if sp is None:
            if not all(type(v) is int and 0 <= v <= MAX_DIM for v in key):
                return None
            sp = rules[key] = Split(*key)
        out.append(sp)
    return out


def block_coding(raw: dict[str, Any], cols: dict[str, np.ndarray]) -> BlockCoding | None:
    """The compressed chunks' coding columns (section 12.3), or None in an index without them."""
    if "codec" not in cols:
        if "codecs" in raw:
            raise bad("codecs listed without the coding columns")
        return None
    codecs = raw.get("codecs")
    if not isinstance(codecs, list) or not all(isinstance(c, str) for c in codecs) or len(codecs) > 255:
        raise bad("codecs must be a list of at most 255 codec names")
    return BlockCoding(tuple(codecs), cols["codec"], cols["stored"], cols["stored_crc32c"])


def decode(data: bytes) -> ColumnarIndex:
    """Parses and validates v2 index bytes; raises CorruptCheckpointError naming the problem."""
    raw, section = open_container(data, VERSION)
    block_size = check_int(raw.get("block_size"), "block_size", 4096, 1 << 40)
    files = decode_files(raw.get("files"))
    if not isinstance(raw.get("tensors"), list):
        raise bad("tensors must be a list")
    fast = _tensor_columns(raw["tensors"])
    if fast is not None:
        infos, itemsizes, counts, splits = fast
    else:  # something is unusual: the row-by-row check names it
        rows = [_tensor(t) for t in raw["tensors"]]
        infos = tuple(r[0] for r in rows)
        itemsizes, counts, splits = [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]

    def name(t: int) -> str:
        return tree.render_path(infos[t].key)

    check_tensor_rows([i.shape for i in infos], splits, counts, len(files), name)
    general = [(c, len(i.shape)) for i, c, s in zip(infos, counts, splits) if s is None]
    cols = read_columns(raw.get("columns"), section, COLUMNS, CODED_COLUMNS, {
        "offset": sum(counts), "file": sum(c for c, _ in general),
        "pos": sum(c * d for c, d in general), "extent": sum(c * d for c, d in general),
        "crc32c": None, "codec": None, "stored": None, "stored_crc32c": None})
    coding = block_coding(raw, cols)
    table = ChunkTable.build(
        [i.shape for i in infos], itemsizes, splits, counts, cols["offset"], cols["file"],
        cols["pos"], cols["extent"], cols["crc32c"], block_size,
        np.array([f.size for f in files], dtype=np.int64),
        np.array([f.data_start for f in files], dtype=np.int64), name, coding)
    check_tree(raw.get("tree"), [i.key for i in infos])
    return ColumnarIndex(tree=raw["tree"], tensors=infos, files=files, chunks=table,
                         **header_fields(raw))
