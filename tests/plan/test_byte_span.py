"""Byte ranges of resharded reads: which bytes of a saved chunk a piece needs."""

from __future__ import annotations

import numpy as np
import pytest

from shardsafe.format.index import ChunkEntry
from shardsafe.plan.load_plan import block_span, byte_span, pieces_for


def chunk(offsets: tuple[int, ...], shape: tuple[int, ...], itemsize: int = 4) -> ChunkEntry:
    n = int(np.prod(shape)) * itemsize
    return ChunkEntry("f", 0, n, offsets, shape, (0,))


@pytest.mark.parametrize("saved, want_off, want_shape, span", [
    # rows 2..5 of a (10, 8) float32 chunk: one contiguous slab
    (((0, 0), (10, 8)), (2, 0), (3, 8), (2 * 32, 5 * 32)),
    # the whole chunk
    (((0, 0), (10, 8)), (0, 0), (10, 8), (0, 320)),
    # a column slice: from the first wanted element to the last
    (((0, 0), (10, 8)), (0, 6), (10, 2), (6 * 4, (9 * 8 + 8) * 4)),
    # a chunk that starts at row 4 of the global tensor; we want global rows 5..7
    (((4, 0), (6, 8)), (5, 0), (2, 8), (1 * 32, 3 * 32)),
    # 1-D and 0-D
    (((10,), (10,)), (12,), (3,), (8, 20)),
    (((), ()), (), (), (0, 4)),
])
def test_byte_span(saved, want_off, want_shape, span) -> None:  # noqa: ANN001
    (piece,) = pieces_for([chunk(*saved)], want_off, want_shape)
    assert byte_span(piece, 4) == span


def test_byte_span_bounds_exactly_the_elements_of_the_region() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        shape = tuple(int(x) for x in rng.integers(1, 6, size=rng.integers(1, 4)))
        lo = tuple(int(rng.integers(0, s)) for s in shape)
        hi = tuple(int(rng.integers(a + 1, s + 1)) for a, s in zip(lo, shape))
        (piece,) = pieces_for([chunk((0,) * len(shape), shape, 1)], lo,
                              tuple(b - a for a, b in zip(lo, hi)))
        flat = np.arange(int(np.prod(shape))).reshape(shape)
        used = flat[tuple(slice(a, b) for a, b in zip(lo, hi))]
        assert byte_span(piece, 1) == (int(used.min()), int(used.max()) + 1)


@pytest.mark.parametrize("lo, hi, nbytes, out", [
    (0, 10, 100, (0, 1, 0, 100)),         # one short block: read (and verify) all of it
    (4096, 8192, 3 * 4096, (1, 2, 4096, 8192)),
    (100, 5000, 3 * 4096, (0, 2, 0, 8192)),
    (9000, 9001, 9500, (2, 3, 8192, 9500)),  # last block is shorter
    (0, 0, 0, (0, 1, 0, 0)),                 # empty chunk: its single checksum block
])
def test_block_span(lo: int, hi: int, nbytes: int, out: tuple[int, int, int, int]) -> None:
    assert block_span(lo, hi, nbytes, 4096) == out
