"""This rank's box of every DTensor of a state, and which ranks hold the same box.

``localize`` turns DTensor items into this rank's box (local tensor, offsets) and
records who else holds that very box. A holder tuple per item means:

* ``None``: a plain tensor, held by every rank that has its key path (the replicated
  convention, restricted to those ranks);
* ``()``: an empty box (uneven sharding left this rank nothing): nothing to write;
* ``(rank,)``: only this rank holds the box; it writes it;
* ``(a, b, ...)``: these ranks hold identical boxes; the planner picks one writer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .. import dtensor
from ..format.tree import render_path
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
