"""Per-rank bookkeeping between flattened items and the writer planner (no processes)."""

from __future__ import annotations

import numpy as np

from shardsafe.dtensor import holders_of
from shardsafe.plan.distribute import plan_writers
from shardsafe.plan.flatten import TensorItem
from shardsafe.plan.sharding import everywhere, item_table, make_report, my_share


def item(i: int, n: int, offsets: tuple[int, ...] = (0,)) -> TensorItem:
    return TensorItem(id=i, path=("t", str(i)), value=np.zeros(n, dtype=np.float32), kind="numpy",
                      dtype="float32", shape=(n * 4,), offsets=offsets, replicated=False)


def test_holders_of_a_2x2_mesh() -> None:
    mesh = np.arange(4).reshape(2, 2)  # rows: mesh dim 0, columns: mesh dim 1
    assert holders_of(mesh, [0, 1], {0}) == (1, 3)  # Replicate on dim 0: the column
    assert holders_of(mesh, [1, 0], {1}) == (2, 3)  # Replicate on dim 1: the row
    assert holders_of(mesh, [1, 1], set()) == (3,)  # sharded on both: alone
    assert holders_of(mesh, [0, 0], {0, 1}) == (0, 1, 2, 3)  # replicated everywhere


def test_report_and_share_follow_the_holders() -> None:
    # rank 1 of a 2x2 mesh: item 0 its own box, item 1 shared with rank 3, item 2 a plain
    # tensor, item 3 an empty box (uneven sharding)
    items = [item(0, 8), item(1, 4, (4,)), item(2, 2), item(3, 0)]
    holders = [(1,), (1, 3), None, ()]
    rep = make_report(1, items, holders)
    assert rep.own_bytes == 32
    assert [(g.holders, g.items, g.nbytes) for g in rep.led] == [((1, 3), (1,), (16,))]
    assert everywhere(items, holders) == [(2, 8)]
    assert make_report(3, items, [(3,), (1, 3), None, ()]).led == ()  # rank 3 does not lead
    # a plan that gives the shared box to rank 3 and the plain tensor to rank 1
    reports = [make_report(r, items, [(r,), (1, 3) if r % 2 else (0, 2), None, ()])
               for r in range(4)]
    plan = plan_writers(4, reports, everywhere(items, holders))
    shares = {r: [it.id for it in my_share(plan, r, items, [(r,), (1, 3) if r % 2 else (0, 2),
                                                             None, ()])] for r in range(4)}
    assert all(0 in ids and 3 not in ids for ids in shares.values())  # own box; never empty ones
    assert sum(1 in ids for ids in shares.values()) == 2  # one writer per holder pair
    assert sum(2 in ids for ids in shares.values()) == 1  # the plain tensor: once


def test_item_table_sees_kind_dtype_shape_and_sharding() -> None:
    a = item_table([item(0, 4)], [None])
    assert a == [[["t", "0"], "numpy", "float32", [16], False]]
    assert item_table([item(0, 4)], [(0,)]) != a
