"""Synthetic ranks for the planning tests, described and answered by the real functions.

``describe_rank`` flattens a numpy state with ``plan.flatten`` and describes it with
``plan.collective.report.describe``; holders of DTensor-like boxes are given per key path (what
``localize`` returns for a DTensor). ``run`` plays one planning exchange in this
process: rank 0's ``read_hellos``/``decide_first``/``decide_full``/``decide_trees`` over
every rank's real messages, and every rank's ``read_share``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardsafe.format.tree import Node, render_path
from shardsafe.plan.collective.answer import (Leader, Share, decide_first, decide_full, decide_trees, in_ranks,
                                   read_hellos, read_share, wanted)
from shardsafe.plan.flatten import TensorItem, flatten
from shardsafe.plan.collective.report import PER_RANK_CLASS, Description, describe, hello, report

TXN = {"token": "t0", "workdir": "/w", "replace": False}


def txn() -> dict[str, Any]:
    return dict(TXN)


@dataclass
class Rank:
    """One synthetic rank: its items (global ids set after a plan) and description."""

    rank: int
    tree: Node
    items: list[TensorItem]
    desc: Description
    share: Share | None = None
    kept: bool = False

    def written(self) -> list[tuple[Any, tuple[int, ...]]]:
        """(key path, offsets) of the boxes this rank writes under its share."""
        assert self.share is not None
        d = self.desc
        out = [(self.items[d.parts.shape_ids[p]].path, self.items[d.parts.shape_ids[p]].offsets)
               for p in self.share.writes.tolist()]
        return out + [(self.items[i].path, self.items[i].offsets) for i in d.parts.value_ids]


Box = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def describe_rank(rank: int, state: Mapping[str, Any], boxes: Mapping[str, Box] = {},
                  per_rank: Sequence[str] = ()) -> Rank:
    """Rank ``rank`` holding ``state`` (numpy leaves). ``boxes``: rendered key path ->
    (holders, offsets, global shape) of a DTensor box (its value is the local box; ``()``
    holders: an empty box);
    ``per_rank``: top-level keys that are PerRank nodes (their dict is ``{str(rank): ...}``)."""
    tree, items = flatten(state)
    for node_key in per_rank:
        tree["v"][tree["k"].index(node_key)]["cls"] = PER_RANK_CLASS
    holders: list[Any] = []
    for it in items:
        name = render_path(it.path)
        if name in boxes:
            h, off, shape = boxes[name]
            it.offsets, it.shape, it.replicated = off, shape, False
            holders.append(tuple(h))
        else:
            holders.append(None)
    return Rank(rank, tree, items, describe(tree, items, holders, rank))


@dataclass
class Exchange:
    """The outcome of one simulated planning exchange."""

    first: dict[str, Any]
    decision: dict[str, Any]
    parts: dict[str, bytes] = field(default_factory=dict)
    leader: Leader | None = None


def run(ranks: Sequence[Rank], lead: Leader | None = None) -> Exchange:
    """One planning exchange of ``ranks``; sets each rank's ``share`` after a full round."""
    world = len(ranks)
    hellos = read_hellos((hello(r.kept, r.desc.layout, r.desc.shape.digest, r.desc.values.digest)
                          for r in ranks), world)
    first = decide_first(lead, hellos, txn)
    if first.get("full"):
        msgs = (report(r.rank, r.desc.boxes, r.desc.shape.body if in_ranks(first["shapes"], r.rank) else b"",
                       r.desc.values.body) for r in ranks)
        decision, parts, new = decide_full(lead, hellos, msgs, txn)
        if "plan" in decision:
            for r in ranks:
                mine = {k: parts[k] for k in wanted(r.desc.shape.digest, r.desc.boxes) if k in parts}
                r.share = read_share(decision, mine, r.rank, r.desc.shape.digest, r.desc.boxes,
                                     len(r.desc.parts.value_ids))
                r.kept = True
        return Exchange(first, decision, parts, new)
    if first.get("trees"):
        assert lead is not None
        msgs = (report(r.rank, None, r.desc.shape.body if in_ranks(first["shapes"], r.rank) else b"",
                       r.desc.values.body if in_ranks(first["values"], r.rank) else b"") for r in ranks)
        return Exchange(first, decide_trees(lead, hellos, msgs, txn), {}, lead)
    return Exchange(first, first, {}, lead)


def fsdp_rank(rank: int, world: int, rows: Sequence[int], cols: int = 4) -> Rank:
    """Rank ``rank`` of an FSDP job: tensor ``w<t>`` of ``rows[t]`` rows split along dim 0."""
    state: dict[str, Any] = {}
    boxes = {}
    for t, n in enumerate(rows):
        step = -(-n // world)
        lo, hi = min(rank * step, n), min(rank * step + step, n)
        state[f"w{t}"] = np.full((hi - lo, cols), float(rank), dtype=np.float32)
        boxes[f"w{t}"] = ((rank,) if hi > lo else (), (lo, 0), (n, cols))
    return describe_rank(rank, {"model": state}, {f"model.{k}": v for k, v in boxes.items()})
