"""Builds v3 index bytes from a JSON part and columns, following docs/FORMAT.md section 14
without the encoder, so tests can forge indexes the encoder would never write."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from v2_forge import split_columns

from shardsafe.format.checksum import crc32c

TENSOR = ("kind", "dtype", "ndim", "shape", "chunks", "split", "split_step", "split_file0", "split_stride")
CHUNK = ("offset", "file", "pos", "extent", "crc32c")
CODED = ("codec", "stored", "stored_crc32c")  # present in indexes with compressed chunks


def _names(js: dict[str, Any]) -> tuple[str, ...]:
    return TENSOR + CHUNK + (CODED if "codec" in js["columns"] else ())


def split_v3(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The JSON part and the columns (as int64/uint32 arrays) of v3 index bytes."""
    return split_columns(data, 3, _names)


def seal_v3(js: dict[str, Any], cols: dict[str, np.ndarray], fix_counts: bool = True) -> bytes:
    """v3 bytes with a correct CRC: whatever rejects them is validation, not the checksum.
    Columns are stored as <u8 (crc32c columns <u4), with their counts, unless ``fix_counts``
    is False (then the JSON's descriptors are kept as they are)."""
    js = dict(js)
    if fix_counts:
        js["columns"] = {n: ["<u4" if n.endswith("crc32c") else "<u8", len(cols[n])]
                         for n in TENSOR + CHUNK + CODED if n in cols}
    text = json.dumps(js, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    body = text + b"\0" * (-len(text) % 8)
    section = b""
    for n in (n for n in TENSOR + CHUNK + CODED if n in js["columns"]):
        raw = np.asarray(cols[n]).astype(js["columns"][n][0]).tobytes()
        section += raw + b"\0" * (-len(raw) % 8)
    out = struct.pack("<8sIIQQ", b"SSAFEIDX", 3, 32, len(text), len(section)) + body + section
    return out + struct.pack("<I", crc32c(out))
