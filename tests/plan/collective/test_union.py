"""plan.collective.union: rank 0 joins the ranks' reports (tensor table, trees, holders); errors name
the key path and the ranks. Ranks are described and answered by the real functions."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from plan_ranks import describe_rank, fsdp_rank, run

from shardsafe.plan.collective.report import renumber
from shardsafe.plan.collective.union import merge_all


def _stage(rank: int, stage: int, step: int = 3) -> object:
    """Pipeline stage ``stage`` on 2 FSDP ranks: layer ``l<stage>`` sharded, a plain tensor
    per stage, a plain tensor every stage holds, the same plain ``step``."""
    local = rank % 2
    state = {"layers": {f"l{stage}": np.full((2, 4), float(rank), np.float32)},
             "bias": {f"b{stage}": np.full(3, float(stage))}, "lr": np.ones(2), "step": step}
    boxes = {f"layers.l{stage}": ((rank,), (2 * local, 0), (4, 4))}
    return describe_rank(rank, state, boxes)


def test_pipeline_stages_join_into_one_table_and_tree() -> None:
    ranks = [_stage(r, r // 2) for r in range(4)]
    ex = run(ranks)
    assert ex.first["shapes"] == [[0, 1], [2, 3]]  # one copy per stage's shape
    j = ex.leader.joined
    assert [p for p in j.table.paths] == [["layers", "l0"], ["bias", "b0"], ["lr"], ["layers", "l1"], ["bias", "b1"]]
    assert j.tree["k"] == ["layers", "bias", "lr", "step"]
    assert j.tree["v"][0]["k"] == ["l0", "l1"]
    # plain tensors: one writer among their holders; each box written exactly once
    writes = Counter((r.rank, tuple(p)) for r in ranks for p, _ in r.written())
    by_path = Counter(p for _, p in writes)
    assert by_path == Counter({("layers", "l0"): 2, ("layers", "l1"): 2, ("bias", "b0"): 1, ("bias", "b1"): 1,
                               ("lr",): 1})
    assert next(r for r, p in writes if p == ("bias", "b0")) in (0, 1)
    assert next(r for r, p in writes if p == ("bias", "b1")) in (2, 3)
    assert [r.share.shape_gids.tolist() for r in ranks] == [[0, 1, 2], [0, 1, 2], [3, 4, 2], [3, 4, 2]]


def test_disagreeing_dtype_or_shape_names_the_key_and_ranks() -> None:
    a = describe_rank(0, {"w": np.ones(4, np.float32)})
    b = describe_rank(1, {"w": np.ones(5, np.float32)})
    ex = run([a, b])
    assert "'w'" in ex.decision["error"] and "rank 1 has numpy float32 of global shape [5]" in ex.decision["error"]
    c = describe_rank(1, {"w": np.ones(4, np.float64)})
    assert "rank 1 has numpy float64" in run([a, c]).decision["error"]


def test_a_dtensor_and_a_plain_tensor_at_one_path_are_refused() -> None:
    a = describe_rank(0, {"w": np.ones(2)}, {"w": ((0,), (0,), (4,))})
    b = describe_rank(1, {"w": np.ones(4)})
    assert "ranks 0 and 1 disagree on tensor 'w': a DTensor" in run([a, b]).decision["error"]


def test_differing_plain_values_are_refused_naming_the_ranks() -> None:
    ranks = [_stage(0, 0), _stage(1, 0), _stage(2, 1, step=4), _stage(3, 1, step=4)]
    err = run(ranks).decision["error"]
    assert "ranks 0 and 2 hold different values at key path 'step'" in err and "PerRank" in err


def _with_rng(rank: int, draws: int = 1) -> object:
    return describe_rank(rank, {"w": np.ones(4), "rng": {str(rank): {"n": draws, "s": np.full(2, rank)}}},
                         per_rank=["rng"])


def test_per_rank_values_reach_rank_0_under_each_rank_key() -> None:
    ranks = [_with_rng(r) for r in range(3)]
    ex = run(ranks)
    assert ex.first["shapes"] == [[0, 1]]  # equal shapes: one copy
    rng = ex.leader.joined.tree["v"][1]
    assert rng["k"] == ["0", "1", "2"]
    assert [v["v"][1] for v in rng["v"]] == [{"t": "tensor", "id": 1}, {"t": "tensor", "id": 2},
                                             {"t": "tensor", "id": 3}]
    assert [p for p in ex.leader.joined.table.paths[1:]] == [["rng", "0", "s"], ["rng", "1", "s"], ["rng", "2", "s"]]
    for r in ranks:  # each rank writes its own PerRank tensor; one rank writes the plain "w"
        assert r.share.value_gids.tolist() == [1 + r.rank]
    assert sum(len(r.share.writes) for r in ranks) == 1


def test_two_ranks_with_one_per_rank_key_are_refused() -> None:
    a = describe_rank(0, {"rng": {"0": {"n": 1}}}, per_rank=["rng"])
    b = describe_rank(1, {"rng": {"0": {"n": 2}}}, per_rank=["rng"])
    assert "two ranks (rank 1 and rank 0) hold PerRank entry '0'" in run([a, b]).decision["error"]


def test_uneven_fsdp_leaves_empty_boxes_unwritten() -> None:
    ranks = [fsdp_rank(r, 4, [7, 3]) for r in range(4)]  # 3 rows over 4 ranks: rank 3 has none of w1
    run(ranks)
    assert [len(r.written()) for r in ranks] == [2, 2, 2, 1]


def test_merge_trees_directly() -> None:
    def tree(**kv: dict) -> dict:
        return {"t": "dict", "k": list(kv), "v": list(kv.values())}

    t0 = tree(model=tree(a={"t": "tensor", "id": 0}), step={"t": "int", "v": 1})
    t1 = tree(model=tree(b={"t": "tensor", "id": 0}), step={"t": "int", "v": 1})
    merged = merge_all([t0, renumber(t1, [1])], [0, 5])
    assert merged["k"] == ["model", "step"]
    assert merged["v"][0] == tree(a={"t": "tensor", "id": 0}, b={"t": "tensor", "id": 1})
    with pytest.raises(ValueError, match=r"ranks 0 and 5 hold different values at key path 'step'"):
        merge_all([t0, tree(step={"t": "int", "v": 2})], [0, 5])
