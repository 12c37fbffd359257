"""Builds v4 index bytes from a global part and parts (JSON and columns), following
docs/FORMAT.md section 15 without the encoder, so tests can forge indexes the encoder
would never write. Every CRC32C is right, so whatever rejects a forged index is
validation, not a checksum."""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardsafe.format.checksum import crc32c

HEADER = struct.Struct("<8sIIQQQQIIII")
ENTRY = struct.Struct("<QII")


@dataclass
class Forged:
    """A v4 index taken apart: the global part and each part as (JSON, columns)."""

    js: dict[str, Any]
    cols: dict[str, np.ndarray]
    parts: list[tuple[dict[str, Any], dict[str, np.ndarray]]] = field(default_factory=list)
    codec: int = 0


def _section(data: bytes, head: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    n = struct.unpack_from(head, data)[0]
    size = struct.calcsize(head)
    js = json.loads(data[size : size + n])
    at = size + n + (-(size + n) % 8)
    cols = {}
    for name, (dtype, count) in js["columns"].items():
        arr = np.frombuffer(data, dtype=dtype, count=count, offset=at)
        cols[name] = arr.astype(np.uint32 if name.endswith("crc32c") else np.int64)
        nbytes = count * np.dtype(dtype).itemsize
        at += nbytes + (-nbytes % 8)
    return js, cols


def split_v4(data: bytes) -> Forged:
    """The parts of v4 index bytes."""
    magic, version, hsize, size, stored, raw, nparts, codec, _, _, _ = HEADER.unpack_from(data)
    assert magic == b"SSAFEIDX" and version == 4 and hsize == 64 and size == len(data)
    body = data[64 : 64 + stored]
    js, cols = _section(zlib.decompress(body) if codec else body, "<Q")
    directory = 64 + stored + (-stored % 8)
    parts = []
    for k in range(nparts):
        off, n, _ = ENTRY.unpack_from(data, directory + 16 * k)
        parts.append(_section(data[off : off + n], "<I"))
    return Forged(js, cols, parts, codec)


def pack(js: dict[str, Any], cols: dict[str, np.ndarray], head: str, fix_counts: bool = True) -> bytes:
    """A section: JSON (its ``columns`` rewritten as ``<u8``/``<u4`` with the true counts
    unless ``fix_counts`` is False), then the columns it describes."""
    js = dict(js)
    if fix_counts:
        js["columns"] = {n: ["<u4" if n.endswith("crc32c") else "<u8", len(c)] for n, c in cols.items()
                         if n in js["columns"]}
    text = json.dumps(js, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    size = struct.calcsize(head)
    out = struct.pack(head, len(text)) + text + b"\0" * (-(size + len(text)) % 8)
    for n, (dtype, _) in js["columns"].items():
        raw = np.asarray(cols[n]).astype(dtype).tobytes()
        out += raw + b"\0" * (-len(raw) % 8)
    return out


def seal_v4(f: Forged, fix_counts: bool = True) -> bytes:
    """v4 bytes of ``f``, with every offset, length and CRC32C right for what it holds."""
    raw = pack(f.js, f.cols, "<Q", fix_counts)
    stored = zlib.compress(raw) if f.codec else raw
    parts = [pack(js, cols, "<I", fix_counts) for js, cols in f.parts]
    at = 64 + len(stored) + (-len(stored) % 8) + 16 * len(parts)
    entries = b""
    for p in parts:
        entries += ENTRY.pack(at, len(p), crc32c(p))
        at += len(p)
    head = HEADER.pack(b"SSAFEIDX", 4, 64, at, len(stored), len(raw), len(parts), f.codec, crc32c(stored), 0, 0)[:60]
    head += struct.pack("<I", crc32c(head))
    return head + stored + b"\0" * (-len(stored) % 8) + entries + b"".join(parts)


def halve_twice(ckpt: str, key: str) -> None:
    """Rewrites checkpoint ``ckpt``'s index (version 4) so that the 1-D tensor ``key``
    (stored as one chunk of an even length ``n``) is a general tensor of two chunks with
    the *same* box, its first half: one chunk holds the first half's bytes, the other the
    second half's. Volumes add up to ``n``; the second half of the tensor is covered by no
    chunk. Checksums are right, so only a tiling check can refuse it."""
    import dataclasses
    import os

    from shardsafe.format.index.chunk_table import ChunkTable
    from shardsafe.format.index.versions import decode, encode_columnar

    path = os.path.join(ckpt, "index.json")
    with open(path, "rb") as f:
        index, _ = decode(f.read())
    ct = index.chunks
    t = next(i for i, info in enumerate(index.tensors) if info.key == (key,))
    assert int(ct.tensor_start[t + 1] - ct.tensor_start[t]) == 1 and len(ct.shapes[t]) == 1
    row = int(ct.tensor_start[t])
    off, n = int(ct.offset[row]), int(ct.nbytes[row])
    with open(os.path.join(ckpt, index.files[int(ct.file[row])].name), "rb") as f:
        f.seek(off)
        data = f.read(n)
    half, length = n // 2, ct.shapes[t][0] // 2
    counts = np.diff(ct.tensor_start).copy()
    counts[t] = 2
    rows = list(range(row)) + [row, row] + list(range(row + 1, ct.num_chunks))
    pos, ext, gen = [], [], [0]
    for u in range(len(ct.shapes)):
        if u == t:
            pos += [0, 0]
            ext += [length, length]
        else:
            c = ct.tensor_chunks(u)
            pos += c.pos.reshape(-1).tolist()
            ext += c.extent.reshape(-1).tolist()
        gen.append(len(pos))
    nbytes = ct.nbytes[rows].copy()
    nbytes[row : row + 2] = half
    offset = ct.offset[rows].copy()
    offset[row + 1] = off + half
    sums = np.concatenate([ct.checksums[: ct.block_start[row]],
                           np.array([crc32c(data[:half]), crc32c(data[half:])], dtype=np.uint32),
                           ct.checksums[ct.block_start[row + 1] :]])
    blocks = np.concatenate([[0], np.cumsum(np.maximum(1, -(-nbytes // ct.block_size)))]).astype(np.int64)
    table = ChunkTable(ct.shapes, ct.itemsizes, tuple(None for _ in ct.shapes),
                       np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), ct.file[rows], offset, nbytes,
                       np.array(pos, dtype=np.int64), np.array(ext, dtype=np.int64), np.array(gen, dtype=np.int64),
                       sums, blocks, ct.block_size, None)
    with open(path, "wb") as f:
        f.write(encode_columnar(dataclasses.replace(index, chunks=table), 4))
