"""Index format version 2: a binary container of a JSON part and little-endian columns.

Layout (docs/FORMAT.md section 11 is the byte-by-byte spec)::

    0   8  magic  b"SSAFEIDX"
    8   4  u32    format_version (2)
    12  4  u32    header size (32)
    16  8  u64    J: length of the JSON part
    24  8  u64    C: length of the column section
    32  J         JSON part (UTF-8), zero-padded to a multiple of 8
    A   C         columns, in the order of COLUMNS, each zero-padded to a multiple of 8
    A+C 4  u32    CRC32C of every byte before it

The JSON part holds what v1 holds except the chunks: metadata, files, tensors (each with
its chunk count and, for an even split, the split rule), the tree, and each column's
element type and length. Decoding checks everything ``chunk_table`` and the rules of
FORMAT.md section 9 ask, with numpy, in time and memory linear in the index size.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..errors import CorruptCheckpointError
from . import INDEX_NAME, tree
from .checksum import ALGORITHM, crc32c
from .chunk_table import ChunkTable, Split, check_tensor_rows, detect_split
from .dtypes import lookup

MAGIC = b"SSAFEIDX"
VERSION = 2
HEADER = struct.Struct("<8sIIQQ")
MAX_INDEX_BYTES = 1 << 30  # as version 1 (engine.commit reads at most this much)
MAX_NDIM = 64
MAX_DIM = 1 << 62
MAX_EXTENT_BYTES = 1 << 62
TENSOR_KINDS = ("torch", "numpy")
COLUMNS = ("offset", "file", "pos", "extent", "crc32c")
WIDTHS = ("<u1", "<u2", "<u4", "<u8")
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """A tensor of a v2 index (its chunks are rows of the ``ChunkTable``)."""

    key: tree.KeyPath
    kind: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FileInfo:
    """A data file of a v2 index (same members as v1's ``files[]``)."""

    name: str
    size: int
    data_start: int
    rank: int = 0


@dataclass(frozen=True, slots=True, eq=False)
class ColumnarIndex:
    """A decoded, validated v2 index; ``chunks`` holds every chunk as columns."""

    tree: tree.Node
    tensors: tuple[TensorInfo, ...]
    files: tuple[FileInfo, ...]
    chunks: ChunkTable
    world_size: int = 1
    created: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    library: str = ""

    @property
    def block_size(self) -> int:
        return self.chunks.block_size

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ColumnarIndex):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in
                   ("tree", "tensors", "files", "chunks", "world_size", "created", "metadata", "library"))


def is_v2(data: bytes | memoryview) -> bool:
    """Whether ``data`` starts like a v2 index (v1 starts with ``{``)."""
    return bytes(data[: len(MAGIC)]) == MAGIC


# ----------------------------------------------------------------------------- encoding


def _narrowest(values: np.ndarray) -> str:
    top = int(values.max()) if len(values) else 0
    return next(w for w in WIDTHS if top < 1 << (8 * np.dtype(w).itemsize))


def _pad8(n: int) -> int:
    return -n % 8


def stored_columns(ct: ChunkTable) -> dict[str, np.ndarray]:
    """The arrays a v2 index stores (split tensors keep neither file ids nor positions)."""
    general = np.zeros(ct.num_chunks, dtype=bool)
    for t, s in enumerate(ct.splits):
        if s is None:
            general[ct.tensor_start[t] : ct.tensor_start[t + 1]] = True
    return {"offset": ct.offset, "file": ct.file[general], "pos": ct.pos, "extent": ct.extent,
            "crc32c": ct.checksums}


def encode(index: ColumnarIndex) -> bytes:
    """The bytes of a v2 index."""
    ct = index.chunks
    cols = stored_columns(ct)
    kinds = {n: ("<u4" if n == "crc32c" else _narrowest(a)) for n, a in cols.items()}
    tensors = []
    for t, info in enumerate(index.tensors):
        row: dict[str, Any] = {"key": list(info.key), "kind": info.kind, "dtype": info.dtype,
                               "shape": list(info.shape),
                               "chunks": int(ct.tensor_start[t + 1] - ct.tensor_start[t])}
        s = ct.splits[t]
        if s is not None:
            row["split"] = [s.dim, s.step, s.file0, s.file_stride]
        tensors.append(row)
    body = {"library": index.library, "created": index.created, "world_size": index.world_size,
            "checksum": ALGORITHM, "block_size": ct.block_size, "metadata": index.metadata,
            "files": [{"name": f.name, "size": f.size, "data_start": f.data_start, "rank": f.rank}
                      for f in index.files],
            "tensors": tensors, "columns": {n: [kinds[n], len(cols[n])] for n in COLUMNS},
            "tree": index.tree}
    js = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    parts = [b"", js, b"\0" * _pad8(len(js))]
    clen = 0
    for n in COLUMNS:
        raw = np.ascontiguousarray(cols[n], dtype=kinds[n]).tobytes()
        parts += [raw, b"\0" * _pad8(len(raw))]
        clen += len(raw) + _pad8(len(raw))
    parts[0] = HEADER.pack(MAGIC, VERSION, HEADER.size, len(js), clen)
    out = b"".join(parts)
    return out + struct.pack("<I", crc32c(out))


# ----------------------------------------------------------------------------- v1 objects
# format.index's Index/TensorEntry/ChunkEntry/FileEntry, described structurally so that this
# module does not import format.index (which imports this one to read and write v2).


class _Chunk(Protocol):
    file: str
    offset: int
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    checksums: tuple[int, ...]


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

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    infos = tuple(TensorInfo(t.key, t.kind, t.dtype, tuple(t.shape)) for t in index.tensors)
    files = tuple(FileInfo(f.name, f.size, f.data_start, f.rank) for f in index.files)
    table = ChunkTable.build(
        [i.shape for i in infos], [lookup(i.dtype).itemsize for i in infos], splits,
        [len(t.chunks) for t in index.tensors], cat(offsets), cat(gfile), cat(pos), cat(ext),
        np.array(sums, dtype=np.uint32), index.block_size,
        np.array([f.size for f in files], dtype=np.int64),
        np.array([f.data_start for f in files], dtype=np.int64))
    return ColumnarIndex(tree=index.tree, tensors=infos, files=files, chunks=table,
                         world_size=index.world_size, created=index.created,
                         metadata=index.metadata, library=index.library)


ChunkRow = tuple[str, int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def chunk_rows(index: ColumnarIndex, t: int) -> list[ChunkRow]:
    """Tensor ``t``'s chunks as v1 ``ChunkEntry`` fields: (file, offset, nbytes, offsets,
    shape, checksums). Builds Python objects: for compatibility, not for planning at scale."""
    ct = index.chunks
    c = ct.tensor_chunks(t)
    names = [index.files[i].name for i in c.file.tolist()]
    return [(names[i], int(c.offset[i]), int(c.nbytes[i]), tuple(c.pos[i].tolist()),
             tuple(c.extent[i].tolist()), tuple(ct.chunk_checksums(c.start + i).tolist()))
            for i in range(len(names))]


# ----------------------------------------------------------------------------- decoding


def _bad(msg: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"malformed index: {msg}", file=INDEX_NAME)


def _int(v: Any, what: str, lo: int = 0, hi: int = MAX_DIM) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise _bad(f"{what} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # parsers disagree on which duplicate wins: refuse it
        raise ValueError("duplicate member name in a JSON object")
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (the encoder never writes it)")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {text} is out of range")
    return v


def _split_container(data: bytes) -> tuple[dict[str, Any], memoryview]:
    """Checks header, sizes and CRC; returns the parsed JSON part and the column section."""
    if len(data) > MAX_INDEX_BYTES:
        raise _bad(f"index is {len(data)} bytes, more than the {MAX_INDEX_BYTES} allowed")
    if len(data) < HEADER.size + 4:
        raise _bad("shorter than a v2 header (truncated?)")
    magic, version, hsize, jlen, clen = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION or hsize != HEADER.size:
        raise CorruptCheckpointError(f"unsupported index header (format_version {version})",
                                     file=INDEX_NAME)
    a = HEADER.size + jlen + _pad8(jlen)
    if clen % 8 or a + clen + 4 != len(data):
        raise _bad(f"sections of {jlen} + {clen} bytes do not add up to {len(data)} (truncated?)")
    (want,) = struct.unpack_from("<I", data, len(data) - 4)
    view = memoryview(data)
    if crc32c(view[:-4]) != want:
        raise CorruptCheckpointError("index checksum mismatch", file=INDEX_NAME)
    if any(data[HEADER.size + jlen : a]):
        raise _bad("JSON padding must be zero bytes")
    try:
        raw = json.loads(bytes(view[HEADER.size : HEADER.size + jlen]).decode("utf-8"),
                         parse_constant=_reject_constant, parse_float=_finite_float,
                         object_pairs_hook=_unique_members)
    except (ValueError, RecursionError) as e:
        raise _bad(f"not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise _bad("JSON part must be an object")
    if raw.get("checksum") != ALGORITHM:
        raise _bad(f"unknown checksum algorithm {raw.get('checksum')!r}")
    return raw, view[a : a + clen]


def _files(raw: Any) -> tuple[FileInfo, ...]:
    if not isinstance(raw, list):
        raise _bad("files must be a list")
    out, names = [], set()
    for f in raw:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not _FILE_NAME.fullmatch(f["name"]):
            raise _bad(f"bad data file entry {f!r}: names are plain file names, no paths")
        if f["name"] in names or f["name"] == INDEX_NAME:
            raise _bad(f"duplicate or reserved data file name {f['name']!r}")
        names.add(f["name"])
        size = _int(f.get("size"), "file size")
        out.append(FileInfo(f["name"], size, _int(f.get("data_start"), "file data_start", 8, size),
                            _int(f.get("rank", 0), "file rank", 0, 1 << 31)))
    return tuple(out)


def _tensor(t: Any) -> tuple[TensorInfo, int, int, Split | None]:
    """One tensor row: (info, itemsize, chunk count, split)."""
    if not isinstance(t, dict) or not isinstance(t.get("key"), list):
        raise _bad("tensor entry needs a key list")
    key = tuple(t["key"])
    if not all(isinstance(k, str) or (isinstance(k, int) and not isinstance(k, bool)) for k in key):
        raise _bad(f"tensor key {t['key']!r} must hold strings and integers")
    name = tree.render_path(key)
    if t.get("kind") not in TENSOR_KINDS:
        raise _bad(f"tensor {name}: unknown kind {t.get('kind')!r}")
    try:
        dt = lookup(t.get("dtype"))  # type: ignore[arg-type]
    except (ValueError, TypeError):
        raise _bad(f"tensor {name}: unknown dtype {t.get('dtype')!r}") from None
    if t["kind"] == "numpy" and dt.numpy is None:
        raise _bad(f"tensor {name}: numpy cannot hold dtype {dt.name}")
    shape = t.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise _bad(f"tensor {name}: shape must be a list of at most {MAX_NDIM} integers")
    shape_t = tuple(_int(s, f"shape of {name}") for s in shape)
    if math.prod(max(s, 1) for s in shape_t) * dt.itemsize > MAX_EXTENT_BYTES:
        raise _bad(f"tensor {name}: absurd shape {list(shape_t)}")
    count = _int(t.get("chunks"), f"chunk count of {name}", 0, 1 << 40)
    split = None
    if "split" in t:
        s = t["split"]
        if not isinstance(s, list) or len(s) != 4:
            raise _bad(f"tensor {name}: split must be [dim, step, file0, file_stride]")
        split = Split(*(_int(v, f"split of {name}") for v in s))
    return TensorInfo(key, t["kind"], dt.name, shape_t), dt.itemsize, count, split


def _columns(raw: Any, section: memoryview, expected: dict[str, int | None]) -> dict[str, np.ndarray]:
    """Views of the stored columns; their lengths must be the ones the tensor rows imply."""
    if not isinstance(raw, dict) or sorted(raw) != sorted(COLUMNS):
        raise _bad(f"columns must describe exactly {list(COLUMNS)}")
    out, at = {}, 0
    for n in COLUMNS:
        desc = raw[n]
        if (not isinstance(desc, list) or len(desc) != 2 or desc[0] not in WIDTHS
                or (n == "crc32c" and desc[0] != "<u4")):
            raise _bad(f"column {n}: bad descriptor {desc!r}")
        count = _int(desc[1], f"length of column {n}", 0, len(section))
        if expected.get(n) is not None and count != expected[n]:
            raise _bad(f"column {n} holds {count} values, the tensor rows need {expected[n]}")
        size = count * np.dtype(desc[0]).itemsize
        if at + size + _pad8(size) > len(section):
            raise _bad(f"column {n} runs past the end of the column section")
        arr = np.frombuffer(section, dtype=desc[0], count=count, offset=at)
        if any(section[at + size : at + size + _pad8(size)]):
            raise _bad(f"column {n}: padding must be zero bytes")
        if desc[0] == "<u8" and count and int(arr.max()) > MAX_DIM:
            raise _bad(f"column {n} holds a value above 2^62")
        out[n] = arr.astype(np.int64) if n != "crc32c" else arr
        at += size + _pad8(size)
    if at != len(section):
        raise _bad("bytes after the last column")
    return out


def _check_tree(node: Any, tensors: Sequence[TensorInfo]) -> None:
    if not isinstance(node, dict) or node.get("t") != "dict":
        raise _bad("tree root must be a dict node (a state is a mapping)")
    try:
        leaves = list(tree.walk(node))
    except (tree.TreeError, RecursionError) as e:
        raise _bad(f"tree: {e}") from None
    ids = [n["id"] for _, n in leaves if n["t"] == "tensor"]
    if sorted(ids) != list(range(len(tensors))):
        raise _bad("tree must reference every tensor entry exactly once")
    for path, n in leaves:
        if n["t"] == "tensor" and tensors[n["id"]].key != path:
            raise _bad(f"tensor {n['id']} is keyed {tensors[n['id']].key!r} but sits at {path!r}")


def decode(data: bytes) -> ColumnarIndex:
    """Parses and validates v2 index bytes; raises CorruptCheckpointError naming the problem."""
    raw, section = _split_container(data)
    block_size = _int(raw.get("block_size"), "block_size", 4096, 1 << 40)
    files = _files(raw.get("files"))
    if not isinstance(raw.get("tensors"), list):
        raise _bad("tensors must be a list")
    rows = [_tensor(t) for t in raw["tensors"]]
    infos = tuple(r[0] for r in rows)
    counts = [r[2] for r in rows]
    splits = [r[3] for r in rows]

    def name(t: int) -> str:
        return tree.render_path(infos[t].key)

    check_tensor_rows([i.shape for i in infos], splits, counts, len(files), name)
    general = [(c, len(i.shape)) for i, c, s in zip(infos, counts, splits) if s is None]
    cols = _columns(raw.get("columns"), section, {
        "offset": sum(counts), "file": sum(c for c, _ in general),
        "pos": sum(c * d for c, d in general), "extent": sum(c * d for c, d in general),
        "crc32c": None})
    table = ChunkTable.build(
        [i.shape for i in infos], [r[1] for r in rows], splits, counts, cols["offset"], cols["file"],
        cols["pos"], cols["extent"], cols["crc32c"], block_size,
        np.array([f.size for f in files], dtype=np.int64),
        np.array([f.data_start for f in files], dtype=np.int64), name)
    _check_tree(raw.get("tree"), infos)
    metadata = raw.get("metadata", {})
    if not isinstance(metadata, dict):
        raise _bad("metadata must be an object")
    created = raw.get("created", 0.0)
    if not isinstance(created, (int, float)) or isinstance(created, bool) or not -1e300 < created < 1e300:
        raise _bad("created must be a finite number")
    return ColumnarIndex(tree=raw["tree"], tensors=infos, files=files, chunks=table,
                         world_size=_int(raw.get("world_size", 1), "world_size", 1, 1 << 31),
                         created=float(created), metadata=metadata,
                         library=str(raw.get("library", "")))
