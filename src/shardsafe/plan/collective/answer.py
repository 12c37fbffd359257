"""Rank 0's answers in the planning exchange of a collective save, and what each rank
reads from them. Pure: messages in, JSON-able decisions and byte parts out.

``engine.save.plan_exchange`` runs the rounds through the store:

1. ``first``: every rank's hello (``plan.collective.report.hello``). ``decide_first`` answers
   ``same`` (every layout is the one of the group's last full exchange and rank 0 has
   every tree: everyone reuses its plan), ``trees`` (layouts unchanged, some shapes or
   PerRank values new: the ranks listed in ``shapes`` send their shape, those in
   ``values`` their values; ``decide_trees`` rebuilds the tree) or ``full``.
2. ``full``: every rank's report, with its shape if listed in ``shapes`` (one rank per
   distinct shape rank 0 does not hold) and its values if it has any. ``decide_full``
   joins them (``plan.collective.union.Join``) and answers with the transaction, the number of
   shape tensors and, run-length coded over the ranks, how many PerRank tensors each
   rank holds (their global ids follow the shapes' in rank order). The rest is in
   parts, each read only by the ranks that need it:

   * ``shape/<digest>``: the global id of each tensor of the shape, and the writer of
     each of its plain tensors: u32 n, u32 gids[n], i32 writers[n] (-1: not plain);
   * ``set/<digest of the holders>``: the writer of each box of a holder set:
     u32 n, u32 gids[n], u32 writers[n].

Rank lists in decisions are ranges ``[[first, end], ...]`` (end excluded).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .report import HELLO_BYTES, OWN, PLAIN, Boxes, decode_report, digest, renumber
from .union import Join, Joined, ShapeInfo, merge_all, parse_shape, parse_values, with_values
from .writers import PlanError

Decision = dict[str, Any]
Txn = Callable[[], Decision]
_N = struct.Struct("<I")
# what joining reports may raise (PlanError for contradicting states; the others only for
# messages no rank of this version sends): every rank gets the error instead of waiting
_FAILURES = (ValueError, TypeError, KeyError, IndexError)


def pack_ranks(ranks: Iterable[int]) -> list[list[int]]:
    """Ascending ranks as ranges ``[[first, end], ...]``."""
    out: list[list[int]] = []
    for r in ranks:
        if out and out[-1][1] == r:
            out[-1][1] = r + 1
        else:
            out.append([r, r + 1])
    return out


def in_ranks(packed: Sequence[Sequence[int]], rank: int) -> bool:
    """Whether ``rank`` is in ``pack_ranks`` output."""
    return any(a <= rank < b for a, b in packed)


def _rank_failed(rank: int, message: bytes) -> str:
    """The error of a rank that sent ``E`` and its error text instead of a message."""
    return f"rank {rank} failed: {message[1:].decode('utf-8', 'replace')}"


@dataclass(slots=True)
class Hellos:
    """Every rank's hello (rank 0): three digests per rank, or the first error."""

    layout: np.ndarray  # (world, 16) uint8
    shape: np.ndarray
    values: np.ndarray
    kept: np.ndarray  # (world,) bool: the rank kept its layout
    error: str | None = None

    def shape_of(self, rank: int) -> bytes:
        return self.shape[rank].tobytes()


def read_hellos(messages: Iterable[bytes], world: int) -> Hellos:
    """Parses the first round's messages (rank order)."""
    buf = np.zeros((world, HELLO_BYTES - 1), dtype=np.uint8)
    kept = np.zeros(world, dtype=bool)
    error = None
    for r, raw in enumerate(messages):
        if raw[:1] == b"E" or len(raw) != HELLO_BYTES:
            if error is None:
                error = _rank_failed(r, raw) if raw[:1] == b"E" else f"rank {r} failed: a malformed hello"
            continue
        kept[r] = raw[:1] == b"D"
        buf[r] = np.frombuffer(raw, dtype=np.uint8, offset=1)
    return Hellos(buf[:, :16], buf[:, 16:32], buf[:, 32:], kept, error)


@dataclass(slots=True)
class Leader:
    """What rank 0 keeps from the group's last full or trees round (for repeat saves)."""

    hellos: Hellos
    shapes: dict[bytes, ShapeInfo]
    joined: Joined


def _first_ranks(hellos: Hellos, known: dict[bytes, ShapeInfo]) -> list[int]:
    """The lowest rank of each distinct shape digest that rank 0 does not hold."""
    seen = set(known)
    out = []
    for r in range(len(hellos.kept)):
        d = hellos.shape_of(r)
        if d not in seen:
            seen.add(d)
            out.append(r)
    return out


def decide_first(lead: Leader | None, hellos: Hellos, txn: Txn) -> Decision:
    """Rank 0, first round: ``same``, ``trees`` or ``full`` (see the module docstring)."""
    if hellos.error is not None:
        return {"error": hellos.error}
    if lead is None or not hellos.kept.all() or not np.array_equal(hellos.layout, lead.hellos.layout):
        return {"full": True, "shapes": pack_ranks(_first_ranks(hellos, lead.shapes if lead else {}))}
    new_shapes = _first_ranks(hellos, lead.shapes)
    new_values = np.flatnonzero((hellos.values != lead.hellos.values).any(axis=1)
                                & (hellos.values != 0).any(axis=1)).tolist()
    if new_shapes or new_values:
        return {"trees": True, "shapes": pack_ranks(new_shapes), "values": pack_ranks(new_values)}
    if not np.array_equal(hellos.shape, lead.hellos.shape):  # back to shapes rank 0 holds
        try:
            _retree(lead, hellos, {}, {})
        except PlanError as e:
            return {"error": f"rank 0 failed: PlanError: {e}"}
    return {"same": True, **txn()}


def _shape_part(info: ShapeInfo, writer: np.ndarray) -> bytes:
    return (_N.pack(len(info.gids)) + info.gids.astype("<u4").tobytes()
            + writer[info.gids].astype("<i4").tobytes())


def set_key(holders: Sequence[int]) -> str:
    """The part name of a holder set's writers."""
    return "set/" + digest(np.asarray(holders, dtype="<u4").tobytes()).hex()


def shape_key(shape_digest: bytes) -> str:
    """The part name of a shape's global ids and plain writers."""
    return "shape/" + shape_digest.hex()


def _parts(j: Joined) -> dict[str, bytes]:
    parts = {shape_key(s.digest): _shape_part(s, j.plain_writer) for s in j.shapes}
    for holders, items, writers in j.plan.shared:
        keep = j.plain_writer[items] < 0  # DTensor boxes (plain tensors go per shape)
        if keep.any():
            g, w = items[keep].astype("<u4"), writers[keep].astype("<u4")
            parts[set_key(holders)] = _N.pack(len(g)) + g.tobytes() + w.tobytes()
    return parts


def _runs(counts: np.ndarray) -> list[list[int]]:
    """``[[count, ranks], ...]``: run-length code of per-rank counts."""
    out: list[list[int]] = []
    for c in counts.tolist():
        if out and out[-1][0] == c:
            out[-1][1] += 1
        else:
            out.append([c, 1])
    return out


def decide_full(lead: Leader | None, hellos: Hellos, reports: Iterable[bytes], txn: Txn,
                ) -> tuple[Decision, dict[str, bytes], Leader | None]:
    """Rank 0, full round: joins the reports (one at a time) and plans.

    Returns the decision, the parts to publish, and what rank 0 keeps (None on error).
    """
    join = Join([hellos.shape_of(r) for r in range(len(hellos.kept))], lead.shapes if lead else None)
    try:
        for rank, raw in enumerate(reports):
            if raw[:1] == b"E":
                return {"error": _rank_failed(rank, raw)}, {}, None
            join.add(rank, decode_report(raw, rank))
        joined = join.finish()
    except _FAILURES as e:
        return {"error": f"rank 0 failed: {type(e).__name__}: {e}"}, {}, None
    decision = txn()
    if "error" in decision:
        return decision, {}, None
    decision.update(plan=True, tensors=len(joined.plain_writer) - int(joined.value_counts.sum()),
                    values=_runs(joined.value_counts))
    return decision, _parts(joined), Leader(hellos, {s.digest: s for s in joined.shapes}, joined)


def decide_trees(lead: Leader, hellos: Hellos, reports: Iterable[bytes], txn: Txn) -> Decision:
    """Rank 0, after ``trees``: takes the new shapes and values and rebuilds the tree
    (``lead`` is updated in place; the plan is unchanged)."""
    shapes: dict[bytes, ShapeInfo] = {}
    values: dict[int, list[list[Any]]] = {}
    try:
        for rank, raw in enumerate(reports):
            if raw[:1] == b"E":
                return {"error": _rank_failed(rank, raw)}
            rep = decode_report(raw, rank)
            if rep.shape:
                d = hellos.shape_of(rank)
                shapes[d] = _same_table(lead, parse_shape(d, rep.shape, rank), rank)
            if rep.values:
                values[rank] = parse_values(rep.values, rank)[0]
        _retree(lead, hellos, shapes, values)
    except _FAILURES as e:
        return {"error": f"rank 0 failed: {type(e).__name__}: {e}"}
    return {"same": True, **txn()}


def _same_table(lead: Leader, info: ShapeInfo, rank: int) -> ShapeInfo:
    """A new shape of ``rank`` whose tensors are those of its kept shape (same gids)."""
    old = lead.shapes[lead.hellos.shape_of(rank)]
    if info.rows != old.rows:
        raise PlanError(f"rank {rank} changed its tensors but kept its layout digest")
    info.gids = old.gids
    return info


def _retree(lead: Leader, hellos: Hellos, new_shapes: dict[bytes, ShapeInfo],
            new_values: dict[int, list[list[Any]]]) -> None:
    """Rebuilds rank 0's tree from the kept and the new shapes and values."""
    j = lead.joined
    counts = j.value_counts
    base = len(j.plain_writer) - int(counts.sum()) + np.cumsum(counts) - counts
    values = dict(j.values)
    for rank, entries in new_values.items():
        ids = list(range(int(base[rank]), int(base[rank] + counts[rank])))
        values[rank] = [[p, k, renumber(v, ids)] for p, k, v in entries]
    shapes: dict[bytes, ShapeInfo] = {}
    for r in range(len(hellos.kept)):
        d = hellos.shape_of(r)
        if d not in shapes:
            info = new_shapes.get(d) or lead.shapes[d]
            shapes[d] = replace(info, ranks=[])
        shapes[d].ranks.append(r)
    ordered = list(shapes.values())
    template = merge_all([renumber(s.tree, s.gids.tolist()) for s in ordered], [s.ranks[0] for s in ordered])
    lead.joined = replace(j, shapes=ordered, values=values, template=template,
                          tree=with_values(template, values))
    lead.shapes, lead.hellos = shapes, hellos


# ----------------------------------------------------------------------------- every rank


def wanted(shape_digest: bytes, boxes: Boxes) -> list[str]:
    """The parts of a full decision this rank reads: its shape's and its holder sets'."""
    return [shape_key(shape_digest)] + [set_key(s) for s in boxes.sets]


def _ints(part: bytes, kinds: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    (n,) = _N.unpack_from(part)
    a = np.frombuffer(part, dtype=kinds[0], count=n, offset=4).astype(np.int64)
    b = np.frombuffer(part, dtype=kinds[1], count=n, offset=4 + 4 * n).astype(np.int64)
    return a, b


@dataclass(slots=True)
class Share:
    """What one rank reads from a full decision.

    Attributes:
        shape_gids: Global id of each tensor of its shape.
        value_gids: Global id of each of its PerRank tensors.
        writes: Positions (in its shape) of the tensors it writes; it writes all of
            its PerRank tensors too.
    """

    shape_gids: np.ndarray
    value_gids: np.ndarray
    writes: np.ndarray


def read_share(decision: Decision, parts: dict[str, bytes], rank: int, shape_digest: bytes,
               boxes: Boxes, nvalues: int) -> Share:
    """This rank's global ids and the tensors it writes, from a full decision.

    Raises:
        PlanError: a part is missing or does not fit this rank's shape.
    """
    try:
        gids, plain_writer = _ints(parts[shape_key(shape_digest)], ("<u4", "<i4"))
        if len(gids) != len(boxes.holder):
            raise PlanError(f"rank 0's shape has {len(gids)} tensors, rank {rank}'s {len(boxes.holder)}")
        code = boxes.holder
        writes = (code == OWN) | ((code == PLAIN) & (plain_writer == rank))
        for s, holders in enumerate(boxes.sets):
            sgids, swriters = _ints(parts[set_key(holders)], ("<u4", "<u4"))
            mine = set(sgids[swriters == rank].tolist())
            pos = np.flatnonzero(code == s)
            writes[pos] = [g in mine for g in gids[pos].tolist()]
    except (KeyError, struct.error, ValueError) as e:
        raise PlanError(f"rank {rank} could not read its share of rank 0's plan: {e!r}") from None
    start = int(decision["tensors"]) + _values_before(decision["values"], rank)
    return Share(gids, np.arange(start, start + nvalues, dtype=np.int64), np.flatnonzero(writes))


def _values_before(runs: Sequence[Sequence[int]], rank: int) -> int:
    """PerRank tensors of the ranks below ``rank`` (``runs``: ``[[count, ranks], ...]``)."""
    before, first = 0, 0
    for count, ranks in runs:
        if rank < first + ranks:
            return before + count * (rank - first)
        before += count * ranks
        first += ranks
    raise PlanError(f"rank 0's plan lists {first} ranks, not rank {rank}")
