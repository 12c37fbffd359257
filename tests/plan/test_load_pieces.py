"""pieces_for: which parts of which saved chunks fill a wanted region (pure, table-driven)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from shardsafe.format.index.rows import ChunkEntry
from shardsafe.plan.load_plan import CoverageError, pieces_for


def chunk(offsets: tuple[int, ...], shape: tuple[int, ...]) -> ChunkEntry:
    return ChunkEntry("f", 0, int(np.prod(shape)) * 4, offsets, shape, (0,))


ROWS = [chunk((0, 0), (2, 4)), chunk((2, 0), (2, 4))]          # a 4x4 tensor in row halves
GRID = [chunk((r, c), (2, 2)) for r in (0, 2) for c in (0, 2)]  # ... and in 2x2 blocks

CASES = [
    # chunks, wanted offsets, wanted shape, expected [(chunk index, src, dst)]
    (ROWS, (0, 0), (4, 4), [(0, ((0, 2), (0, 4)), ((0, 2), (0, 4))),
                            (1, ((0, 2), (0, 4)), ((2, 4), (0, 4)))]),
    (ROWS, (1, 1), (2, 2), [(0, ((1, 2), (1, 3)), ((0, 1), (0, 2))),
                            (1, ((0, 1), (1, 3)), ((1, 2), (0, 2)))]),
    (ROWS, (2, 0), (2, 4), [(1, ((0, 2), (0, 4)), ((0, 2), (0, 4)))]),
    (GRID, (1, 1), (2, 2), [(0, ((1, 2), (1, 2)), ((0, 1), (0, 1))), (1, ((1, 2), (0, 1)), ((0, 1), (1, 2))),
                            (2, ((0, 1), (1, 2)), ((1, 2), (0, 1))), (3, ((0, 1), (0, 1)), ((1, 2), (1, 2)))]),
    ([chunk((), ())], (), (), [(0, (), ())]),
    ([chunk((0,), (0,))], (0,), (0,), []),
    ([], (0, 0), (0, 3), []),
]


@pytest.mark.parametrize(("chunks", "offsets", "shape", "want"), CASES)
def test_pieces(chunks, offsets, shape, want) -> None:
    got = pieces_for(chunks, offsets, shape)
    assert [(chunks.index(p.chunk), p.src, p.dst) for p in got] == want


def test_whole_chunk_flag() -> None:
    (p,) = pieces_for(ROWS[:1], (0, 0), (2, 4))
    assert p.whole_chunk
    (p, _) = pieces_for(ROWS, (1, 0), (2, 4))
    assert not p.whole_chunk


@pytest.mark.parametrize(("chunks", "offsets", "shape"), [
    (ROWS[:1], (0, 0), (4, 4)),
    (GRID[:3], (0, 0), (4, 4)),
    ([], (0,), (1,)),
    ([], (), ()),
])
def test_uncovered_regions_raise(chunks, offsets, shape) -> None:
    with pytest.raises(CoverageError):
        pieces_for(chunks, offsets, shape)


@pytest.mark.parametrize(("chunks", "offsets", "shape", "message"), [
    # as many elements as the region, but one half twice and the other never
    ([chunk((0, 0), (2, 4)), chunk((0, 0), (2, 4))], (0, 0), (4, 4), r"element \[0, 0\] lies in 2 chunks"),
    ([chunk((0, 0), (2, 4)), chunk((1, 0), (2, 4)), chunk((3, 0), (1, 4)), chunk((2, 0), (1, 4))], (0, 0), (4, 4),
     r"hold 24 elements, shape needs 16"),
    ([chunk((0, 0), (2, 4)), chunk((1, 0), (2, 4))], (0, 0), (4, 4), r"element \[1, 0\] lies in 2 chunks"),
    # inside a region that one chunk covers twice
    ([chunk((0, 0), (4, 4)), chunk((1, 1), (1, 1))], (1, 1), (2, 2), r"lies in 2 chunks|hold 5 elements"),
    ([chunk((), ()), chunk((), ())], (), (), "2 chunks of a scalar overlap"),
])
def test_regions_covered_twice_raise(chunks, offsets, shape, message) -> None:
    with pytest.raises(CoverageError, match=message):
        pieces_for(chunks, offsets, shape)


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (3, 2), (5, 7)])
def test_reassembly_of_random_regions_matches_numpy(rows: int, cols: int) -> None:
    rng = np.random.default_rng(rows * 10 + cols)
    full = rng.standard_normal((10, 14))
    rb = np.linspace(0, 10, rows + 1).astype(int)
    cb = np.linspace(0, 14, cols + 1).astype(int)
    chunks, data = [], {}
    for (r0, r1), (c0, c1) in itertools.product(zip(rb, rb[1:]), zip(cb, cb[1:])):
        c = chunk((int(r0), int(c0)), (int(r1 - r0), int(c1 - c0)))
        chunks.append(c)
        data[id(c)] = full[r0:r1, c0:c1]
    for _ in range(20):
        o = rng.integers(0, [10, 14])
        s = rng.integers(1, [11, 15] - o)
        out = np.full(tuple(s), np.nan)
        for p in pieces_for(chunks, tuple(o), tuple(s)):
            src = data[id(p.chunk)][tuple(slice(a, b) for a, b in p.src)]
            out[tuple(slice(a, b) for a, b in p.dst)] = src
        np.testing.assert_array_equal(out, full[o[0]:o[0] + s[0], o[1]:o[1] + s[1]])


def test_a_thousand_rank_row_split_is_fast() -> None:
    chunks = [chunk((i * 4, 0), (4, 8)) for i in range(1000)]
    pieces = pieces_for(chunks, (1998, 0), (8, 8))
    assert [(p.chunk.offsets[0], p.src[0], p.dst[0]) for p in pieces] == [
        (1996, (2, 4), (0, 2)), (2000, (0, 4), (2, 6)), (2004, (0, 2), (6, 8))]
