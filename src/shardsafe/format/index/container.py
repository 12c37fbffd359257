"""The binary container of the binary index versions (2 and later): a header, a JSON part
and typed columns, and the chunk columns every one of them stores.

Layout (docs/FORMAT.md sections 11.1 and 14)::

    0   8  magic  b"SSAFEIDX"
    8   4  u32    format_version
    12  4  u32    header size (32)
    16  8  u64    J: length of the JSON part
    24  8  u64    C: length of the column section
    32  J         JSON part (UTF-8), zero-padded to a multiple of 8
    A   C         columns, in the version's order, each zero-padded to a multiple of 8
    A+C 4  u32    CRC32C of every byte before it

The JSON part's ``columns`` member gives each column's element type (unsigned, the
narrowest that holds its largest value; CRC32C columns always ``<u4``) and length. Every
binary version stores the chunk table as the columns ``COLUMNS`` (plus ``CODED_COLUMNS``
when some chunk is compressed) and opens its JSON part with ``header_members``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import CorruptCheckpointError
from .. import INDEX_NAME
from ..blockfile import BlockCoding
from ..checksum import ALGORITHM, crc32c
from .chunk_table import ChunkTable
from .model import ColumnarIndex
from .rules import (MAX_DIM, MAX_INDEX_BYTES, bad, check_int, encode_files, finite_float,
                    metadata_size_problem, reject_constant, unique_members)

MAGIC = b"SSAFEIDX"
HEADER = struct.Struct("<8sIIQQ")
WIDTHS = ("<u1", "<u2", "<u4", "<u8")
COLUMNS = ("offset", "file", "pos", "extent", "crc32c")
# Present only in an index with compressed chunks, after COLUMNS (FORMAT.md 12.2): per block,
# its codec (index into the JSON member "codecs"), stored size and stored CRC32C.
CODED_COLUMNS = ("codec", "stored", "stored_crc32c")


def is_container(data: bytes | memoryview) -> bool:
    """Whether ``data`` starts like a binary index (v1 starts with ``{``)."""
    return bytes(data[: len(MAGIC)]) == MAGIC


def version_of(data: bytes | memoryview) -> int | None:
    """The ``format_version`` of a binary index's header (None if there is no header)."""
    if len(data) < HEADER.size or not is_container(data):
        return None
    return HEADER.unpack_from(data)[1]


def narrowest(values: np.ndarray) -> str:
    """The narrowest column type that holds every value (all >= 0)."""
    top = int(values.max()) if len(values) else 0
    return next(w for w in WIDTHS if top < 1 << (8 * np.dtype(w).itemsize))


def pad8(n: int) -> int:
    return -n % 8


def check_metadata(metadata: Mapping[str, Any]) -> None:
    """Raises TypeError/ValueError unless ``metadata`` can be written into an index's JSON
    part as the encoders write it (``dumps``, then UTF-8: no NaN, no lone surrogate) and
    is at most ``MAX_METADATA_BYTES`` long that way (what every reader accepts)."""
    problem = metadata_size_problem(dict(metadata))
    if problem is not None:
        raise ValueError(problem)


def header_members(index: ColumnarIndex) -> dict[str, Any]:
    """The JSON members that open a binary index, in order (library to files)."""
    return {"library": index.library, "created": index.created, "world_size": index.world_size,
            "checksum": ALGORITHM, "block_size": index.chunks.block_size, "metadata": index.metadata,
            "files": encode_files(index.files)}


def stored_columns(ct: ChunkTable) -> dict[str, np.ndarray]:
    """The chunk columns a binary index stores (split tensors keep neither file ids nor positions)."""
    general = np.zeros(ct.num_chunks, dtype=bool)
    for t, s in enumerate(ct.splits):
        if s is None:
            general[ct.tensor_start[t] : ct.tensor_start[t + 1]] = True
    cols = {"offset": ct.offset, "file": ct.file[general], "pos": ct.pos, "extent": ct.extent,
            "crc32c": ct.checksums}
    if ct.coding is not None:
        cols.update(codec=ct.coding.codec, stored=ct.coding.stored, stored_crc32c=ct.coding.checksums)
    return cols


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


def seal(js: bytes, columns: Sequence[np.ndarray], kinds: Sequence[str], version: int) -> bytes:
    """The container bytes of a JSON part and its columns (in order, stored as ``kinds``)."""
    parts = [b"", js, b"\0" * pad8(len(js))]
    clen = 0
    for arr, kind in zip(columns, kinds):
        raw = np.ascontiguousarray(arr, dtype=kind).tobytes()
        parts += [raw, b"\0" * pad8(len(raw))]
        clen += len(raw) + pad8(len(raw))
    parts[0] = HEADER.pack(MAGIC, version, HEADER.size, len(js), clen)
    out = b"".join(parts)
    return out + struct.pack("<I", crc32c(out))


def open_container(data: bytes, version: int) -> tuple[dict[str, Any], memoryview]:
    """Checks header, sizes and CRC; returns the parsed JSON part and the column section."""
    if len(data) > MAX_INDEX_BYTES:
        raise bad(f"index is {len(data)} bytes, more than the {MAX_INDEX_BYTES} allowed")
    if len(data) < HEADER.size + 4:
        raise bad(f"shorter than a v{version} header (truncated?)")
    magic, got, hsize, jlen, clen = HEADER.unpack_from(data)
    if magic != MAGIC or got != version or hsize != HEADER.size:
        raise CorruptCheckpointError(f"unsupported index header (format_version {got})",
                                     file=INDEX_NAME)
    a = HEADER.size + jlen + pad8(jlen)
    if clen % 8 or a + clen + 4 != len(data):
        raise bad(f"sections of {jlen} + {clen} bytes do not add up to {len(data)} (truncated?)")
    (want,) = struct.unpack_from("<I", data, len(data) - 4)
    view = memoryview(data)
    if crc32c(view[:-4]) != want:
        raise CorruptCheckpointError("index checksum mismatch", file=INDEX_NAME)
    if any(data[HEADER.size + jlen : a]):
        raise bad("JSON padding must be zero bytes")
    try:
        raw = json.loads(bytes(view[HEADER.size : HEADER.size + jlen]).decode("utf-8"),
                         parse_constant=reject_constant, parse_float=finite_float,
                         object_pairs_hook=unique_members)
    except (ValueError, RecursionError) as e:
        raise bad(f"not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise bad("JSON part must be an object")
    if raw.get("checksum") != ALGORITHM:
        raise bad(f"unknown checksum algorithm {raw.get('checksum')!r}")
    return raw, view[a : a + clen]


def read_columns(raw: Any, section: memoryview, names: Sequence[str], optional: Sequence[str],
                 expected: Mapping[str, int | None]) -> dict[str, np.ndarray]:
    """The stored columns: exactly ``names``, then ``optional`` when the first of them is
    described, in that order; lengths must be the ``expected`` ones (None: any). Values are
    int64 (CRC32C columns: uint32), none above 2^62."""
    return widen(column_views(raw, section, names, optional, expected), {})


def column_views(raw: Any, section: memoryview, names: Sequence[str], optional: Sequence[str],
                 expected: Mapping[str, int | None] | None = None) -> dict[str, np.ndarray]:
    """``read_columns``' columns as stored (views of ``section``, their own element
    types): checked descriptors, ``expected`` lengths, bounds, padding and values,
    nothing allocated."""
    names = tuple(names) + (tuple(optional) if isinstance(raw, dict) and optional and optional[0] in raw
                            else ())
    if not isinstance(raw, dict) or sorted(raw) != sorted(names):
        raise bad(f"columns must describe exactly {list(names)}"
                  + (f", optionally followed by {list(optional)} (compressed chunks)" if optional else ""))
    out, at = {}, 0
    for n in names:
        desc = raw[n]
        if (not isinstance(desc, list) or len(desc) != 2 or desc[0] not in WIDTHS
                or (n.endswith("crc32c") and desc[0] != "<u4")):
            raise bad(f"column {n}: bad descriptor {desc!r}")
        count = check_int(desc[1], f"length of column {n}", 0, len(section))
        if expected and expected.get(n) is not None and count != expected[n]:
            raise bad(f"column {n} holds {count} values, the tensor rows need {expected[n]}")
        size = count * np.dtype(desc[0]).itemsize
        if at + size + pad8(size) > len(section):
            raise bad(f"column {n} runs past the end of the column section")
        arr = np.frombuffer(section, dtype=desc[0], count=count, offset=at)
        if any(section[at + size : at + size + pad8(size)]):
            raise bad(f"column {n}: padding must be zero bytes")
        if desc[0] == "<u8" and count and int(arr.max()) > MAX_DIM:
            raise bad(f"column {n} holds a value above 2^62")
        out[n] = arr
        at += size + pad8(size)
    if at != len(section):
        raise bad("bytes after the last column")
    return out


def widen(views: Mapping[str, np.ndarray], expected: Mapping[str, int | None]) -> dict[str, np.ndarray]:
    """Column ``views`` as int64 (CRC32C columns as uint32), each length checked against
    ``expected`` (None or absent: any) before anything is widened."""
    for n, arr in views.items():
        if expected.get(n) is not None and len(arr) != expected[n]:
            raise bad(f"column {n} holds {len(arr)} values, the tensor rows need {expected[n]}")
    return {n: arr if n.endswith("crc32c") else arr.astype(np.int64) for n, arr in views.items()}
