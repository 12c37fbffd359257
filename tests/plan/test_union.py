"""plan.union: the union of per-rank tables and trees, and its errors (keys and ranks named)."""

from __future__ import annotations

import pytest

from shardsafe.plan.distribute import PlanError, plan_writers
from shardsafe.plan.union import merge_all, remap, union


def _row(path: str, shape: list[int], holders: list[int] | None, nbytes: int = 16,
         dtype: str = "float32") -> list:
    return [[path], "torch", dtype, shape, holders, nbytes]


def test_pipeline_stages_union_with_subset_holders() -> None:
    # ranks 0,1 = stage 0 (layer a), ranks 2,3 = stage 1 (layer b); a plain "step" per stage
    tables = [[_row("a", [4], [0]), _row("a.step", [], None, 4)],
              [_row("a", [4], [1]), _row("a.step", [], None, 4)],
              [_row("b", [4], [2]), _row("b.step", [], None, 4)],
              [_row("b", [4], [3]), _row("b.step", [], None, 4)]]
    u = union(tables)
    assert u.paths == [["a"], ["a.step"], ["b"], ["b.step"]]
    assert u.ids == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert u.plain_holders == {1: [0, 1], 3: [2, 3]}
    plan = plan_writers(4, u.reports)
    writers = {i: w for h, items, ws in plan.shared for i, w in zip(items, ws)}
    assert writers[1] in (0, 1) and writers[3] in (2, 3)


def test_disagreeing_dtype_or_shape_names_the_key_and_rank() -> None:
    with pytest.raises(PlanError, match=r"'w'.*rank 1"):
        union([[_row("w", [4], [0])], [_row("w", [5], [1])]])
    with pytest.raises(PlanError, match=r"'w'.*rank 1 has torch float64"):
        union([[_row("w", [4], None)], [_row("w", [4], None, dtype="float64")]])


def _tree(**kv: dict) -> dict:
    return {"t": "dict", "k": list(kv), "v": list(kv.values())}


def test_trees_merge_and_differing_plain_values_are_refused() -> None:
    t0 = _tree(model=_tree(a={"t": "tensor", "id": 0}), step={"t": "int", "v": 1})
    t1 = _tree(model=_tree(b={"t": "tensor", "id": 0}), step={"t": "int", "v": 1})
    merged = merge_all([t0, remap(t1, [1])])
    assert merged["k"] == ["model", "step"]
    assert merged["v"][0] == _tree(a={"t": "tensor", "id": 0}, b={"t": "tensor", "id": 1})
    t2 = _tree(step={"t": "int", "v": 2})
    with pytest.raises(PlanError, match=r"ranks 0 and 1 hold different values at key path 'step'.*PerRank"):
        merge_all([t0, t2])
