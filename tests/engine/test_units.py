"""Units and checksum blocks of a data file: pure arithmetic, checked exhaustively on small plans."""

from __future__ import annotations

import numpy as np
import pytest

from shardsafe.engine.units import HEADER, FileUnits
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
        for p in u.parts(k):
            assert p.dst == pos or p.item != HEADER  # header part starts the unit it is in
            covered[p.dst : p.dst + p.length] += 1
            if p.item != HEADER:
                assert p.dst == plan.layout.offsets[p.item] + p.src
            pos = p.dst + p.length
        assert pos <= stop
    assert (covered == 1).all(), "every file byte belongs to exactly one part"
    seen = {}
    for k, blocks in enumerate(u.blocks_by_unit):
        for b in blocks:
            assert u.unit_of(max(b.start, b.stop - 1)) == k
            seen.setdefault(b.item, []).append(b)
    for i, it in enumerate(plan.items):
        bs = sorted(seen[i], key=lambda b: b.index)
        assert [b.index for b in bs] == list(range(u.nblocks[i]))
        off = plan.layout.offsets[i]
        assert bs[0].start == off and bs[-1].stop == off + it.nbytes
        assert all(b.stop - b.start <= block for b in bs)


def test_unit_size_must_be_aligned():
    with pytest.raises(ValueError):
        FileUnits(_plan([(1, "int8")]), 1000, 4096)
