"""States that differ per rank: the union of every rank's items and structure tree.

Pipeline stages hold different key paths, keys may be held by a subset of ranks (one
stage's replicas), and DTensors may live on sub-meshes. Each rank describes its tensors
as ``rows`` (key path, kind, dtype, global shape, holders of its box, box bytes); rank 0
merges them (``union``) into one table with global ids, the holders of every box and
one ``RankReport`` per rank for ``plan.distribute``, and merges the structure trees
(``merge_trees``). Everything here is pure and names keys and ranks in its errors.

Holders of a row: a DTensor box lists the ranks holding it (``localize``); a plain
tensor (``None``) is held by every rank that has its key path (the replicated
convention, restricted to those ranks).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..format.tree import Node, decode_key_path, encode_key_path, render_path
from .distribute import PlanError, RankReport, SharedBoxes
from .flatten import TensorItem

Row = list[Any]  # [key path (JSON), kind, dtype, shape, holders or None, nbytes]


def rows_of(items: Sequence[TensorItem], holders: Sequence[tuple[int, ...] | None]) -> list[Row]:
    """This rank's rows (one per tensor item, item order)."""
    return [[encode_key_path(it.path), it.kind, it.dtype, list(it.shape),
             None if h is None else list(h), it.nbytes] for it, h in zip(items, holders)]


def path_key(encoded_path: Any) -> str:
    """A hashable name of an encoded key path."""
    return json.dumps(encoded_path, separators=(",", ":"))


@dataclass(slots=True)
class Union:
    """The merged table (rank 0).

    Attributes:
        paths: Encoded key path of every global item (global id = position).
        meta: ``(kind, dtype, shape)`` of every global item.
        ids: For each rank, its local item id -> global id.
        reports: One report per rank for ``plan.distribute.plan_writers``.
        plain_holders: Global id -> ranks holding that plain tensor.
    """

    paths: list[Any] = field(default_factory=list)
    meta: list[tuple[str, str, list[int]]] = field(default_factory=list)
    ids: list[list[int]] = field(default_factory=list)
    reports: list[RankReport] = field(default_factory=list)
    plain_holders: dict[int, list[int]] = field(default_factory=dict)


def _assign(u: Union, by_path: dict[str, int], rank: int, row: Row) -> int:
    """The global id of ``row`` (new or existing); checks kind, dtype and shape agree."""
    name = path_key(row[0])
    gid = by_path.get(name)
    meta = (row[1], row[2], list(row[3]))
    if gid is None:
        gid = by_path[name] = len(u.paths)
        u.paths.append(row[0])
        u.meta.append(meta)
        return gid
    if u.meta[gid] != meta:
        shown = render_path(decode_key_path(row[0]))
        raise PlanError(f"ranks disagree on tensor {shown!r}: rank {rank} has {meta[0]} {meta[1]} "
                        f"of global shape {meta[2]}, an earlier rank {u.meta[gid][0]} "
                        f"{u.meta[gid][1]} of global shape {u.meta[gid][2]}")
    return gid


def union(tables: Sequence[Sequence[Row]]) -> Union:
    """Merges every rank's rows (rank order) into one table and the planner's reports.

    Raises:
        PlanError: ranks disagree on a key's kind, dtype or global shape.
    """
    u = Union()
    by_path: dict[str, int] = {}
    for rank, rows in enumerate(tables):
        u.ids.append([_assign(u, by_path, rank, row) for row in rows])
    for rank, rows in enumerate(tables):
        for row, gid in zip(rows, u.ids[rank]):
            if row[4] is None:
                u.plain_holders.setdefault(gid, []).append(rank)
    for rank, rows in enumerate(tables):
        own, led = 0, {}
        for row, gid in zip(rows, u.ids[rank]):
            h = tuple(row[4]) if row[4] is not None else tuple(u.plain_holders[gid])
            if h == (rank,):
                own += int(row[5])
            elif len(h) > 1 and h[0] == rank:
                led.setdefault(h, []).append((gid, int(row[5])))
        groups = tuple(SharedBoxes(h, tuple(g for g, _ in bs), tuple(n for _, n in bs))
                       for h, bs in sorted(led.items()))
        u.reports.append(RankReport(rank, "", own, groups))
    return u


def _differs(path: tuple[Any, ...], ranks: tuple[int, int], what: str) -> PlanError:
    return PlanError(f"ranks {ranks[0]} and {ranks[1]} hold different {what} at key path "
                     f"{render_path(path)!r}; values that differ per rank must be wrapped in "
                     f"shardsafe.PerRank")


def remap(node: Node, ids: Sequence[int]) -> Node:
    """A copy of ``node`` whose tensor and alias ids are mapped through ``ids``."""
    t = node.get("t")
    if t in ("tensor", "alias"):
        return {**node, "id": ids[node["id"]]}
    if t in ("dict", "namespace", "list", "tuple") and isinstance(node.get("v"), list):
        return {**node, "v": [remap(v, ids) for v in node["v"]]}
    return node


def merge_trees(a: Node, b: Node, ranks: tuple[int, int], path: tuple[Any, ...] = ()) -> Node:
    """The union of two (remapped) structure trees; ``ranks`` name their owners in errors.

    Dicts and namespaces merge key by key (``a``'s order first); lists and tuples
    position by position (they must have the same length); anything else must be equal.

    Raises:
        PlanError: the trees hold different plain values or containers at one key path.
    """
    t = a.get("t")
    if t != b.get("t"):
        raise _differs(path, ranks, f"kinds of value ({t} and {b.get('t')})")
    if t in ("dict", "namespace"):
        if a.get("cls") != b.get("cls"):
            raise _differs(path, ranks, "classes of state")
        keys = list(a["k"])
        vals = list(a["v"])
        where = {json.dumps(k): i for i, k in enumerate(keys)}
        for k, v in zip(b["k"], b["v"]):
            i = where.get(json.dumps(k))
            if i is None:
                keys.append(k)
                vals.append(v)
            else:
                vals[i] = merge_trees(vals[i], v, ranks, path + (k,))
        return {**a, "k": keys, "v": vals}
    if t in ("list", "tuple"):
        if len(a["v"]) != len(b["v"]):
            raise _differs(path, ranks, f"{t} lengths ({len(a['v'])} and {len(b['v'])})")
        return {**a, "v": [merge_trees(x, y, ranks, path + (i,))
                           for i, (x, y) in enumerate(zip(a["v"], b["v"]))]}
    if a != b:
        raise _differs(path, ranks, "values" if t not in ("tensor", "alias") else "tensors")
    return a


def merge_all(trees: Sequence[Node | None]) -> Node:
    """The union of every rank's remapped tree (rank order; None: an unchanged placeholder)."""
    merged: Node | None = None
    owner = 0
    for rank, tree in enumerate(trees):
        if tree is None:
            continue
        merged = tree if merged is None else merge_trees(merged, tree, (owner, rank))
        owner = owner if merged is not tree else rank
    if merged is None:
        raise PlanError("no rank reported a structure tree")
    return merged
