"""CRC32C (Castagnoli), the checksum of every stored byte (data blocks and index, every version).

The hardware-accelerated ``crc32c`` package is used when installed (extra ``fast``;
~14 GB/s per core and it releases the GIL). Without it a table-driven software
implementation gives the same values, slowly, so a numpy-only reader can still verify.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np

ALGORITHM = "crc32c"
log = logging.getLogger("shardsafe")

try:  # the fast path; optional by design (``import shardsafe`` needs only numpy)
    from crc32c import crc32c as _hw_crc32c

    HARDWARE = True
except ImportError:  # pragma: no cover - exercised where crc32c is absent
    _hw_crc32c = None
    HARDWARE = False


def _make_table() -> np.ndarray:
    poly = 0x82F63B78  # reflected Castagnoli polynomial
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table[i] = c
    return table


_TABLE = _make_table().tolist()
_warned = False


def software_crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """Reference CRC32C in pure Python (slow; used without the ``crc32c`` package)."""
    crc = value ^ 0xFFFFFFFF
    table = _TABLE
    for b in memoryview(data).cast("B"):
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def crc32c(data: bytes | bytearray | memoryview | np.ndarray, value: int = 0) -> int:
    """Returns the CRC32C of ``data`` continuing from ``value`` (0 to start)."""
    if isinstance(data, np.ndarray):
        data = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    if _hw_crc32c is not None:
        return _hw_crc32c(data, value)
    global _warned
    if not _warned:
        _warned = True
        log.warning("the 'crc32c' package is missing; checksums use a slow software fallback "
                    "(pip install 'shardsafe[fast]')")
    return software_crc32c(data, value)


def blocks(data: memoryview, block_size: int) -> Iterator[memoryview]:
    """The ``block_size`` slices of ``data`` (the last may be shorter).

    An empty buffer is exactly one block (of zero bytes) so that every chunk has a checksum.
    """
    n = len(data)
    for start in range(0, n, block_size) if n else (0,):
        yield data[start : start + block_size]
