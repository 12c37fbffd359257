"""Index format version 1: the whole index as JSON (docs/FORMAT.md sections 1 to 10).

The index is the commit record of a checkpoint. A version 1 index is JSON whose last
member is ``"index_checksum": "crc32c:xxxxxxxx"``, the CRC32C of every byte before that
member. Saves write a binary version (``versions.WRITE_VERSION``); version 1 stays
readable, and ``encode`` writes it for an ``Index`` built as objects (tests, tools).
Decoding treats the bytes as untrusted: every name, offset, size, shape and checksum is
checked before any data file is opened or any buffer allocated.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import CorruptCheckpointError
from .. import INDEX_NAME, tree
from ..checksum import ALGORITHM, crc32c
from .chunk_table import ChunkTable, num_blocks
from .model import ColumnarIndex, TensorInfo
from .objects import Index
from .rows import ChunkEntry
from .rules import (MAX_INDEX_BYTES, MAX_NDIM, bad, check_int, check_tree, decode_files, encode_files,
                    finite_float, header_fields, reject_constant, tensor_header, tensor_key, unique_members)

VERSION = 1
# Limits that keep decoding linear in the index size (docs/FORMAT.md section 9). JSON
# objects and arrays: at most one per 6 bytes of index (nothing the encoder writes is
# denser; ``[[],[],...]`` would cost ~20 bytes of memory per byte) and 2**24 in all.
MAX_CONTAINERS = 1 << 24
CONTAINER_BYTES = 6
MAX_CHUNKS = 1 << 24  # chunk entries in all tensors
_CRC_HEX = re.compile(r"[0-9a-f]{8}")
_TRAILER = re.compile(rb',\s*"index_checksum"\s*:\s*"crc32c:([0-9a-f]{8})"\s*}\s*$')


def _chunk_json(c: ChunkEntry) -> dict[str, Any]:
    return {"file": c.file, "offset": c.offset, "nbytes": c.nbytes, "offsets": list(c.offsets),
            "shape": list(c.shape), "crc32c": [f"{x:08x}" for x in c.checksums]}


def encode(index: Index) -> bytes:
    """The bytes of a version 1 index (JSON) of an ``Index`` built as objects."""
    if any(c.stored is not None for t in index.tensors for c in t.chunks):
        raise ValueError("compressed chunks need index format version 2 or later (version 1 has no "
                         "place for their codecs and stored sizes)")
    body = {
        "format_version": VERSION,
        "library": index.library,
        "created": index.created,
        "world_size": index.world_size,
        "checksum": ALGORITHM,
        "block_size": index.block_size,
        "metadata": index.metadata,
        "files": encode_files(index.files),
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


@dataclass
class _Columns:
    """The chunk columns of a version 1 index, gathered chunk by chunk (``ChunkTable.build``
    input), and each chunk's size and number of checksums (checked at the end, at once)."""

    file: list[int] = field(default_factory=list)
    offset: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    extent: list[int] = field(default_factory=list)
    checksums: list[int] = field(default_factory=list)
    nbytes: list[int] = field(default_factory=list)
    nsums: list[int] = field(default_factory=list)


def _decode_chunk(c: Any, ndim: int, itemsize: int, key: str, file_id: dict[str, int], cols: _Columns) -> None:
    """One chunk's own fields (types, nbytes, checksums); appends it to ``cols``."""
    if not isinstance(c, dict):
        raise bad(f"chunk of {key} is not an object")
    shape = _ints(c.get("shape"), f"chunk shape of {key}", ndim)
    offsets = _ints(c.get("offsets"), f"chunk offsets of {key}", ndim)
    nbytes = check_int(c.get("nbytes"), f"chunk nbytes of {key}")
    if nbytes != math.prod(shape) * itemsize:
        raise bad(f"chunk of {key}: nbytes {nbytes} != prod(shape) * itemsize")
    sums = c.get("crc32c")
    if not isinstance(sums, list):
        raise bad(f"chunk of {key}: checksums must be a list")
    # int(s, 16) alone would also take "0x1234", " -12345" or "1_234567"
    if not all(isinstance(s, str) and _CRC_HEX.fullmatch(s) for s in sums):
        raise bad(f"chunk of {key}: checksums must be 8 lowercase hex digits")
    if not isinstance(c.get("file"), str):
        raise bad(f"chunk of {key}: file must be a string")
    if c["file"] not in file_id:
        raise bad(f"tensor {key} names unknown file {c['file']!r}")
    cols.file.append(file_id[c["file"]])
    cols.offset.append(check_int(c.get("offset"), f"chunk offset of {key}"))
    cols.pos.extend(offsets)
    cols.extent.extend(shape)
    cols.checksums.extend(int(s, 16) for s in sums)
    cols.nbytes.append(nbytes)
    cols.nsums.append(len(sums))


def _decode_tensor(t: Any, file_id: dict[str, int], cols: _Columns) -> tuple[TensorInfo, int, int]:
    """One tensor row: (info, itemsize, chunk count); its chunks go to ``cols``."""
    key = tensor_key(t)
    name = tree.render_path(key)
    kind, dt, shape = tensor_header(t, name)
    chunks = t.get("chunks")
    if not isinstance(chunks, list):
        raise bad(f"tensor {name}: chunks must be a list")
    for c in chunks:
        _decode_chunk(c, len(shape), dt.itemsize, name, file_id, cols)
    return TensorInfo(key, kind, dt.name, shape), dt.itemsize, len(chunks)


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
    if not isinstance(version, int) or isinstance(version, bool) or version != VERSION:
        raise CorruptCheckpointError(
            f"unsupported format_version {version!r} (a JSON index is version {VERSION}; later ones are binary)",
            file=INDEX_NAME)
    if raw.get("checksum") != ALGORITHM:
        raise bad(f"unknown checksum algorithm {raw.get('checksum')!r}")
    return raw


def decode(data: bytes) -> ColumnarIndex:
    """Parses and validates version 1 index bytes (JSON); raises CorruptCheckpointError
    naming the problem. The chunks end in the same ``ChunkTable`` as every version's,
    validated by the same code (``ChunkTable.build``)."""
    raw = _parse(data)
    block_size = check_int(raw.get("block_size"), "block_size", 4096, 1 << 40)
    files = decode_files(raw.get("files"))
    raw_tensors = raw.get("tensors")
    if not isinstance(raw_tensors, list):
        raise bad("tensors must be a list")
    chunks = sum(len(t["chunks"]) for t in raw_tensors if isinstance(t, dict) and isinstance(t.get("chunks"), list))
    if chunks > MAX_CHUNKS:
        raise bad(f"{chunks} chunks, more than the {MAX_CHUNKS} allowed")
    cols = _Columns()
    file_id = {f.name: i for i, f in enumerate(files)}
    rows = [_decode_tensor(t, file_id, cols) for t in raw_tensors]
    infos = tuple(r[0] for r in rows)

    def name(t: int) -> str:
        return tree.render_path(infos[t].key)

    def i64(v: list[int]) -> np.ndarray:
        return np.array(v, dtype=np.int64)

    want = num_blocks(i64(cols.nbytes), block_size)
    wrong = np.flatnonzero(want != i64(cols.nsums))
    if len(wrong):
        c = int(wrong[0])
        t = int(np.searchsorted(np.cumsum([r[2] for r in rows]), c, side="right"))
        raise bad(f"chunk of {name(t)}: expected {int(want[c])} checksums")

    table = ChunkTable.build(
        [i.shape for i in infos], [r[1] for r in rows], [None] * len(infos), [r[2] for r in rows],
        i64(cols.offset), i64(cols.file), i64(cols.pos), i64(cols.extent),
        np.array(cols.checksums, dtype=np.uint32), block_size, i64([f.size for f in files]),
        i64([f.data_start for f in files]), name)
    check_tree(raw.get("tree"), [i.key for i in infos])
    return ColumnarIndex(tree=raw["tree"], tensors=infos, files=files, chunks=table, **header_fields(raw))
