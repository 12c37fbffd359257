"""Units and checksum blocks of a data file: pure arithmetic, checked exhaustively on small plans."""

from __future__ import annotations

import numpy as np
import pytest

from shardsafe.engine.save.units import HEADER, FileUnits
from shardsafe.plan.flatten import flatten
from shardsafe.plan.layout import plan_file


def _plan(sizes_and_dtypes):
    state = {f"t{i}": np.zeros(n, dtype=dt) for i, (n, dt) in enumerate(sizes_and_dtypes)}
    _, items = flatten(state)
    return plan_file("f", items)


CASES = [
    [(10, "float32")],
    [(0, "float32"), (5, "int8"), (0, "int8"), (3000, "float64")],
    [(4096, "uint8"), (1, "float16"), (12345, "float32"), (7, "int64")],
    [(100_000, "float32"), (3, "int8")],
]


@pytest.mark.parametrize("spec", CASES)
@pytest.mark.parametrize("unit,block", [(4096, 4096), (8192, 12288), (4096 * 16, 1000)])
def test_parts_tile_the_file_and_blocks_tile_each_item(spec, unit, block):
    plan = _plan(spec)
    u = FileUnits(plan, unit, block)
    covered = np.zeros(plan.layout.size, dtype=np.int32)
    for k in range(u.nunits):
        start, stop = u.span(k)
        assert start % 4096 == 0
        pos = start
        for item, src, dst, length in zip(*u.parts(k)):
            assert dst == pos or item != HEADER  # header part starts the unit it is in
            assert length > 0
            covered[dst : dst + length] += 1
            if item != HEADER:
                assert dst == plan.layout.offsets[item] + src
            pos = dst + length
        assert pos <= stop
    assert (covered == 1).all(), "every file byte belongs to exactly one part"
    seen = {}
    for k in range(u.nunits):
        for b in u.blocks_ending_in(k).tolist():
            start, stop = int(u.block_start[b]), int(u.block_stop[b])
            assert u.unit_of(max(start, stop - 1)) == k
            seen.setdefault(int(u.block_item[b]), []).append((b, start, stop))
    assert sum(len(v) for v in seen.values()) == u.nblocks_total
    for i, it in enumerate(plan.items):
        bs = sorted(seen[i])
        assert [b for b, _, _ in bs] == list(range(u.block_first[i], u.block_first[i + 1]))
        assert len(bs) == u.nblocks[i]
        off = plan.layout.offsets[i]
        assert bs[0][1] == off and bs[-1][2] == off + it.nbytes
        assert all(stop - start <= block for _, start, stop in bs)
        assert all(a[2] == b[1] for a, b in zip(bs, bs[1:])), "an item's blocks are back to back"


@pytest.mark.parametrize("spec", CASES)
@pytest.mark.parametrize("unit,block", [(4096, 4096), (8192, 12288), (4096 * 16, 1000)])
def test_blocks_touching_a_range_are_exactly_the_overlapping_ones(spec, unit, block):
    plan = _plan(spec)
    u = FileUnits(plan, unit, block)
    for start in range(0, plan.layout.size + 1, 1500):
        for stop in (start + 1, start + 4096, start + 50_000):
            got = u.blocks_touching(start, stop).tolist()
            want = [b for b in range(u.nblocks_total)
                    if u.block_stop[b] > u.block_start[b] and u.block_start[b] < stop and u.block_stop[b] > start]
            assert sorted(got) == want
            assert [u.block_start[b] for b in got] == sorted(u.block_start[b] for b in got)


def test_unit_size_must_be_aligned():
    with pytest.raises(ValueError):
        FileUnits(_plan([(1, "int8")]), 1000, 4096)
