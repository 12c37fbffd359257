"""Rank 0 joins the ranks' reports into one tensor table, one structure tree, one plan.

States may differ per rank: pipeline stages hold different key paths, keys may be held
by some ranks only, DTensors may live on sub-meshes, and ``PerRank`` values belong to
one rank each. ``Join`` reads the reports of ``plan.collective.report`` one at a time, in rank
order, and keeps only what the index and the plan need:

* one copy of each distinct shape; its tensors get global ids by key path (a path
  first seen on a lower rank keeps that rank's id), and every shape must agree with
  the others on the kind, dtype, global shape and sharding of a path;
* per rank, the bytes of its own boxes (one integer) and the shared boxes it leads
  (columns, mapped to global ids with numpy);
* per rank, its PerRank values, whose tensors get ids after every shape's tensors.

``Join.finish`` then derives the holders of every plain tensor (the ranks whose shape
has its path), plans the writers (``plan.collective.writers``), and builds the merged tree. Rank
0 holds the distinct shapes, the led boxes and the values: about what the index holds,
whatever the number of ranks. Errors name the key path and the ranks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...format.dtypes import lookup
from ...format.tree import Node, decode_key_path, render_path
from .report import ReceivedReport, renumber
from .report import digest as report_digest
from .writers import PlanError, RankReport, SharedBoxes, WriterPlan, plan_writers


def path_key(encoded: Any) -> str:
    """A hashable name of an encoded key path (or of an encoded dict key)."""
    return json.dumps(encoded, separators=(",", ":"))


def _shown(encoded_path: Any) -> str:
    try:
        return render_path(decode_key_path(encoded_path))
    except ValueError:
        return path_key(encoded_path)


@dataclass(slots=True)
class ShapeInfo:
    """One distinct shape, as rank 0 keeps it.

    Attributes:
        digest: Digest of its JSON (``plan.collective.report.Shape.digest``).
        body: Its JSON, as received.
        tree: Its structure tree (tensor ids: positions in ``rows``).
        rows: Its item table (``plan.collective.report.item_rows``).
        gids: The global id of each of its tensors (int64).
        ranks: The ranks that have it, ascending.
    """

    digest: bytes
    body: bytes
    tree: Node
    rows: list[list[Any]]
    gids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ranks: list[int] = field(default_factory=list)


def parse_shape(digest: bytes, body: bytes, rank: int) -> ShapeInfo:
    """A shape part as received from ``rank``.

    Raises:
        PlanError: the bytes are not a shape.
    """
    try:
        if report_digest(body) != digest:
            raise ValueError("its digest is not the one of its hello")
        raw = json.loads(body.decode("utf-8"))
        tree, rows = raw["tree"], raw["items"]
        if not isinstance(tree, dict) or not all(isinstance(r, list) and len(r) == 5 for r in rows):
            raise ValueError("tree or item rows of the wrong type")
    except (ValueError, KeyError, TypeError) as e:
        raise PlanError(f"rank {rank} sent a malformed shape: {e}") from None
    return ShapeInfo(digest, body, tree, rows)


@dataclass(slots=True)
class Table:
    """The checkpoint's tensors in global id order (rank 0).

    Attributes:
        paths: Encoded key path of each tensor.
        meta: ``(kind, dtype, global shape)`` of each tensor.
    """

    paths: list[Any] = field(default_factory=list)
    meta: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)


def _nbytes(meta: tuple[str, str, tuple[int, ...]]) -> int:
    n = lookup(meta[1]).itemsize
    for d in meta[2]:
        n *= int(d)
    return n


@dataclass(slots=True)
class Joined:
    """What ``Join.finish`` hands on.

    Attributes:
        table: Every tensor of the checkpoint (global id order).
        plan: The writers of the shared boxes (plain tensors included).
        plain_writer: Per global id: the rank that writes it if it is a plain tensor
            (its writer goes out per shape), else -1.
        shapes: The distinct shapes, in order of their lowest rank (with ranks and gids).
        value_counts: Per rank, how many PerRank tensors it holds.
        values: Per rank holding PerRank values, its entries with global tensor ids.
        template: The merged tree of the shapes (PerRank nodes empty).
        tree: ``template`` with every rank's PerRank entries inserted.
    """

    table: Table
    plan: WriterPlan
    plain_writer: np.ndarray
    shapes: list[ShapeInfo]
    value_counts: np.ndarray
    values: dict[int, list[list[Any]]]
    template: Node
    tree: Node


class Join:
    """Rank 0's fold over the reports of a full round (one report at a time, rank order).

    Args:
        shape_of_rank: Per rank, the digest of its shape (from its hello).
        known: Shapes rank 0 already holds (their ranks and gids are recomputed).
    """

    def __init__(self, shape_of_rank: Sequence[bytes], known: dict[bytes, ShapeInfo] | None = None) -> None:
        self.world = len(shape_of_rank)
        self.shape_of_rank = shape_of_rank
        self.known = known or {}
        self.shapes: dict[bytes, ShapeInfo] = {}
        self.table = Table()
        self.sharded: list[bool] = []
        self.first_rank: list[int] = []  # of each global id: the rank whose shape brought it
        self.by_path: dict[str, int] = {}
        self.own = np.zeros(self.world, dtype=np.int64)
        self.led: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # gids, nbytes, set ids
        self.sets: dict[tuple[int, ...], int] = {}
        self.values: dict[int, tuple[list[list[Any]], list[list[Any]]]] = {}
        self.solo: dict[int, int] = {}  # plain tensors only one rank holds: gid -> rank

    def add(self, rank: int, rep: ReceivedReport) -> None:
        """Folds ``rank``'s report in (ranks in ascending order).

        Raises:
            PlanError: the report contradicts what lower ranks reported, or names
                tensors or holders its shape does not have.
        """
        info = self._shape(rank, rep)
        info.ranks.append(rank)
        self.own[rank] += rep.own
        if len(rep.item):
            items = set(rep.item.tolist())
            if max(items) >= len(info.rows) or not all(info.rows[i][4] for i in items):
                raise PlanError(f"rank {rank} reports shared boxes of tensors its shape does not "
                                f"hold as DTensors")
            ids = np.array([self.sets.setdefault(s, len(self.sets)) for s in rep.sets], dtype=np.int64)
            if any(s[0] != rank for s in rep.sets):
                raise PlanError(f"rank {rank} reports holder sets it does not lead")
            self.led.append((info.gids[rep.item], rep.nbytes, ids[rep.set]))
        if rep.values:
            self.values[rank] = parse_values(rep.values, rank)

    def _shape(self, rank: int, rep: ReceivedReport) -> ShapeInfo:
        d = self.shape_of_rank[rank]
        info = self.shapes.get(d)
        if info is not None:
            return info
        if rep.shape:
            info = parse_shape(d, rep.shape, rank)
        elif d in self.known:
            old = self.known[d]
            info = ShapeInfo(d, old.body, old.tree, old.rows)
        else:
            raise PlanError(f"rank {rank} did not send its shape, which rank 0 does not know")
        info.gids = np.array([self._gid(rank, row) for row in info.rows], dtype=np.int64)
        self.shapes[d] = info
        return info

    def _gid(self, rank: int, row: list[Any]) -> int:
        """The global id of a tensor row (new or existing); checks the ranks agree on it."""
        name = path_key(row[0])
        meta = (str(row[1]), str(row[2]), tuple(int(d) for d in row[3]))
        gid = self.by_path.get(name)
        if gid is None:
            gid = self.by_path[name] = len(self.table.paths)
            self.table.paths.append(row[0])
            self.table.meta.append(meta)
            self.sharded.append(bool(row[4]))
            self.first_rank.append(rank)
            return gid
        had = self.table.meta[gid]
        if had != meta:
            raise PlanError(f"ranks disagree on tensor {_shown(row[0])!r}: rank {rank} has {meta[0]} "
                            f"{meta[1]} of global shape {list(meta[2])}, rank {self.first_rank[gid]} "
                            f"{had[0]} {had[1]} of global shape {list(had[2])}")
        if self.sharded[gid] != bool(row[4]):
            raise PlanError(f"ranks {self.first_rank[gid]} and {rank} disagree on tensor "
                            f"{_shown(row[0])!r}: a DTensor on one, a plain tensor on the other")
        return gid

    def finish(self) -> Joined:
        """Plans the writers and merges the trees once every rank's report is in.

        Raises:
            PlanError: the trees contradict each other, or PerRank entries collide.
        """
        if len(self.shapes) == 0:
            raise PlanError("no rank reported")
        shapes = sorted(self.shapes.values(), key=lambda s: s.ranks[0])
        template = merge_all([renumber(s.tree, s.gids.tolist()) for s in shapes], [s.ranks[0] for s in shapes])
        counts, values = self._values_ids()
        tree = with_values(template, values)
        plan = plan_writers(self.world, self._reports(shapes))
        writer = np.full(len(self.table.paths), -1, dtype=np.int64)
        plain = np.zeros(len(writer), dtype=bool)
        plain[: len(self.sharded)] = ~np.array(self.sharded, dtype=bool)
        for _, items, writers in plan.shared:
            writer[items] = writers
        writer[~plain] = -1
        for gid, rank in self.solo.items():
            writer[gid] = rank
        return Joined(self.table, plan, writer, shapes, counts, values, template, tree)

    def _values_ids(self) -> tuple[np.ndarray, dict[int, list[list[Any]]]]:
        """Global ids for every rank's PerRank tensors (after the shapes' tensors)."""
        counts = np.zeros(self.world, dtype=np.int64)
        out: dict[int, list[list[Any]]] = {}
        for rank, (entries, rows) in sorted(self.values.items()):
            base = len(self.table.paths)
            counts[rank] = len(rows)
            for row in rows:
                self.table.paths.append(row[0])
                meta = (str(row[1]), str(row[2]), tuple(int(d) for d in row[3]))
                self.table.meta.append(meta)
                self.own[rank] += _nbytes(meta)
            ids = list(range(base, base + len(rows)))
            out[rank] = [[p, k, renumber(v, ids)] for p, k, v in entries]
        return counts, out

    def _reports(self, shapes: Sequence[ShapeInfo]) -> list[RankReport]:
        """Every rank's report for the planner: own bytes, shared DTensor boxes, and the
        plain tensors (held by the ranks of every shape that has their path)."""
        groups: dict[tuple[int, ...], tuple[list[np.ndarray], list[np.ndarray]]] = {}
        if self.led:
            gids, nbytes, sets = (np.concatenate(c) for c in zip(*self.led))
            order = np.argsort(sets, kind="stable")
            gids, nbytes, sets = gids[order], nbytes[order], sets[order]
            cuts = np.flatnonzero(np.diff(sets)) + 1
            holders = list(self.sets)
            for g, n, s in zip(np.split(gids, cuts), np.split(nbytes, cuts), np.split(sets, cuts)):
                groups[holders[int(s[0])]] = ([g], [n])
        self._plain_groups(shapes, groups)
        led: dict[int, list[SharedBoxes]] = {}
        for h, (gs, ns) in groups.items():
            g, n = np.concatenate(gs), np.concatenate(ns)
            if len(np.unique(g)) != len(g):
                raise PlanError(f"holder set {list(h)[:8]} was reported twice for one tensor")
            led.setdefault(h[0], []).append(SharedBoxes(h, g, n))
        return [RankReport(r, int(self.own[r]), tuple(led.get(r, ()))) for r in range(self.world)]

    def _plain_groups(self, shapes: Sequence[ShapeInfo],
                      groups: dict[tuple[int, ...], tuple[list[np.ndarray], list[np.ndarray]]]) -> None:
        """Adds the plain tensors to ``groups`` by holder set (one holder: own bytes)."""
        member: dict[int, list[int]] = {}
        for s, info in enumerate(shapes):
            for pos in np.flatnonzero(~np.array([bool(r[4]) for r in info.rows], dtype=bool)).tolist():
                member.setdefault(int(info.gids[pos]), []).append(s)
        by_shapes: dict[tuple[int, ...], list[int]] = {}
        for gid, ss in member.items():
            by_shapes.setdefault(tuple(ss), []).append(gid)
        for ss, gids in by_shapes.items():
            holders = tuple(sorted(r for s in ss for r in shapes[s].ranks))
            nbytes = np.array([_nbytes(self.table.meta[g]) for g in gids], dtype=np.int64)
            if len(holders) == 1:
                self.own[holders[0]] += int(nbytes.sum())
                self.solo.update((g, holders[0]) for g in gids)
                continue
            gs, ns = groups.setdefault(holders, ([], []))
            gs.append(np.array(gids, dtype=np.int64))
            ns.append(nbytes)


def parse_values(body: bytes, rank: int) -> tuple[list[list[Any]], list[list[Any]]]:
    """A values part as received from ``rank``: its entries and its tensors' rows.

    Raises:
        PlanError: the bytes are not a values part.
    """
    try:
        raw = json.loads(body.decode("utf-8"))
        entries, rows = raw["entries"], raw["items"]
        if not all(isinstance(e, list) and len(e) == 3 and isinstance(e[0], list) for e in entries):
            raise ValueError("entries of the wrong type")
        if not all(isinstance(r, list) and len(r) == 4 for r in rows):
            raise ValueError("item rows of the wrong type")
    except (ValueError, KeyError, TypeError) as e:
        raise PlanError(f"rank {rank} sent malformed PerRank values: {e}") from None
    return entries, rows


# ----------------------------------------------------------------------------- trees


def _differs(path: tuple[Any, ...], ranks: tuple[int, int], what: str) -> PlanError:
    return PlanError(f"ranks {ranks[0]} and {ranks[1]} hold different {what} at key path "
                     f"{render_path(path)!r}; values that differ per rank must be wrapped in "
                     f"shardsafe.PerRank")


def merge_trees(a: Node, b: Node, ranks: tuple[int, int], path: tuple[Any, ...] = ()) -> Node:
    """The union of two (renumbered) structure trees; ``ranks`` name their owners in errors.

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
        where = {path_key(k): i for i, k in enumerate(keys)}
        for k, v in zip(b["k"], b["v"]):
            i = where.get(path_key(k))
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


def merge_all(trees: Sequence[Node], ranks: Sequence[int] | None = None) -> Node:
    """The union of renumbered trees (``ranks``: the rank each tree came from; default its position)."""
    if not trees:
        raise PlanError("no rank reported a structure tree")
    owners = list(range(len(trees))) if ranks is None else list(ranks)
    merged, owner = trees[0], owners[0]
    for tree, rank in zip(trees[1:], owners[1:]):
        merged = merge_trees(merged, tree, (owner, rank))
    return merged


def with_values(template: Node, values: dict[int, list[list[Any]]]) -> Node:
    """``template`` with every rank's PerRank entries inserted (rank order) into the
    PerRank nodes their paths name; nodes on those paths are copied, the rest shared.

    Raises:
        PlanError: a path names no PerRank node, or two ranks hold one key.
    """
    if not values:
        return template
    root = dict(template)
    nodes: dict[str, tuple[Node, dict[str, int]]] = {}
    for rank in sorted(values):
        for path, key, sub in values[rank]:
            name = path_key(path)
            if name not in nodes:
                node = _copy_path(root, path, rank)
                node["k"], node["v"] = list(node["k"]), list(node["v"])
                nodes[name] = (node, {path_key(k): -1 for k in node["k"]})
            node, seen = nodes[name]
            kname = path_key(key)
            if kname in seen:
                raise PlanError(f"two ranks (rank {rank} and rank {seen[kname]}) hold PerRank entry "
                                f"{key!r} under one node: give each rank its own PerRank key")
            seen[kname] = rank
            node["k"].append(key)
            node["v"].append(sub)
    return root


def _copy_path(root: Node, path: Sequence[Any], rank: int) -> Node:
    """The node at ``path`` below ``root`` (a copy), copying each node on the way."""
    node = root
    for step in path:
        kids = node.get("v")
        if not isinstance(kids, list):
            raise PlanError(f"rank {rank} names PerRank entries under a missing node {path!r}")
        if node.get("t") in ("dict", "namespace"):
            where = [i for i, k in enumerate(node["k"]) if path_key(k) == path_key(step)]
            at = where[0] if where else -1
        else:
            at = step if isinstance(step, int) and 0 <= step < len(kids) else -1
        if at < 0:
            raise PlanError(f"rank {rank} names PerRank entries under a missing node {path!r}")
        kids = list(kids)
        kids[at] = dict(kids[at])
        node["v"] = kids
        node = kids[at]
    return node
