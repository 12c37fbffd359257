"""plan.collective.answer: rank 0's decisions (full, same, trees), each rank's share, and the
exchange at 1,024-16,384 synthetic ranks (rank 0's work timed; every box written once)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from plan_ranks import TXN, describe_rank, fsdp_rank, run, txn

from shardsafe.plan.collective.answer import (decide_first, decide_full, in_ranks, pack_ranks, read_hellos, read_share,
                                   wanted)
from shardsafe.plan.collective.report import EMPTY, NO_VALUES, OWN, PLAIN, Boxes, Values, hello, layout_digest, report, shape_of


def test_rank_ranges() -> None:
    assert pack_ranks([0, 1, 2, 5, 7, 8]) == [[0, 3], [5, 6], [7, 9]]
    assert [r for r in range(10) if in_ranks([[0, 3], [5, 6], [7, 9]], r)] == [0, 1, 2, 5, 7, 8]
    assert pack_ranks([]) == []


def test_a_repeat_save_is_answered_same_and_a_new_layout_full() -> None:
    ranks = [fsdp_rank(r, 3, [5, 6]) for r in range(3)]
    first = run(ranks)
    assert first.first["full"] and "plan" in first.decision
    again = run(ranks, first.leader)
    assert again.first == {"same": True, **TXN}
    ranks[2] = fsdp_rank(2, 3, [5, 7])  # rank 2's layout changed (and its rank 0 disagrees)
    ranks[2].kept = False
    changed = run(ranks, first.leader)
    assert changed.first == {"full": True, "shapes": [[2, 3]]}  # rank 0 holds the old shape


def _with_rng(rank: int, draws: int, step: int = 1) -> object:
    r = describe_rank(rank, {"w": np.ones(4), "step": step, "rng": {str(rank): {"n": draws, "s": np.full(2, rank)}}},
                      per_rank=["rng"])
    r.kept = True
    return r


def test_new_values_and_trees_travel_without_a_new_plan() -> None:
    ranks = [_with_rng(r, 1) for r in range(4)]
    for r in ranks:
        r.kept = False
    lead = run(ranks).leader
    ranks = [_with_rng(r, 2 if r in (1, 3) else 1) for r in range(4)]
    ex = run(ranks, lead)
    assert ex.first == {"trees": True, "shapes": [], "values": [[1, 2], [3, 4]]}
    assert ex.decision == {"same": True, **TXN}
    entries = lead.joined.tree["v"][2]["v"]
    assert [e["v"][0]["v"] for e in entries] == [1, 2, 1, 2]  # the new draws of ranks 1 and 3
    assert entries[3]["v"][1] == {"t": "tensor", "id": 4}  # ids kept
    ranks = [_with_rng(r, 2 if r in (1, 3) else 1, step=2) for r in range(4)]
    ex = run(ranks, lead)  # a plain value changed: one copy of the new shape
    assert ex.first == {"trees": True, "shapes": [[0, 1]], "values": []}
    assert lead.joined.tree["v"][1] == {"t": "int", "v": 2}


def test_an_error_of_any_rank_reaches_every_rank() -> None:
    ranks = [fsdp_rank(r, 2, [4]) for r in range(2)]
    hellos = read_hellos([hello(False, ranks[0].desc.layout, ranks[0].desc.shape.digest, NO_VALUES),
                          b"ETypeError: cannot save"], 2)
    assert decide_first(None, hellos, txn) == {"error": "rank 1 failed: TypeError: cannot save"}


# ----------------------------------------------------------------------------- scale
TENSORS = 1000


class Job:
    """Every rank of a synthetic job as columns (what ``boxes_of`` gives after localize)."""

    def __init__(self, world: int, tensors: int, boxes: Callable[[int], Boxes], sharded: bool = True) -> None:
        self.world = world
        rows = [[["model", f"w{t}"], "torch", "float32", [world * 4, 64], sharded] for t in range(tensors)]
        tree = {"t": "dict", "k": ["model"], "v": [{"t": "dict", "k": [f"w{t}" for t in range(tensors)],
                                                   "v": [{"t": "tensor", "id": t} for t in range(tensors)]}]}
        self.shape = shape_of(tree, rows)
        self.boxes = boxes

    def exchange(self) -> tuple[dict, dict[str, bytes]]:
        """Both rounds of a first save; returns the decision and the parts (rank 0's time is
        measured by ``python -m shardsafe.bench.scale``, not here)."""
        empty = Values(b"", b"", NO_VALUES)
        hellos_in = [hello(False, layout_digest(self.shape, self.boxes(r), empty), self.shape.digest, NO_VALUES)
                     for r in range(self.world)]
        reports = [report(r, self.boxes(r), self.shape.body if r == 0 else b"") for r in range(self.world)]
        hellos = read_hellos(iter(hellos_in), self.world)
        assert decide_first(None, hellos, txn)["shapes"] == [[0, 1]]
        decision, parts, lead = decide_full(None, hellos, iter(reports), txn)
        assert lead is not None, decision
        return decision, parts

    def shares(self, decision: dict, parts: dict[str, bytes]) -> list[set[int]]:
        """The global ids each rank writes (its share, read as the rank reads it)."""
        out = []
        for r in range(self.world):
            b = self.boxes(r)
            mine = {k: parts[k] for k in wanted(self.shape.digest, b)}
            s = read_share(decision, mine, r, self.shape.digest, b, 0)
            out.append(set(s.shape_gids[s.writes].tolist()))
        return out


def _fsdp(world: int, tensors: int) -> Job:
    nb = np.full(tensors, 4 * 64 * 4, dtype=np.int64)
    return Job(world, tensors, lambda r: Boxes(np.full(tensors, OWN, np.int32), nb, [], np.zeros(2 * tensors, np.int64)))


def _hsdp(world: int, tensors: int, replicas: int = 8) -> Job:
    """(Replicate, Shard) over replicas x shards: the ranks of one column hold one box."""
    shards = world // replicas
    nb = np.array([(256 << 10) + 4096 * (t % 5) for t in range(tensors)], dtype=np.int64)
    return Job(world, tensors, lambda r: Boxes(np.zeros(tensors, np.int32), nb,
                                               [tuple(r % shards + shards * k for k in range(replicas))],
                                               np.zeros(2 * tensors, np.int64)))


def _replicated(world: int, tensors: int) -> Job:
    nb = np.full(tensors, world * 4 * 64 * 4, dtype=np.int64)
    return Job(world, tensors, lambda r: Boxes(np.full(tensors, PLAIN, np.int32), nb, [], np.zeros(2 * tensors, np.int64)),
               sharded=False)


@pytest.mark.parametrize("make", [_fsdp, _hsdp, _replicated], ids=["fsdp", "hsdp-8x128", "replicated"])
def test_rank0_plans_1024_ranks_by_1000_tensors(make: Callable[[int, int], Job]) -> None:
    job = make(1024, TENSORS)
    decision, parts = job.exchange()
    shares = job.shares(decision, parts)
    if make is _fsdp:  # every rank writes its own shards, the plan assigns nothing
        assert all(s == set(range(TENSORS)) for s in shares)
        return
    # every box has exactly one writer among its holders
    boxes = TENSORS * (128 if make is _hsdp else 1)
    assert sum(map(len, shares)) == boxes
    if make is _hsdp:
        for col in range(128):
            holders = [col + 128 * k for k in range(8)]
            assert set().union(*(shares[h] for h in holders)) == set(range(TENSORS))
            assert sum(len(shares[h]) for h in holders) == TENSORS
    else:
        assert set().union(*shares) == set(range(TENSORS))
    loads = [len(s) for s in shares]  # equal-size boxes: balanced within one box
    assert max(loads) - min(loads) <= 1


def test_rank0_work_grows_with_ranks_not_with_their_product() -> None:
    # 16,384 ranks of 10 tensors: the per-rank part of rank 0's work is tiny
    job = _fsdp(16384, 10)
    decision, parts = job.exchange()
    assert sum(map(len, parts.values())) < 200  # one shape part: no per-rank answer
    assert job.shares(decision, parts)[16383] == set(range(10))
    empty = Boxes(np.full(10, EMPTY, np.int32), np.zeros(10, np.int64), [], np.zeros(20, np.int64))
    assert read_share(decision, parts, 5, job.shape.digest, empty, 0).writes.tolist() == []


@pytest.mark.parametrize("make, world, tensors", [(_fsdp, 4096, 10), (_hsdp, 1024, 300)],
                         ids=["fsdp-4096", "hsdp-1024"])
def test_rank0_memory_grows_with_the_plan_not_with_the_reports(make: Callable[[int, int], Job], world: int,
                                                               tensors: int) -> None:
    """Rank 0 reads one report at a time: what it allocates while planning is a few words per
    rank and per shared box (a JSON row per rank and tensor would be ~100 bytes each)."""
    import tracemalloc

    job = make(world, tensors)
    empty = Values(b"", b"", NO_VALUES)
    hellos_in = [hello(False, layout_digest(job.shape, job.boxes(r), empty), job.shape.digest, NO_VALUES)
                 for r in range(world)]
    reports = (report(r, job.boxes(r), job.shape.body if r == 0 else b"") for r in range(world))
    tracemalloc.start()
    try:
        hellos = read_hellos(iter(hellos_in), world)
        decision, parts, lead = decide_full(None, hellos, reports, txn)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert lead is not None
    boxes = sum(len(items) for _, items, _ in lead.joined.plan.shared)
    assert peak < 128 * boxes + 400 * world + 4 * len(job.shape.body) + (1 << 20), (peak, boxes)
