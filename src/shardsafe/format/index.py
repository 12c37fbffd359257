"""The checkpoint index (``index.json``): data classes, encoding and strict validation.

The index is the commit record of a checkpoint. It is JSON whose last member is
``"index_checksum": "crc32c:xxxxxxxx"``, the CRC32C of every byte before that member
(see docs/FORMAT.md). Decoding treats the bytes as untrusted: every name, offset, size,
shape and checksum is checked before any data file is opened or any buffer allocated.
"""

from __future__ import annotations

import json
import heapq
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._numbers import ceil_div
from ..errors import CorruptCheckpointError
from . import INDEX_NAME, index_v2, tree
from .checksum import ALGORITHM, crc32c
from .index_common import (IndexHeader, MAX_DIM, MAX_INDEX_BYTES, MAX_NDIM, FileEntry, bad, check_int,
                           check_tree, decode_files, finite_float, header_fields, reject_constant,
                           tensor_header, unique_members)
from .chunk_table import ChunkTable
from .index_common import ChunkEntry
from .lazy_chunks import LazyChunks, LazyTensors

V1 = 1  # the version of the JSON format this module encodes and decodes
# Limits that keep decoding linear in the index size (docs/FORMAT.md section 9). JSON
# objects and arrays: at most one per 6 bytes of index (nothing the encoder writes is
# denser; ``[[],[],...]`` would cost ~20 bytes of memory per byte) and 2**24 in all.
MAX_CONTAINERS = 1 << 24
CONTAINER_BYTES = 6
MAX_CHUNKS = 1 << 24  # chunk entries in all tensors
SWEEP_BUDGET = 16  # overlap comparisons per chunk for chunk layouts that are not a grid
_CRC_HEX = re.compile(r"[0-9a-f]{8}")
_TRAILER = re.compile(rb',\s*"index_checksum"\s*:\s*"crc32c:([0-9a-f]{8})"\s*}\s*$')


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
    chunks: tuple[ChunkEntry, ...]

    @property
    def nbytes(self) -> int:
        if isinstance(self.chunks, LazyChunks):
            return self.chunks.nbytes
        return sum(c.nbytes for c in self.chunks)

    def overlapping(self, offsets: Sequence[int], shape: Sequence[int]) -> Sequence[ChunkEntry]:
        """The chunks that may overlap the region ``offsets``/``shape`` (all of them for v1;
        for v2, selected with numpy so that only those become Python objects)."""
        if isinstance(self.chunks, LazyChunks):
            return self.chunks.overlapping(offsets, shape)
        return self.chunks


@dataclass(frozen=True, slots=True)
class Index(IndexHeader):
    """A decoded, validated checkpoint index.

    Decoded from v2, ``table`` holds every chunk as columns and each tensor's ``chunks``
    is a ``LazyChunks`` that builds ``ChunkEntry`` objects only when asked
    (``TensorEntry.overlapping`` builds just the ones a region needs).
    """

    tree: tree.Node
    tensors: tuple[TensorEntry, ...]
    files: tuple[FileEntry, ...]
    block_size: int
    format_version: int = V1
    table: ChunkTable | None = field(default=None, compare=False, repr=False)
    infos: tuple[index_v2.TensorInfo, ...] | None = field(default=None, compare=False, repr=False)
    """Decoded from v2: key path, kind, dtype and shape of each tensor, without an entry object."""


def num_blocks(nbytes: int, block_size: int) -> int:
    """Number of checksum blocks of a chunk (at least one, also for zero bytes)."""
    return max(1, ceil_div(nbytes, block_size))


def _chunk_json(c: ChunkEntry) -> dict[str, Any]:
    return {"file": c.file, "offset": c.offset, "nbytes": c.nbytes, "offsets": list(c.offsets),
            "shape": list(c.shape), "crc32c": [f"{x:08x}" for x in c.checksums]}


def encode_index(index: Index, version: int | None = None) -> bytes:
    """Serialises ``index`` to the bytes of ``index.json`` (with its trailing checksum).

    ``version`` 2 writes the columnar format (format.index_v2); the default is the
    index's own ``format_version`` (1 for indexes the writers build).
    """
    if (version or index.format_version) == 2:
        return index_v2.encode(index_v2.from_index(index))
    if any(c.stored is not None for t in index.tensors for c in t.chunks):
        raise ValueError("compressed chunks need index format version 2 (version 1 has no "
                         "place for their codecs and stored sizes)")
    body = {
        "format_version": version or index.format_version,
        "library": index.library,
        "created": index.created,
        "world_size": index.world_size,
        "checksum": ALGORITHM,
        "block_size": index.block_size,
        "metadata": index.metadata,
        "files": [{"name": f.name, "size": f.size, "data_start": f.data_start, "rank": f.rank}
                  for f in index.files],
        "tensors": [{"key": tree.encode_key_path(t.key), "kind": t.kind, "dtype": t.dtype, "shape": list(t.shape),
                     "chunks": [_chunk_json(c) for c in t.chunks]} for t in index.tensors],
        "tree": index.tree,
    }
    text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    prefix = text[:-1].encode("utf-8")  # drop the closing brace; the checksum member follows
    return prefix + b',"index_checksum":"crc32c:%08x"}\n' % crc32c(prefix)


# ----------------------------------------------------------------------------- decoding


def _ints(v: Any, what: str, n: int | None = None) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) > MAX_NDIM or (n is not None and len(v) != n):
        raise bad(f"{what} must be a list of at most {MAX_NDIM} integers")
    return tuple(check_int(x, what) for x in v)


def _decode_chunk(c: Any, ndim: int, itemsize: int, block_size: int, key: str) -> ChunkEntry:
    if not isinstance(c, dict):
        raise bad(f"chunk of {key} is not an object")
    shape = _ints(c.get("shape"), f"chunk shape of {key}", ndim)
    offsets = _ints(c.get("offsets"), f"chunk offsets of {key}", ndim)
    nbytes = check_int(c.get("nbytes"), f"chunk nbytes of {key}")
    if nbytes != math.prod(shape) * itemsize:
        raise bad(f"chunk of {key}: nbytes {nbytes} != prod(shape) * itemsize")
    sums = c.get("crc32c")
    if not isinstance(sums, list) or len(sums) != num_blocks(nbytes, block_size):
        raise bad(f"chunk of {key}: expected {num_blocks(nbytes, block_size)} checksums")
    # int(s, 16) alone would also take "0x1234", " -12345" or "1_234567"
    if not all(isinstance(s, str) and _CRC_HEX.fullmatch(s) for s in sums):
        raise bad(f"chunk of {key}: checksums must be 8 lowercase hex digits")
    checksums = tuple(int(s, 16) for s in sums)
    if not isinstance(c.get("file"), str):
        raise bad(f"chunk of {key}: file must be a string")
    return ChunkEntry(c["file"], check_int(c.get("offset"), f"chunk offset of {key}"), nbytes,
                      offsets, shape, checksums)


def _decode_tensor(t: Any, block_size: int) -> TensorEntry:
    if not isinstance(t, dict) or not isinstance(t.get("key"), list):
        raise bad("tensor entry needs a key list")
    try:
        key = tree.decode_key_path(t["key"])
    except (tree.TreeError, RecursionError) as e:
        raise bad(f"tensor key {t['key']!r}: {e}") from None
    name = tree.render_path(key)
    kind, dt, shape = tensor_header(t, name)
    chunks = t.get("chunks")
    if not isinstance(chunks, list):
        raise bad(f"tensor {name}: chunks must be a list")
    decoded = tuple(_decode_chunk(c, len(shape), dt.itemsize, block_size, name) for c in chunks)
    total = 0
    for c in decoded:
        if any(o + s > g for o, s, g in zip(c.offsets, c.shape, shape)):
            raise bad(f"tensor {name}: chunk at {list(c.offsets)} lies outside shape {list(shape)}")
        total += math.prod(c.shape)
    if total != math.prod(shape):
        raise bad(f"tensor {name}: chunks hold {total} elements, shape needs {math.prod(shape)}")
    _check_disjoint(name, decoded, shape)
    return TensorEntry(key, kind, dt.name, shape, decoded)


def _boxes_overlap(a: ChunkEntry, b: ChunkEntry) -> bool:
    return all(ao < bo + bs and bo < ao + as_
               for ao, as_, bo, bs in zip(a.offsets, a.shape, b.offsets, b.shape))


def _is_grid(boxes: Sequence[ChunkEntry], shape: tuple[int, ...]) -> bool:
    """True when the boxes are exactly the cells of a grid: per dimension, their distinct
    intervals partition ``[0, shape[d])``, and every cell appears once. Sharded saves
    (DTensor placements on any mesh, row splits) always produce such grids. O(n log n)."""
    total = 1
    for d, g in enumerate(shape):
        intervals = sorted({(c.offsets[d], c.shape[d]) for c in boxes})
        pos = 0
        for o, n in intervals:
            if o != pos:
                return False
            pos = o + n
        if pos != g:
            return False
        total *= len(intervals)
    return total == len(boxes) and len({c.offsets for c in boxes}) == len(boxes)


def _check_disjoint(name: str, chunks: Sequence[ChunkEntry], shape: tuple[int, ...]) -> None:
    """Rejects chunks whose element regions overlap.

    All chunks lie inside the shape and their element counts add up to it, so they are
    disjoint exactly when they cover the tensor; without this a forged index could leave
    part of a freshly allocated tensor unwritten. A grid (what writers produce) is checked
    in O(n log n). Anything else is swept along the dimension with the most distinct
    chunk starts, comparing each chunk with the chunks still open there; that sweep may
    spend ``SWEEP_BUDGET`` comparisons per chunk, and a layout that needs more is refused
    (such layouts are forged: no writer produces them), which keeps the work linear.
    """
    boxes = [c for c in chunks if math.prod(c.shape) > 0]
    if len(boxes) < 2 or _is_grid(boxes, shape):
        return
    ndim = len(boxes[0].shape)
    d = max(range(ndim), key=lambda i: len({c.offsets[i] for c in boxes}))
    budget = SWEEP_BUDGET * len(boxes) + 4096  # small tensors: always checked exactly
    open_: list[tuple[int, int, ChunkEntry]] = []  # heap of (end along d, tie, chunk)
    for n, c in enumerate(sorted(boxes, key=lambda c: c.offsets[d])):
        while open_ and open_[0][0] <= c.offsets[d]:
            heapq.heappop(open_)
        budget -= len(open_)
        if budget < 0:
            raise bad(f"tensor {name}: {len(boxes)} chunks that are not a grid are too irregular to "
                       f"check for overlaps (over {SWEEP_BUDGET} comparisons per chunk)")
        for _, _, a in open_:
            if _boxes_overlap(a, c):
                raise bad(f"tensor {name}: chunks at {list(a.offsets)} and {list(c.offsets)} overlap")
        heapq.heappush(open_, (c.offsets[d] + c.shape[d], n, c))


def _check_byte_ranges(files: Sequence[FileEntry], tensors: Sequence[TensorEntry]) -> None:
    by_file: dict[str, list[tuple[int, int, str]]] = {f.name: [] for f in files}
    for t in tensors:
        for c in t.chunks:
            ranges = by_file.get(c.file)
            if ranges is None:
                raise bad(f"tensor {tree.render_path(t.key)} names unknown file {c.file!r}")
            if c.nbytes:  # an empty chunk reads nothing: its offset constrains nothing (FORMAT.md 9.6)
                ranges.append((c.offset, c.offset + c.nbytes, tree.render_path(t.key)))
    for f in files:
        prev_end, prev_key = f.data_start, "<header>"
        for start, end, key in sorted(by_file[f.name]):
            if start < prev_end:
                raise bad(f"byte range of {key} in {f.name} overlaps {prev_key}")
            if end > f.size:
                raise bad(f"byte range of {key} ends at {end}, past the end of {f.name} ({f.size})")
            prev_end, prev_key = end, key


class _TooLarge(ValueError):
    """Raised from inside the JSON parser to stop it once a limit is passed."""


def _members_hook(budget: int):  # noqa: ANN202 - json's object_pairs_hook
    """An ``object_pairs_hook`` that refuses duplicate names and stops the parse (bounded
    memory) once more than ``budget`` objects were built."""
    left = [budget]

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        left[0] -= 1
        if left[0] < 0:
            raise _TooLarge("objects")
        return unique_members(pairs)

    return hook


def _parse(data: bytes) -> dict[str, Any]:
    """Checks size, trailer checksum, JSON syntax and format version; returns the object."""
    if len(data) > MAX_INDEX_BYTES:
        raise bad(f"index is {len(data)} bytes, more than the {MAX_INDEX_BYTES} allowed")
    m = _TRAILER.search(data)
    if m is None:
        raise bad("missing index_checksum trailer (truncated?)")
    if crc32c(data[: m.start()]) != int(m.group(1), 16):
        raise CorruptCheckpointError("index checksum mismatch", file=INDEX_NAME)
    at = tree.find_lone_surrogate(data)
    if at >= 0:  # the writer cannot write such a string: nothing that loads fails to save
        raise bad(f"a string holds a lone UTF-16 surrogate (escape at byte {at})")
    # Memory: Python objects cost 10-20x their JSON text. Arrays are counted before the
    # parse (an upper bound: '[' in strings counts too), objects while parsing.
    limit = min(MAX_CONTAINERS, len(data) // CONTAINER_BYTES + 1024)
    arrays = data.count(b"[")
    too_many = bad(f"more JSON objects and arrays than the limit ({limit}: one per {CONTAINER_BYTES} "
                    f"bytes, at most {MAX_CONTAINERS})")
    if arrays > limit:
        raise too_many
    try:
        raw = json.loads(data.decode("utf-8"), parse_constant=reject_constant, parse_float=finite_float,
                         object_pairs_hook=_members_hook(limit - arrays))
    except _TooLarge:
        raise too_many from None
    except (ValueError, RecursionError) as e:
        raise bad(f"not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise bad("top level must be an object")
    version = raw.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version != V1:
        raise CorruptCheckpointError(
            f"unsupported format_version {version!r} (this shardsafe reads {V1} and 2)",
            file=INDEX_NAME)
    if raw.get("checksum") != ALGORITHM:
        raise bad(f"unknown checksum algorithm {raw.get('checksum')!r}")
    return raw


def decode_index(data: bytes) -> Index:
    """Parses and validates index bytes (v1 or v2); raises CorruptCheckpointError naming the problem."""
    if index_v2.is_v2(data):
        return _from_v2(index_v2.decode(data))
    raw = _parse(data)
    block_size = check_int(raw.get("block_size"), "block_size", 4096, 1 << 40)
    files = decode_files(raw.get("files"))
    raw_tensors = raw.get("tensors")
    if not isinstance(raw_tensors, list):
        raise bad("tensors must be a list")
    chunks = sum(len(t["chunks"]) for t in raw_tensors if isinstance(t, dict) and isinstance(t.get("chunks"), list))
    if chunks > MAX_CHUNKS:
        raise bad(f"{chunks} chunks, more than the {MAX_CHUNKS} allowed")
    tensors = tuple(_decode_tensor(t, block_size) for t in raw_tensors)
    _check_byte_ranges(files, tensors)
    check_tree(raw.get("tree"), [t.key for t in tensors])
    return Index(tree=raw["tree"], tensors=tensors, files=files, block_size=block_size,
                 format_version=raw["format_version"], **header_fields(raw))


def _from_v2(ci: index_v2.ColumnarIndex) -> Index:
    """The ``Index`` of a decoded v2 index: tensor entries and their chunks are built from
    the columns when asked for (``LazyTensors``)."""
    return Index(tree=ci.tree, tensors=LazyTensors(ci, TensorEntry),  # type: ignore[arg-type]
                 files=ci.files, block_size=ci.block_size,
                 world_size=ci.world_size, created=ci.created, metadata=ci.metadata,
                 library=ci.library, format_version=2, table=ci.chunks, infos=ci.tensors)
