"""Who writes what in a distributed save: a pure planner over plain data.

Every rank describes what it holds (``RankReport``); rank 0 runs ``plan_writers`` on
the gathered reports and broadcasts the result. Three kinds of data exist:

* a box only one rank holds (an FSDP shard): that rank writes it; no decision is
  needed, so it is reported only as a byte count (``own_bytes``);
* boxes a set of ranks hold identically (a DTensor replicated along a mesh
  dimension): the lowest holder reports them once as ``SharedBoxes``. A rank holds at
  most one box of each item, so ``(holders, item)`` names a box;
* plain tensors (and arrays): every rank is assumed to hold the same value (the
  replicated convention of DDP and DCP); rank 0 lists them as ``everywhere`` items.

Boxes are assigned by greedy LPT (largest first, to the holder with the fewest bytes
so far), first within each holder set, then the ``everywhere`` items over all ranks
from a heap. Starting from the fixed loads, this keeps the largest rank within a few
percent of the mean whenever the boxes are small next to a rank's share; when they
are not (fewer large tensors than ranks), no plan can do better than one tensor per
rank, and LPT finds that. Reports and plans are flat integer lists, so 1,024 ranks x
1,000 tensors plan in well under a second.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SharedBoxes:
    """Boxes held identically by the same set of ranks; each gets one writer.

    Attributes:
        holders: The ranks holding them, sorted (at least two).
        items: Item ids (position in the state's tensor table), one box each, ascending.
        nbytes: Size of each box, aligned with ``items``.
    """

    holders: tuple[int, ...]
    items: tuple[int, ...]
    nbytes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RankReport:
    """What one rank tells the planner.

    Attributes:
        rank: The reporting rank.
        digest: Digest of the rank's item table (key paths, dtypes, global shapes); all
            ranks must agree, or they are not saving the same state.
        own_bytes: Bytes of the boxes only this rank holds (it writes them).
        led: Shared boxes whose lowest holder is this rank.
    """

    rank: int
    digest: str
    own_bytes: int
    led: tuple[SharedBoxes, ...] = ()


@dataclass(frozen=True, slots=True)
class WriterPlan:
    """The planner's answer.

    Attributes:
        shared: For each holder set, the writer of each of its boxes (aligned with the
            reported ``items``), as ``(holders, items, writers)`` triples.
        everywhere: ``(items, writers)`` for the plain tensors every rank holds.
        loads: Bytes each rank will write.
    """

    shared: tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...]
    everywhere: tuple[tuple[int, ...], tuple[int, ...]]
    loads: tuple[int, ...]

    def items_written_by(self, rank: int) -> set[int]:
        """Item ids of the shared and everywhere boxes that ``rank`` writes."""
        out = {i for i, w in zip(*self.everywhere) if w == rank}
        for holders, items, writers in self.shared:
            if holders[0] <= rank <= holders[-1] and rank in holders:
                out.update(i for i, w in zip(items, writers) if w == rank)
        return out

    def imbalance(self) -> float:
        """Largest load over the mean load (1.0 is perfect; 0.0 when nothing is written)."""
        total = sum(self.loads)
        return max(self.loads) * len(self.loads) / total if total else 0.0


class PlanError(ValueError):
    """The ranks' reports are inconsistent (different states, bad holders)."""


def table_digest(rows: Iterable[Sequence[object]]) -> str:
    """A digest of an item table given as JSON-able rows (same rows -> same digest)."""
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, separators=(",", ":")).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()[:32]


def _check(world_size: int, reports: Sequence[RankReport]) -> None:
    if len(reports) != world_size or any(r.rank != i for i, r in enumerate(reports)):
        raise PlanError(f"expected one report per rank 0..{world_size - 1}")
    bad = [r.rank for r in reports if r.digest != reports[0].digest]
    if bad:
        raise PlanError(f"rank(s) {bad[:16]} hold a different state than rank 0 (key paths, dtypes "
                        f"or global shapes differ); every rank must save the same structure")
    seen: set[tuple[int, ...]] = set()
    for r in reports:
        for g in r.led:
            h = g.holders
            if len(h) < 2 or h[0] != r.rank or h[-1] >= world_size or list(h) != sorted(set(h)):
                raise PlanError(f"rank {r.rank} reports holders {list(h)[:8]}: holders must be "
                                f"sorted distinct ranks below {world_size}, led by the reporter")
            if h in seen:
                raise PlanError(f"holder set {list(h)[:8]} was reported twice")
            if len(g.items) != len(g.nbytes) or len(set(g.items)) != len(g.items):
                raise PlanError(f"holder set {list(h)[:8]}: items must be distinct, one size each")
            seen.add(h)


def _lpt_within(holders: tuple[int, ...], nbytes: Sequence[int], loads: list[int]) -> list[int]:
    """Writers for boxes held by ``holders`` (greedy LPT); updates ``loads``."""
    heap = [(loads[h], h) for h in holders]
    heapq.heapify(heap)
    writers = [0] * len(nbytes)
    for i in sorted(range(len(nbytes)), key=lambda i: -nbytes[i]):
        load, h = heap[0]
        writers[i] = h
        heapq.heapreplace(heap, (load + nbytes[i], h))
    for load, h in heap:
        loads[h] = load
    return writers


def plan_writers(world_size: int, reports: Sequence[RankReport],
                 everywhere: Sequence[tuple[int, int]] = ()) -> WriterPlan:
    """Chooses one writer for every shared box, balancing bytes across ranks.

    Args:
        world_size: Number of ranks.
        reports: One report per rank, in rank order.
        everywhere: ``(item, nbytes)`` of the plain tensors every rank holds.

    Raises:
        PlanError: the reports disagree on the state or name impossible holders.
    """
    _check(world_size, reports)
    loads = [r.own_bytes for r in reports]
    groups = [g for r in reports for g in r.led]
    # larger holder sets first: they have the most freedom left to fix imbalance later
    groups.sort(key=lambda g: -len(g.holders))
    shared = tuple((g.holders, g.items, tuple(_lpt_within(g.holders, g.nbytes, loads)))
                   for g in groups)
    items = tuple(i for i, _ in everywhere)
    writers = [0] * len(everywhere)
    heap = [(load, r) for r, load in enumerate(loads)]
    heapq.heapify(heap)
    for k in sorted(range(len(everywhere)), key=lambda k: (-everywhere[k][1], everywhere[k][0])):
        load, r = heap[0]
        writers[k] = r
        heapq.heapreplace(heap, (load + everywhere[k][1], r))
    for load, r in heap:
        loads[r] = load
    return WriterPlan(shared, (items, tuple(writers)), tuple(loads))


# ----------------------------------------------------------------------------- wire format
# Reports and plans travel between ranks as JSON of flat integer lists (never pickle).


def encode_report(r: RankReport) -> bytes:
    """Bytes of a report, for ``Comm.gather``."""
    led = [[list(g.holders), list(g.items), list(g.nbytes)] for g in r.led]
    return json.dumps([r.rank, r.digest, r.own_bytes, led], separators=(",", ":")).encode("utf-8")


def decode_report(data: bytes) -> RankReport:
    """Inverse of ``encode_report``.

    Raises:
        PlanError: the bytes are not a report.
    """
    try:
        rank, digest, own, led = json.loads(data.decode("utf-8"))
        groups = tuple(SharedBoxes(tuple(map(int, h)), tuple(map(int, i)), tuple(map(int, n)))
                       for h, i, n in led)
        return RankReport(int(rank), str(digest), int(own), groups)
    except (ValueError, TypeError) as e:
        raise PlanError(f"malformed rank report: {e}") from None


def encode_plan(plan: WriterPlan) -> bytes:
    """Bytes of a plan, for ``Comm.broadcast``."""
    body = {"s": [[list(h), list(i), list(w)] for h, i, w in plan.shared],
            "e": [list(plan.everywhere[0]), list(plan.everywhere[1])], "l": list(plan.loads)}
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def decode_plan(data: bytes) -> WriterPlan:
    """Inverse of ``encode_plan``.

    Raises:
        PlanError: the bytes are not a plan.
    """
    try:
        body = json.loads(data.decode("utf-8"))
        shared = tuple((tuple(h), tuple(i), tuple(w)) for h, i, w in body["s"])
        return WriterPlan(shared, (tuple(body["e"][0]), tuple(body["e"][1])), tuple(body["l"]))
    except (ValueError, TypeError, KeyError) as e:
        raise PlanError(f"malformed plan: {e}") from None
