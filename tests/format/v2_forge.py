"""Builds v2 index bytes from a JSON part and columns, following docs/FORMAT.md section 11
without the encoder, so tests can forge indexes the encoder would never write."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from shardsafe.format.checksum import crc32c

ORDER = ("offset", "file", "pos", "extent", "crc32c")
CODED = ("codec", "stored", "stored_crc32c")  # present in indexes with compressed chunks


def _names(js: dict[str, Any]) -> tuple[str, ...]:
    return ORDER + (CODED if "codec" in js["columns"] else ())


def split_v2(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The JSON part and the columns (as int64/uint32 arrays) of v2 index bytes."""
    return split_columns(data, 2, _names)


def split_columns(data: bytes, want: int, names: Callable[[dict[str, Any]], tuple[str, ...]]
                  ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The JSON part and the columns ``names(json part)`` of version ``want`` index bytes."""
    magic, version, hsize, jlen, clen = struct.unpack_from("<8sIIQQ", data)
    assert magic == b"SSAFEIDX" and version == want and hsize == 32
    js = json.loads(data[32 : 32 + jlen])
    at = 32 + jlen + (-jlen % 8)
    cols = {}
    for n in names(js):
        dtype, count = js["columns"][n]
        arr = np.frombuffer(data, dtype=dtype, count=count, offset=at)
        cols[n] = arr.astype(np.uint32 if n.endswith("crc32c") else np.int64)
        size = count * np.dtype(dtype).itemsize
        at += size + (-size % 8)
    return js, cols


def seal_v2(js: dict[str, Any], cols: dict[str, np.ndarray], widths: dict[str, str] | None = None,
            fix_counts: bool = True) -> bytes:
    """v2 bytes with a correct CRC: whatever rejects them is validation, not the checksum."""
    widths = widths or {}
    js = dict(js)
    if fix_counts:
        js["columns"] = {n: [widths.get(n, "<u4" if n.endswith("crc32c") else "<u8"), len(cols[n])]
                         for n in ORDER + CODED if n in cols}
    text = json.dumps(js, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    body = text + b"\0" * (-len(text) % 8)
    section = b""
    for n in (n for n in ORDER + CODED if n in js["columns"]):
        raw = np.asarray(cols[n]).astype(js["columns"][n][0]).tobytes()
        section += raw + b"\0" * (-len(raw) % 8)
    out = struct.pack("<8sIIQQ", b"SSAFEIDX", 2, 32, len(text), len(section)) + body + section
    return out + struct.pack("<I", crc32c(out))


def one_tensor_v2(pos: np.ndarray, extent: np.ndarray, shape: list[int]) -> bytes:
    """A sealed v2 index of one uint8 tensor ``w`` whose chunks (general form, one data
    file, packed back to back) are the boxes ``pos``/``extent``; nothing is checked."""
    nbytes = np.prod(extent, axis=1)
    offset = 8 + np.concatenate([[0], np.cumsum(nbytes)[:-1]]).astype(np.int64)
    js = {"library": "forged", "created": 0.0, "world_size": 1, "checksum": "crc32c",
          "block_size": 1 << 30, "metadata": {},
          "files": [{"name": "d", "size": int(8 + nbytes.sum()), "data_start": 8, "rank": 0}],
          "tensors": [{"key": ["w"], "kind": "numpy", "dtype": "uint8", "shape": list(shape),
                       "chunks": len(pos)}],
          "columns": {}, "tree": {"t": "dict", "k": ["w"], "v": [{"t": "tensor", "id": 0}]}}
    cols = {"offset": offset, "file": np.zeros(len(pos), dtype=np.int64),
            "pos": pos.reshape(-1), "extent": extent.reshape(-1),
            "crc32c": np.zeros(len(pos), dtype=np.uint32)}
    widths = {n: next(w for w in ("<u1", "<u2", "<u4", "<u8") if int(a.max(initial=0)) < 1 << (8 * int(w[-1])))
              for n, a in cols.items() if n != "crc32c"}
    return seal_v2(js, cols, widths)
