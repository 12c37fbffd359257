"""Per-rank view of a distributed save: which boxes a rank holds, reports, and its share.

``localize`` turns DTensor items into this rank's box (local tensor, offsets) and
records who else holds the same box; the rest is pure bookkeeping between the items
and the planner in ``plan.distribute``.

A holder tuple per item means:

* ``None``: a plain tensor, which every rank holds (replicated convention);
* ``()``: an empty box (uneven sharding left this rank nothing): nothing to write;
* ``(rank,)``: only this rank holds the box; it writes it;
* ``(a, b, ...)``: these ranks hold identical boxes; the planner picks one writer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .. import dtensor
from ..format.tree import render_path
from .distribute import RankReport, SharedBoxes, WriterPlan, table_digest
from .flatten import TensorItem

Holders = tuple[int, ...] | None


def localize(items: Sequence[TensorItem], group_rank: Callable[[int], int]) -> list[Holders]:
    """Replaces each DTensor item's value by this rank's box; returns the holders per item.

    Args:
        items: Flattened items; DTensor items are modified in place (``value`` becomes
            the local tensor, ``offsets`` its position, ``replicated`` False).
        group_rank: Maps a default-group rank to a rank of the saving group (-1 if absent).

    Raises:
        TypeError: a DTensor cannot be saved (Partial placement, mesh outside the group).
    """
    out: list[Holders] = []
    for it in items:
        if not dtensor.is_dtensor(it.value):
            out.append(None)
            continue
        key = render_path(it.path)
        box = dtensor.local_shard(it.value, key)
        holders = tuple(sorted(group_rank(h) for h in box.holders))
        if holders and holders[0] < 0:
            raise TypeError(f"DTensor at key path {key!r} lives on a device mesh with ranks outside "
                            f"the process group that saves it")
        it.value, it.offsets, it.replicated = box.local, box.offsets, False
        out.append(holders if box.numel else ())
    return out


def item_table(items: Sequence[TensorItem], holders: Sequence[Holders]) -> list[list[object]]:
    """The rows every rank must agree on: key path, kind, dtype, global shape, sharded."""
    return [[list(it.path), it.kind, it.dtype, list(it.shape), h is not None]
            for it, h in zip(items, holders)]


def make_report(rank: int, items: Sequence[TensorItem], holders: Sequence[Holders]) -> RankReport:
    """This rank's report for the planner."""
    own = 0
    led: dict[tuple[int, ...], list[TensorItem]] = {}
    for it, h in zip(items, holders):
        if h is None or not h:
            continue
        if h == (rank,):
            own += it.nbytes
        elif h[0] == rank:
            led.setdefault(h, []).append(it)
    groups = tuple(SharedBoxes(h, tuple(it.id for it in its), tuple(it.nbytes for it in its))
                   for h, its in sorted(led.items()))
    return RankReport(rank, table_digest(item_table(items, holders)), own, groups)


def everywhere(items: Sequence[TensorItem], holders: Sequence[Holders]) -> list[tuple[int, int]]:
    """``(item id, nbytes)`` of the plain tensors, which every rank holds."""
    return [(it.id, it.nbytes) for it, h in zip(items, holders) if h is None]


def my_share(plan: WriterPlan, rank: int, items: Sequence[TensorItem],
             holders: Sequence[Holders]) -> list[TensorItem]:
    """The items this rank writes under ``plan`` (in item order)."""
    chosen = plan.items_written_by(rank)
    return [it for it, h in zip(items, holders)
            if (h is not None and h == (rank,)) or ((h is None or len(h) > 1) and it.id in chosen)]
