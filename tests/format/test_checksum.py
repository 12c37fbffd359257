"""CRC32C known vectors, for the hardware path and the pure-Python fallback alike."""

from __future__ import annotations

import numpy as np
import pytest

from shardsafe.format import checksum
from shardsafe.format.checksum import blocks, crc32c, software_crc32c

# (input, CRC32C) pairs from RFC 3720 appendix B.4 and the usual check value.
VECTORS = [
    (b"", 0x00000000),
    (b"a", 0xC1D04330),
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (b"The quick brown fox jumps over the lazy dog", 0x22620404),
]

IMPLS = [pytest.param(software_crc32c, id="software"), pytest.param(crc32c, id="default")]


@pytest.mark.parametrize("fn", IMPLS)
@pytest.mark.parametrize(("data", "want"), VECTORS)
def test_known_vectors(fn, data: bytes, want: int) -> None:
    assert fn(data) == want


def test_hardware_package_is_used_here() -> None:
    # the dev environment installs crc32c; without it the fast path would silently be the slow one
    assert checksum.HARDWARE
    assert checksum._hw_crc32c is not None
    assert checksum._hw_crc32c(b"123456789") == 0xE3069283


@pytest.mark.parametrize("fn", IMPLS)
def test_continuation_equals_whole(fn) -> None:
    data = bytes(range(256)) * 7
    for cut in (0, 1, 100, 1000, len(data)):
        assert fn(data[cut:], fn(data[:cut])) == fn(data)


def test_software_matches_hardware_on_random_data() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 3, 4095, 4096, 4097, 10_000):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert software_crc32c(data) == checksum._hw_crc32c(data)


def test_accepts_arrays_memoryviews_and_non_contiguous() -> None:
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    want = crc32c(a.tobytes())
    assert crc32c(a) == want
    assert crc32c(memoryview(a.tobytes())) == want
    assert crc32c(bytearray(a.tobytes())) == want
    t = a.T  # non-contiguous: checksummed in row-major order of the transposed view
    assert crc32c(t) == crc32c(np.ascontiguousarray(t).tobytes())
    assert software_crc32c(memoryview(a).cast("B")) == want


@pytest.mark.parametrize(("n", "block", "count"), [(0, 4096, 1), (1, 4096, 1), (4096, 4096, 1),
                                                   (4097, 4096, 2), (3 * 4096, 4096, 3)])
def test_blocks_cut_the_data_and_an_empty_buffer_is_one_block(n: int, block: int, count: int) -> None:
    data = (bytes(range(256)) * (n // 256 + 1))[:n]
    parts = [bytes(b) for b in blocks(memoryview(data), block)]
    assert len(parts) == count
    assert parts == [data[i : i + block] for i in range(0, max(n, 1), block)]
