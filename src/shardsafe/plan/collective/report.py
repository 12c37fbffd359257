"""What one rank tells rank 0 when a collective save is planned: builders and wire format.

A rank's flattened state splits three ways (``split_state``):

* its **shape**: the structure tree without the entries of ``PerRank`` nodes, and the
  item table (key path, kind, dtype, global shape, sharded or not) of the tensors in
  it. Every FSDP rank of one pipeline stage has the same shape, so ranks send its
  digest and rank 0 asks for one copy per distinct digest;
* its **boxes** (``Boxes``), per tensor of the shape: who holds this rank's box (a
  holder code) and its bytes. Only what planning needs travels: the bytes of the boxes
  this rank alone holds (one number) and, as columns, the shared boxes it leads (it is
  the lowest of their holders). Plain tensors need nothing: their holders are the
  ranks whose shape has their key path;
* its **values**: its own entry of every ``PerRank`` node, with the tensors in it. They
  travel from this rank to rank 0 only, which inserts them under the rank's key.

The messages are internal to one save (never stored); integers are little-endian.

Hello (first round, 49 bytes): a kind byte (``N``: a new layout; ``D``: the layout the
rank kept from its group's last full exchange; ``E``: an error, whose text follows
instead of the digests), then three 16-byte BLAKE2b digests: ``layout`` (what the plan
depends on: the item table, boxes, positions and the values' tensors), ``shape`` (the
shape's JSON) and ``values`` (the values' JSON; zeros when the rank has none).

Report (full round)::

    0   4   magic b"SSRP"
    4   4   u32  L: shared boxes this rank leads
    8   4   u32  S: holder sets of those boxes
    12  4   u32  H: ranks in those holder sets, all sets together
    16  8   u64  own bytes (the boxes only this rank holds)
    24  8   u64  A: bytes of the shape part (0: rank 0 did not ask for it)
    32  8   u64  B: bytes of the values part (0: none asked for)
    40  8L  u64  bytes of each led box
        4L  u32  position of each led box's tensor in the shape's item table
        4L  u32  holder set of each led box (index into the S sets)
        4S  u32  size of each holder set
        4H  u32  ranks of each holder set, ascending, set after set
        A        shape: JSON {"tree": tree, "items": [[key path, kind, dtype, shape, sharded], ...]}
        B        values: JSON {"entries": [[node path, key, subtree], ...],
                               "items": [[key path, kind, dtype, shape], ...]}

Tensor ids in the shape's tree index its item table; in the values' subtrees, the
values' item list. A node path leads from the root to a PerRank node: encoded dict
keys (as in the tree's ``k``) and list positions.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...format.tree import Node, encode_key_path, render_path
from ..flatten import TensorItem
from ..localize import Holders
from .writers import PlanError

PER_RANK_CLASS = "shardsafe.per_rank.PerRank"  # the ``cls`` that flatten gives a PerRank node
PLAIN, EMPTY, OWN = -1, -2, -3  # holder codes; a code >= 0 indexes ``Boxes.sets``
HELLO_BYTES = 49
NO_VALUES = bytes(16)
MAGIC = b"SSRP"
_HEAD = struct.Struct("<4sIIIQQQ")
_CONTAINERS = ("dict", "namespace", "list", "tuple")


def digest(data: bytes) -> bytes:
    """16-byte BLAKE2b digest (what ranks compare instead of sending the data)."""
    return hashlib.blake2b(data, digest_size=16).digest()


def _json(obj: Any) -> bytes:
    """Compact JSON bytes of plain data (the shape and values parts)."""
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


@dataclass(slots=True)
class LocalParts:
    """A rank's flattened state split into its shape and its PerRank values.

    Attributes:
        tree: The structure tree with every PerRank node emptied; tensor ids are
            positions in ``shape_ids``.
        shape_ids: Flatten ids of the shape's tensors, in tree order.
        entries: ``[node path, key, subtree]`` of each PerRank entry this rank holds;
            tensor ids in subtrees are positions in ``value_ids``.
        value_ids: Flatten ids of the tensors inside those entries.
    """

    tree: Node
    shape_ids: list[int]
    entries: list[list[Any]]
    value_ids: list[int]


def _children(node: Node) -> list[tuple[Any, Node]]:
    """(path step, child) of a container node; empty for leaves."""
    if node.get("t") not in _CONTAINERS or not isinstance(node.get("v"), list):
        return []
    if node["t"] in ("dict", "namespace"):
        return list(zip(node["k"], node["v"]))
    return list(enumerate(node["v"]))


def _tensor_ids(node: Node, out: list[int]) -> None:
    if node.get("t") == "tensor":
        out.append(node["id"])
    for _, child in _children(node):
        _tensor_ids(child, out)


def renumber(node: Node, ids: Sequence[int]) -> Node:
    """A copy of ``node`` whose tensor and alias ids are mapped through ``ids``.

    Raises:
        LookupError: an id is mapped to a negative number (it has no place in the result).
    """
    t = node.get("t")
    if t in ("tensor", "alias"):
        new = ids[node["id"]]
        if new < 0:
            raise LookupError(f"tensor {node['id']} has no place in the renumbered tree")
        return {**node, "id": new}
    if t in _CONTAINERS and isinstance(node.get("v"), list):
        return {**node, "v": [renumber(c, ids) for c in node["v"]]}
    return node


def _renumber_side(node: Node, ids: Sequence[int], where: str) -> Node:
    """``renumber`` for one side of the PerRank wrappers (-1: a tensor of the other side)."""
    try:
        return renumber(node, ids)
    except LookupError:
        raise TypeError(f"a tensor {where} shares its memory with a tensor on the other side "
                        f"of a shardsafe.PerRank wrapper: save a copy of one of them") from None


def split_state(tree: Node, count: int) -> LocalParts:
    """Splits a flattened state (``count`` tensor items) into shape and PerRank values.

    Raises:
        TypeError: a tensor inside a PerRank value shares memory with one outside.
    """
    entries: list[list[Any]] = []
    inside: list[int] = []

    def empty(node: Node, path: list[Any]) -> Node:
        if node.get("t") in ("dict", "namespace") and node.get("cls") == PER_RANK_CLASS:
            for k, v in zip(node["k"], node["v"]):
                entries.append([path, k, v])
                _tensor_ids(v, inside)
            return {**node, "k": [], "v": []}
        kids = _children(node)
        if not kids:
            return node
        return {**node, "v": [empty(c, path + [step]) for step, c in kids]}

    shared = empty(tree, [])
    if not entries:
        return LocalParts(tree, list(range(count)), [], [])
    values = sorted(inside)
    is_value = np.zeros(count, dtype=bool)
    is_value[values] = True
    shape_pos = np.where(is_value, -1, np.cumsum(~is_value) - 1).tolist()
    value_pos = np.where(is_value, np.cumsum(is_value) - 1, -1).tolist()
    entries = [[p, k, _renumber_side(v, value_pos, "inside a PerRank value")] for p, k, v in entries]
    return LocalParts(_renumber_side(shared, shape_pos, "outside the PerRank values"),
                      np.flatnonzero(~is_value).tolist(), entries, values)


@dataclass(slots=True)
class Shape:
    """A rank's shape as sent (``body``) and its digests.

    Attributes:
        body: The shape part of a report (JSON).
        digest: Digest of ``body``.
        table: Digest of the item table alone (the part the plan depends on).
    """

    body: bytes
    digest: bytes
    table: bytes


def item_rows(items: Sequence[TensorItem], holders: Sequence[Holders],
              ids: Sequence[int]) -> list[list[Any]]:
    """The item table of the shape: ``[key path, kind, dtype, global shape, sharded]``."""
    return [[encode_key_path(items[i].path), items[i].kind, items[i].dtype,
             list(items[i].shape), holders[i] is not None] for i in ids]


def shape_of(tree: Node, rows: Sequence[Sequence[Any]]) -> Shape:
    """The shape of a rank from its emptied tree and its item table (``item_rows``)."""
    table = _json(rows)
    body = b'{"tree":' + _json(tree) + b',"items":' + table + b"}"
    return Shape(body, digest(body), digest(table))


@dataclass(slots=True)
class Values:
    """A rank's PerRank values as sent (``body``), their tensors' table and digest."""

    body: bytes
    table: bytes
    digest: bytes


def values_of(parts: LocalParts, items: Sequence[TensorItem]) -> Values:
    """This rank's PerRank values (``parts.entries``) and the table of their tensors."""
    if not parts.entries:
        return Values(b"", b"", NO_VALUES)
    table = _json([[encode_key_path(items[i].path), items[i].kind, items[i].dtype,
                      list(items[i].shape)] for i in parts.value_ids])
    body = b'{"entries":' + _json(parts.entries) + b',"items":' + table + b"}"
    return Values(body, table, digest(body))


@dataclass(slots=True)
class Boxes:
    """A rank's box of each tensor of its shape, as columns.

    Attributes:
        holder: Per tensor: ``PLAIN`` (a plain tensor), ``EMPTY`` (uneven sharding left
            this rank nothing), ``OWN`` (only this rank holds the box), or the index in
            ``sets`` of the ranks that hold it identically (int32).
        nbytes: Per tensor: bytes of this rank's box (int64).
        sets: Holder sets (sorted ranks, this rank among them) of the shared boxes.
        offsets: Every box's position in its tensor, tensor after tensor (int64).
    """

    holder: np.ndarray
    nbytes: np.ndarray
    sets: list[tuple[int, ...]]
    offsets: np.ndarray


def boxes_of(items: Sequence[TensorItem], holders: Sequence[Holders], rank: int,
             ids: Sequence[int]) -> Boxes:
    """The columns of the tensors ``ids`` (the shape's) after ``localize``."""
    code = np.empty(len(ids), dtype=np.int32)
    sets: dict[tuple[int, ...], int] = {}
    for n, i in enumerate(ids):
        h = holders[i]
        if h is None:
            code[n] = PLAIN
        elif not h:
            code[n] = EMPTY
        elif h == (rank,):
            code[n] = OWN
        else:
            code[n] = sets.setdefault(h, len(sets))
    nbytes = np.array([items[i].nbytes for i in ids], dtype=np.int64)
    offsets = np.array([o for i in ids for o in items[i].offsets], dtype=np.int64)
    return Boxes(code, nbytes, list(sets), offsets)


def _sets_column(sets: Sequence[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    sizes = np.array([len(s) for s in sets], dtype="<u4")
    flat = np.array([r for s in sets for r in s], dtype="<u4")
    return sizes, flat


def layout_digest(shape: Shape, boxes: Boxes, values: Values) -> bytes:
    """What the plan of this rank depends on: item table, boxes, positions, values' tensors."""
    sizes, flat = _sets_column(boxes.sets)
    h = hashlib.blake2b(digest_size=16)
    for part in (shape.table, boxes.holder.astype("<i4").tobytes(), boxes.nbytes.astype("<i8").tobytes(),
                 sizes.tobytes(), flat.tobytes(), boxes.offsets.astype("<i8").tobytes(), values.table):
        h.update(struct.pack("<Q", len(part)))
        h.update(part)
    return h.digest()


@dataclass(slots=True)
class Description:
    """Everything a rank sends about its state (what ``describe`` builds)."""

    parts: LocalParts
    shape: Shape
    boxes: Boxes
    values: Values
    layout: bytes


def describe(tree: Node, items: Sequence[TensorItem], holders: Sequence[Holders], rank: int) -> Description:
    """A rank's shape, boxes, values and layout digest from its flattened, localised state.

    Raises:
        TypeError: a DTensor sits inside a PerRank value, or a tensor inside one shares
            memory with one outside.
    """
    parts = split_state(tree, len(items))
    for i in parts.value_ids:
        if holders[i] is not None:
            raise TypeError(f"DTensor inside a shardsafe.PerRank value at key path "
                            f"{render_path(items[i].path)!r}: PerRank values are this rank's "
                            f"own; save the DTensor outside PerRank")
    shape = shape_of(parts.tree, item_rows(items, holders, parts.shape_ids))
    boxes = boxes_of(items, holders, rank, parts.shape_ids)
    values = values_of(parts, items)
    return Description(parts, shape, boxes, values, layout_digest(shape, boxes, values))


def hello(kept: bool, layout: bytes, shape: bytes, values: bytes) -> bytes:
    """A rank's first-round message (``HELLO_BYTES``)."""
    return (b"D" if kept else b"N") + layout + shape + values


def report(rank: int, boxes: Boxes | None, shape: bytes = b"", values: bytes = b"") -> bytes:
    """A rank's report: its own bytes and the shared boxes it leads (none when ``boxes``
    is None: a trees round), and the shape and values parts when rank 0 asked for them."""
    led_sets: list[tuple[int, ...]] = []
    led = set_col = np.zeros(0, dtype=np.int64)
    nbytes = np.zeros(0, dtype=np.int64)
    own = 0
    if boxes is not None:
        renum = np.full(len(boxes.sets) + 3, -1, dtype=np.int64)  # codes PLAIN.. index the end
        for old, s in enumerate(boxes.sets):
            if s[0] == rank:
                renum[old] = len(led_sets)
                led_sets.append(s)
        if led_sets:
            mapped = renum[boxes.holder]
            led = np.flatnonzero(mapped >= 0)
            set_col = mapped[led]
        own = int(boxes.nbytes[boxes.holder == OWN].sum())
        nbytes = boxes.nbytes[led]
    sizes, flat = _sets_column(led_sets)
    head = _HEAD.pack(MAGIC, len(led), len(led_sets), len(flat), own, len(shape), len(values))
    return b"".join([head, nbytes.astype("<u8").tobytes(), led.astype("<u4").tobytes(),
                     set_col.astype("<u4").tobytes(), sizes.tobytes(), flat.tobytes(), shape, values])


@dataclass(slots=True)
class ReceivedReport:
    """A decoded report (rank 0)."""

    own: int
    nbytes: np.ndarray
    item: np.ndarray
    set: np.ndarray
    sets: list[tuple[int, ...]]
    shape: bytes
    values: bytes


def decode_report(data: bytes, rank: int) -> ReceivedReport:
    """Inverse of ``report``.

    Raises:
        PlanError: the bytes are not a report (named after ``rank``).
    """
    try:
        magic, nl, ns, nh, own, na, nb = _HEAD.unpack_from(data)
        if magic != MAGIC or len(data) != _HEAD.size + 16 * nl + 4 * ns + 4 * nh + na + nb:
            raise ValueError(f"{len(data)} bytes do not hold the sizes the header gives")
        at = _HEAD.size
        cols = []
        for count, dt in ((nl, "<u8"), (nl, "<u4"), (nl, "<u4"), (ns, "<u4"), (nh, "<u4")):
            cols.append(np.frombuffer(data, dtype=dt, count=count, offset=at).astype(np.int64))
            at += count * np.dtype(dt).itemsize
        nbytes, item, sets_of, sizes, flat = cols
        if len(item) and int(sets_of.max()) >= ns:
            raise ValueError("a box names a holder set beyond those listed")
        if int(sizes.sum()) != nh:
            raise ValueError("holder set sizes do not add up")
        bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        sets = [tuple(flat[a:b].tolist()) for a, b in zip(bounds, bounds[1:])]
        return ReceivedReport(own, nbytes, item, sets_of, sets, data[at : at + na],
                              data[at + na : at + na + nb])
    except (ValueError, struct.error) as e:
        raise PlanError(f"rank {rank} sent a malformed report: {e}") from None
