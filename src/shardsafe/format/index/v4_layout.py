"""The byte layout of index format version 4: header, directory, sections, row grouping.

What the encoder (``v4``) and the readers (``v4``, ``v4_global``) share about where
things lie (docs/FORMAT.md section 15)::

    0        64 B   header: file size, the global part's stored and raw length, codec and
                    CRC32C, the number of parts P, the header's own CRC32C
    64       G B    the global part (zlib-compressed or raw), zero-padded to 8
    D        16 P   the directory: per part its offset, length and CRC32C
    D + 16P         the parts, back to back, to the end of the file

The global part and each part are *sections*: a length-prefixed JSON object (which
describes the columns) then little-endian columns, each zero-padded to 8 bytes.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import CorruptCheckpointError
from .. import INDEX_NAME
from ..checksum import crc32c
from .container import MAGIC, WIDTHS, narrowest, pad8
from .rows import FileEntry
from .rules import (MAX_DIM, MAX_INDEX_BYTES, bad, check_int, check_json_size, decode_files, dumps, finite_float,
                    header_fields, reject_constant, unique_members)

VERSION = 4
HEADER = struct.Struct("<8sIIQQQQIIII")
"""magic, version, header size, file size, stored and raw length of the global part,
number of parts, codec of the global part, its CRC32C, reserved (0), CRC32C of the
header's first 60 bytes."""
ENTRY = struct.Struct("<QII")  # a part's offset, length and CRC32C
_ENTRY_DTYPE = np.dtype([("o", "<u8"), ("n", "<u4"), ("c", "<u4")])
GLOBAL_HEAD = struct.Struct("<Q")  # the global part's JSON length
PART_HEAD = struct.Struct("<I")  # a part's JSON length
RAW, ZLIB = 0, 1  # codecs of the global part
MAX_RATIO = 1032  # deflate never inflates more than this much: a larger claim is forged
# What a stored global part may inflate to (docs/FORMAT.md 15.1): an index's tree, columns
# and metadata compress well, but not as constant bytes do; a writer stores a global part
# raw rather than beyond this bound, and a reader refuses a larger claim before inflating.
INFLATE_FLOOR = 1 << 26
INFLATE_RATIO = 64
I64 = np.int64


class Header:
    """A v4 header, checked: where the global part, the directory and the parts lie.

    Attributes:
        file_size: Size of the whole index file.
        stored, raw: The global part's length as stored and once inflated.
        parts: Number of parts (P).
        codec: ``RAW`` or ``ZLIB``: how the global part is stored.
        crc: CRC32C of the global part's stored bytes.
        directory: Offset of the directory.
    """

    __slots__ = ("file_size", "stored", "raw", "parts", "codec", "crc", "directory")

    def __init__(self, data: bytes | memoryview) -> None:
        if len(data) < HEADER.size:
            raise bad("shorter than a v4 header (truncated?)")
        (magic, version, size, self.file_size, self.stored, self.raw, self.parts, self.codec, self.crc,
         reserved, want) = HEADER.unpack_from(data)
        if magic != MAGIC or version != VERSION or size != HEADER.size:
            raise CorruptCheckpointError(f"unsupported index header (format_version {version})", file=INDEX_NAME)
        if crc32c(bytes(data[: HEADER.size - 4])) != want:
            raise CorruptCheckpointError("index checksum mismatch (header)", file=INDEX_NAME)
        if reserved or self.codec not in (RAW, ZLIB):
            raise bad(f"header: unknown global part codec {self.codec} or reserved value {reserved}")
        self.directory = HEADER.size + self.stored + pad8(self.stored)
        if self.file_size > MAX_INDEX_BYTES or self.directory + ENTRY.size * self.parts > self.file_size:
            raise bad(f"header: a {self.file_size}-byte index cannot hold a {self.stored}-byte global part "
                      f"and {self.parts} parts (an index holds at most {MAX_INDEX_BYTES} bytes)")
        if (self.raw != self.stored if self.codec == RAW else self.raw > max_inflated(self.stored)):
            raise bad(f"header: a {self.stored}-byte global part cannot hold {self.raw} bytes "
                      f"(at most {max_inflated(self.stored)} once inflated)")

    @property
    def head_size(self) -> int:
        """Bytes from the start of the file to the end of the global part."""
        return HEADER.size + self.stored

    @property
    def parts_start(self) -> int:
        """Where the first part begins."""
        return self.directory + ENTRY.size * self.parts

    def entry_span(self, first: int, last: int) -> tuple[int, int]:
        """(offset, length) of the directory entries of parts ``first`` to ``last``."""
        return self.directory + ENTRY.size * first, ENTRY.size * (last - first + 1)

    def inflate(self, head: bytes | memoryview) -> bytes:
        """The global part's raw bytes, from the file's first ``head_size`` bytes (or more)."""
        stored = bytes(head[HEADER.size : self.head_size])
        if len(stored) != self.stored:
            raise bad("the global part is truncated")
        if crc32c(stored) != self.crc:
            raise CorruptCheckpointError("index checksum mismatch (global part)", file=INDEX_NAME)
        if self.codec == RAW:
            return stored
        inflater = zlib.decompressobj()
        try:  # bounded: never more than the declared length
            raw = inflater.decompress(stored, self.raw)
        except zlib.error as e:
            raise bad(f"global part: {e}") from None
        if len(raw) != self.raw or not inflater.eof or inflater.unused_data or inflater.unconsumed_tail:
            raise bad(f"the global part does not inflate to its declared {self.raw} bytes")
        return raw

    def entries(self, data: bytes | memoryview, first: int) -> list[tuple[int, int, int]]:
        """The directory entries in ``data`` (parts ``first``, ``first + 1``, ...), each
        checked to lie among the parts: ``(offset, length, CRC32C)``."""
        e = np.frombuffer(data, dtype=_ENTRY_DTYPE).astype([("o", I64), ("n", I64), ("c", I64)])
        bad_at = np.flatnonzero((e["o"] < self.parts_start) | (e["o"] + e["n"] > self.file_size)
                                | (e["n"] < PART_HEAD.size))
        if len(bad_at):
            i = int(bad_at[0])
            raise bad(f"directory: part {first + i} at [{int(e['o'][i])}, +{int(e['n'][i])}) lies outside the parts")
        return list(zip(e["o"].tolist(), e["n"].tolist(), e["c"].tolist()))


def max_inflated(stored: int) -> int:
    """The most bytes a global part of ``stored`` zlib bytes may inflate to."""
    return min(MAX_RATIO * stored + 64, INFLATE_FLOOR + INFLATE_RATIO * stored)


def check_part(data: bytes | memoryview, k: int, entry: tuple[int, int, int]) -> None:
    """Part ``k``'s bytes match its directory entry (length and CRC32C)."""
    if len(data) != entry[1]:
        raise bad(f"part {k} is truncated")
    if crc32c(bytes(data)) != entry[2]:
        raise CorruptCheckpointError(f"index checksum mismatch (part {k})", file=INDEX_NAME)


# ----------------------------------------------------------------------------- sections


def describe(cols: dict[str, np.ndarray], names: Sequence[str]) -> dict[str, list[Any]]:
    """The ``columns`` member of a section: each column's element type and length."""
    return {n: ["<u4" if n.endswith("crc32c") else narrowest(cols[n]), len(cols[n])] for n in names}


def pack_section(js: dict[str, Any], cols: dict[str, np.ndarray], head: struct.Struct) -> bytes:
    """``head`` (the JSON's length), the JSON, then the columns ``js["columns"]`` describes,
    each padded to a multiple of 8 bytes (the JSON padded so that the first column is)."""
    text = dumps(js).encode("utf-8")
    out = [head.pack(len(text)), text, b"\0" * pad8(head.size + len(text))]
    for n, (kind, _) in js["columns"].items():
        raw = np.ascontiguousarray(cols[n], dtype=kind).tobytes()
        out += [raw, b"\0" * pad8(len(raw))]
    return b"".join(out)


def open_section(data: bytes | memoryview, head: struct.Struct, what: str,
                 stored: int | None = None) -> tuple[dict[str, Any], memoryview]:
    """The JSON object and the column bytes of a section (strict JSON, zero padding);
    ``stored``: the section's size as stored when it was compressed (its JSON may hold
    only as many values as ``rules.check_json_size`` allows for that)."""
    view = memoryview(data)
    if len(view) < head.size:
        raise bad(f"{what} is truncated")
    (n,) = head.unpack_from(view)
    a = head.size + n + pad8(head.size + n)
    if a > len(view):
        raise bad(f"{what}: its JSON runs past its end")
    if any(view[head.size + n : a]):
        raise bad(f"{what}: JSON padding must be zero bytes")
    text = bytes(view[head.size : head.size + n])
    if stored is not None:
        check_json_size(text, stored, what)
    try:
        raw = json.loads(text.decode("utf-8"), parse_constant=reject_constant,
                         parse_float=finite_float, object_pairs_hook=unique_members)
    except (ValueError, RecursionError) as e:
        raise bad(f"{what}: not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise bad(f"{what}: JSON must be an object")
    return raw, view[a:]


def section_columns(desc: Any, section: memoryview, counts: dict[str, int], what: str) -> dict[str, np.ndarray]:
    """A section's columns: exactly those of ``counts`` (in that order in the section),
    each of the length ``counts`` says, of an element type of ``container.WIDTHS``
    (``<u4`` for checksums), zero-padded, none above 2^62; views of ``section``."""
    if not isinstance(desc, dict) or sorted(desc) != sorted(counts):
        raise bad(f"{what}: columns must describe exactly {list(counts)}")
    out, at = {}, 0
    for n, count in counts.items():
        d = desc[n]
        if (type(d) is not list or len(d) != 2 or d[0] not in WIDTHS or (n.endswith("crc32c") and d[0] != "<u4")
                or type(d[1]) is not int or d[1] != count):
            raise bad(f"{what}: column {n} is described as {d!r}, it holds {count} values")
        size = count * int(d[0][-1])
        end = at + size + pad8(size)
        if end > len(section):
            raise bad(f"{what}: column {n} runs past the end of the section")
        arr = np.frombuffer(section, dtype=d[0], count=count, offset=at)
        if any(section[at + size : end]):
            raise bad(f"{what}: column {n}: padding must be zero bytes")
        if d[0] == "<u8" and count and int(arr.max()) > MAX_DIM:
            raise bad(f"{what}: column {n} holds a value above 2^62")
        out[n], at = arr, end
    if at != len(section):
        raise bad(f"{what}: bytes after the last column")
    return out


# ----------------------------------------------------------------------------- rows and parts


def files_per_part(files: Sequence[Any]) -> np.ndarray:
    """The number of files of each part: the encoder makes a part of each run of
    consecutive files written by one rank (readers take ``part_files`` as stored)."""
    ranks = np.fromiter((f.rank for f in files), dtype=I64, count=len(files))
    if not len(ranks):
        return np.zeros(0, dtype=I64)
    starts = np.flatnonzero(np.concatenate([[True], ranks[1:] != ranks[:-1]]))
    return np.diff(np.concatenate([starts, [len(ranks)]]))


def blocks_of(block_start: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The block numbers of chunk ``rows`` (each chunk's blocks in order, chunk after chunk)."""
    first = block_start[rows]
    n = block_start[rows + 1] - first
    total = int(n.sum())
    if total == len(rows):  # one block per chunk: chunks below the block size
        return first
    return np.repeat(first - (np.cumsum(n) - n), n) + np.arange(total, dtype=I64)


def ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The integers of every ``[lo[i], hi[i])``, range after range."""
    n = np.maximum(hi - lo, 0)
    total = int(n.sum())
    return np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(total, dtype=I64)


def group_rows(tensor_start: np.ndarray, file: np.ndarray,
               part_files: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each chunk row is stored, from a table's ``tensor_start`` and ``file`` columns:
    (the rows of the tensors stored as one chunk, in tensor order; the other rows grouped
    by the part of their file, in row order within each part; where each part's rows
    begin in that array, ``(parts + 1,)``)."""
    counts = np.diff(tensor_start)
    whole = tensor_start[:-1][counts == 1]
    multi = np.ones(int(tensor_start[-1]), dtype=bool)
    multi[whole] = False
    rows = np.flatnonzero(multi)
    if (part_files == 1).all():  # one data file per rank: the part is the file
        part = file[rows]
    else:
        file_start = np.concatenate([[0], np.cumsum(part_files)]).astype(I64)
        part = np.searchsorted(file_start, file[rows], side="right") - 1
    # a stable sort by part: a radix sort on 16-bit keys; wider keys are runs (each tensor's
    # parts ascend along its chunks) that timsort merges
    order = np.argsort(part.astype(np.uint16) if len(part_files) <= 1 << 16 else part, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(part, minlength=len(part_files)))]).astype(I64)
    return whole, rows[order], bounds


def products(flat: np.ndarray, at: np.ndarray, nd: np.ndarray) -> np.ndarray:
    """The product of ``flat[at[j] : at[j] + nd[j]]`` for each ``j`` (1 where ``nd[j]`` is 0):
    a tensor's element count from its shape, a chunk's from its extent."""
    out = np.ones(len(nd), dtype=I64)
    for d in np.unique(nd).tolist():
        if d:
            j = np.flatnonzero(nd == d)
            out[j] = np.prod(flat[ranges(at[j], at[j] + d)].reshape(-1, d), axis=1, dtype=I64)
    return out

def whole_files_member(raw: Any, num_files: int) -> dict[int, FileEntry]:
    """The ``whole_files`` member: ``[[file id, file row], ...]`` by ascending id."""
    if not isinstance(raw, list) or not all(isinstance(p, list) and len(p) == 2 for p in raw):
        raise bad("whole_files must be a list of [file id, file row] pairs")
    ids = [check_int(p[0], "whole_files id", 0, 1 << 31) for p in raw]
    if ids != sorted(set(ids)) or (ids and ids[-1] >= num_files):
        raise bad(f"whole_files ids must ascend, each once, below the file count {num_files}")
    return dict(zip(ids, decode_files([p[1] for p in raw])))


def head_fields(head: bytes | memoryview) -> dict[str, Any]:
    """``world_size``, ``created``, ``metadata`` and ``library`` of the global part in
    ``head`` (an index's first ``Header.head_size`` bytes), its other members unchecked:
    for listing checkpoints (what a step records), never for reading one
    (``GlobalPart.decode`` checks everything a read relies on).

    Raises:
        CorruptCheckpointError: The header, the section or those fields are malformed.
    """
    header = Header(head)
    raw, _ = open_section(header.inflate(head), GLOBAL_HEAD, "global part", header.stored)
    return header_fields(raw)

