"""CRC32C of a concatenation from the CRCs of its parts (no access to the bytes).

``crc32c_combine(crc(A), crc(B), len(B)) == crc(A + B)``. Writers checksum the pieces of
a block that lie in different write units on different threads, from the very bytes
written, and join them here. The method is zlib's ``crc32_combine``: appending ``n``
zero bytes is a linear map on the 32-bit CRC state, applied by the precomputed operators
for 2**k zero bytes, so a join costs O(log n) matrix-vector products.
"""

from __future__ import annotations

_POLY = 0x82F63B78  # reflected Castagnoli polynomial


def _times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _square(mat: list[int]) -> list[int]:
    return [_times(mat, mat[n]) for n in range(32)]


def _byte_powers(count: int = 48) -> list[list[int]]:
    """Operators that append ``2**k`` zero bytes, for k < ``count``."""
    op = [_POLY] + [1 << n for n in range(31)]  # one zero bit
    for _ in range(3):
        op = _square(op)  # eight zero bits: one byte
    out = [op]
    for _ in range(count - 1):
        out.append(_square(out[-1]))
    return out


_POWERS = _byte_powers()


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC32C of ``A + B`` given ``crc1 = crc32c(A)``, ``crc2 = crc32c(B)`` and ``len(B)``."""
    if not 0 <= len2 < 1 << len(_POWERS):
        raise ValueError(f"length {len2} out of range")
    k = 0
    while len2:
        if len2 & 1:
            crc1 = _times(_POWERS[k], crc1)
        len2 >>= 1
        k += 1
    return crc1 ^ crc2
