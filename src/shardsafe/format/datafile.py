"""Data-file layout: a valid safetensors file whose data section starts page-aligned.

A data file is ``u64 little-endian header length N`` + ``N bytes of JSON header``
(padded with spaces) + the raw chunk bytes, back to back with no holes. ``8 + N`` is a
multiple of ``ALIGN`` so the data section can be written and read with direct I/O.
Chunks are ordered by element size, largest first, so every chunk starts at a multiple
of its own element size and can be viewed in place (zero-copy) from a memory map.
Dtypes safetensors lacks are described there as ``U8`` byte arrays; the shardsafe
index is authoritative either way.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .._numbers import ceil_div
from .dtypes import lookup

ALIGN = 4096  # direct-I/O alignment of data sections and buffers; the one definition
METADATA_KEY = "__metadata__"


@dataclass(frozen=True, slots=True)
class Slot:
    """One chunk to place in a data file."""

    name: str  # unique within the file; shown by safetensors tools
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * lookup(self.dtype).itemsize


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each slot lives in a data file.

    Attributes:
        header: The complete header bytes (length prefix included).
        offsets: Absolute file offset of each slot, in the order the slots were given.
        size: Total file size.
    """

    header: bytes
    offsets: tuple[int, ...]
    size: int

    @property
    def data_start(self) -> int:
        return len(self.header)


def layout(slots: Sequence[Slot], metadata: Mapping[str, str] | None = None) -> Layout:
    """Computes the header and the position of every slot (largest element size first).

    ``metadata`` adds string entries to ``__metadata__`` after ``format`` and ``writer``.

    Raises:
        ValueError: Two slots share a name, or one is named ``__metadata__`` (reserved by
            safetensors for the string map; a tensor there would make the file unreadable).
    """
    names = [s.name for s in slots]
    if METADATA_KEY in names or len(set(names)) != len(names):
        raise ValueError(f"slot names must be unique and not {METADATA_KEY!r}")
    dts = [lookup(s.dtype) for s in slots]  # (looked up once: 20,000 slots are common)
    order = sorted(range(len(slots)), key=lambda i: -dts[i].itemsize)
    tensors = []
    rel = [0] * len(slots)
    pos = 0
    for i in order:
        s, d = slots[i], dts[i]
        n = math.prod(s.shape) * d.itemsize
        code, shape = (d.safetensors, s.shape) if d.safetensors else ("U8", (n,))
        tensors.append((s.name, code, shape, n))
        rel[i] = pos
        pos += n
    header = safetensors_header({"format": "pt", "writer": "shardsafe", **(metadata or {})}, tensors, ALIGN)
    total = len(header)
    return Layout(header, tuple(total + r for r in rel), total + pos)


def safetensors_header(metadata: Mapping[str, str],
                       tensors: Iterable[tuple[str, str, Sequence[int], int]], align: int) -> bytes:
    """A safetensors header, length prefix included: the one header writer of the package.

    Args:
        metadata: The ``__metadata__`` string map (written first).
        tensors: ``(name, safetensors dtype code, shape, nbytes)`` of each tensor, stored
            back to back in this order from the start of the data section.
        align: The data section starts at a multiple of this (the JSON is padded with
            spaces); ``ALIGN`` for data files, 8 (what safetensors recommends) for exports.
    """
    entries: dict[str, object] = {METADATA_KEY: dict(metadata)}
    pos = 0
    for name, code, shape, nbytes in tensors:
        entries[name] = {"dtype": code, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    text = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    total = ceil_div(8 + len(text), align) * align
    return struct.pack("<Q", total - 8) + text + b" " * (total - 8 - len(text))


def parse_header(prefix: bytes) -> tuple[int, dict[str, object]]:
    """Parses a safetensors header from the first bytes of a file: ``(data_start, entries)``.

    Raises ValueError when the prefix is too short or not a safetensors header.
    """
    if len(prefix) < 8:
        raise ValueError("shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > len(prefix) - 8:
        raise ValueError(f"header of {n} bytes exceeds the {len(prefix) - 8} bytes given")
    entries = json.loads(prefix[8 : 8 + n].decode("utf-8"))
    if not isinstance(entries, dict):
        raise ValueError("header is not a JSON object")
    return 8 + n, entries
