"""Who writes what in a collective save: a pure planner over plain data.

Rank 0 describes every rank's boxes (``RankReport``) after joining the ranks' reports
(``plan.collective.union``) and runs ``plan_writers``. Two kinds of data exist:

* a box only one rank holds (an FSDP shard, a plain tensor of one pipeline rank): that
  rank writes it; no decision is needed, so it is reported only as a byte count
  (``own_bytes``);
* boxes a set of ranks hold identically (a DTensor replicated along a mesh dimension,
  a plain tensor every rank of some pipeline stages holds): the lowest holder reports
  them once as ``SharedBoxes``. A rank holds at most one box of each item, so
  ``(holders, item)`` names a box.

Boxes are assigned by greedy LPT (largest first, to the holder with the fewest bytes
so far), the holder sets with the most members first. Starting from the fixed loads,
this keeps the largest rank within a few percent of the mean whenever the boxes are
small next to a rank's share; when they are not (fewer large tensors than ranks), no
plan can do better than one tensor per rank, and LPT finds that.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SharedBoxes:
    """Boxes held identically by the same set of ranks; each gets one writer.

    Attributes:
        holders: The ranks holding them, sorted (at least two).
        items: Item ids (position in the state's tensor table), one box each, distinct
            (a sequence or an int64 array).
        nbytes: Size of each box, aligned with ``items``.
    """

    holders: tuple[int, ...]
    items: Sequence[int] | np.ndarray
    nbytes: Sequence[int] | np.ndarray


@dataclass(frozen=True, slots=True)
class RankReport:
    """What rank 0 knows of one rank when it plans.

    Attributes:
        rank: The rank.
        own_bytes: Bytes of the boxes only this rank holds (it writes them).
        led: Shared boxes whose lowest holder is this rank.
    """

    rank: int
    own_bytes: int
    led: tuple[SharedBoxes, ...] = ()


@dataclass(frozen=True, slots=True)
class WriterPlan:
    """The planner's answer.

    Attributes:
        shared: For each holder set, the writer of each of its boxes (aligned with the
            reported ``items``), as ``(holders, items, writers)`` triples (int64 arrays).
        loads: Bytes each rank will write.
    """

    shared: tuple[tuple[tuple[int, ...], np.ndarray, np.ndarray], ...]
    loads: tuple[int, ...]

    def imbalance(self) -> float:
        """Largest load over the mean load (1.0 is perfect; 0.0 when nothing is written)."""
        total = sum(self.loads)
        return max(self.loads) * len(self.loads) / total if total else 0.0


class PlanError(ValueError):
    """The ranks' reports are inconsistent (contradicting states, impossible holders)."""


def _check(world_size: int, reports: Sequence[RankReport]) -> None:
    if len(reports) != world_size or any(r.rank != i for i, r in enumerate(reports)):
        raise PlanError(f"expected one report per rank 0..{world_size - 1}")
    seen: set[tuple[int, ...]] = set()
    for r in reports:
        for g in r.led:
            h = g.holders
            if len(h) < 2 or h[0] != r.rank or h[-1] >= world_size or list(h) != sorted(set(h)):
                raise PlanError(f"rank {r.rank} reports holders {list(h)[:8]}: holders must be "
                                f"sorted distinct ranks below {world_size}, led by the reporter")
            if h in seen:
                raise PlanError(f"holder set {list(h)[:8]} was reported twice")
            if len(g.items) != len(g.nbytes) or len(np.unique(np.asarray(g.items))) != len(g.items):
                raise PlanError(f"holder set {list(h)[:8]}: items must be distinct, one size each")
            seen.add(h)


def _lpt_within(holders: tuple[int, ...], nbytes: np.ndarray, loads: list[int]) -> np.ndarray:
    """Writers for boxes held by ``holders`` (greedy LPT); updates ``loads``."""
    heap = [(loads[h], h) for h in holders]
    heapq.heapify(heap)
    order = np.argsort(-nbytes, kind="stable")  # largest first; ties in reported order
    chosen = []
    for n in nbytes[order].tolist():
        load, h = heap[0]
        chosen.append(h)
        heapq.heapreplace(heap, (load + n, h))
    for load, h in heap:
        loads[h] = load
    writers = np.empty(len(nbytes), dtype=np.int64)
    writers[order] = chosen
    return writers


def plan_writers(world_size: int, reports: Sequence[RankReport]) -> WriterPlan:
    """Chooses one writer for every shared box, balancing bytes across ranks.

    Args:
        world_size: Number of ranks.
        reports: One report per rank, in rank order.

    Raises:
        PlanError: the reports name impossible holders.
    """
    _check(world_size, reports)
    loads = [r.own_bytes for r in reports]
    groups = [g for r in reports for g in r.led]
    # larger holder sets first: they have the most freedom left to fix imbalance later
    groups.sort(key=lambda g: -len(g.holders))
    shared = []
    for g in groups:
        nbytes = np.asarray(g.nbytes, dtype=np.int64)
        shared.append((g.holders, np.asarray(g.items, dtype=np.int64), _lpt_within(g.holders, nbytes, loads)))
    return WriterPlan(tuple(shared), tuple(loads))
