"""The planning exchange of a collective save (caller's thread, bounded store rounds).

Every rank flattens its state, localises DTensors and reports what it holds; rank 0
plans who writes what (``plan.distribute``), checks the target path, picks the
transaction token and answers every rank. A rank that fails here (an unsavable
value, metadata that is not JSON) reports its error instead, and every rank raises.
Like any training collective, every rank of the group must call ``plan_collective``;
the exchange runs through the c10d store (``comm.rounds``), so a rank that never
calls it turns into ``CheckpointTimeoutError`` naming it within ``timeout``.

Cached planning: each rank sends first a 16-byte digest of its layout (its report and
holders). When every digest equals the one of the group's last full exchange, rank 0
answers "same" and every rank reuses the plan it kept; otherwise a second round
exchanges the full reports. ``STATS`` counts the bytes this rank exchanged.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..comm import Comm, next_namespace
from ..comm.channel import Channel
from ..comm.rounds import join, leader_round, leave
from ..errors import CheckpointError
from ..format.tree import Node, decode_key_path
from ..plan.distribute import PlanError, WriterPlan, decode_plan, encode_plan, plan_writers
from ..plan.flatten import TensorItem, flatten
from ..plan.sharding import localize
from ..plan.union import merge_all, path_key, remap, rows_of, union
from ..storage import Storage
from .. import knobs
from . import commit
from .prepared import check_metadata


@dataclass(slots=True)
class Planned:
    """This rank's outcome of the planning collective.

    Attributes:
        tree: Structure tree of the whole state.
        items: Every tensor item of the state (index order).
        mine: The items (or parts of items) this rank writes.
        txn: The transaction rank 0 planned (working directory, final path).
        token: Unique id of this save (names its store keys).
    """

    tree: Node
    items: list[TensorItem]
    mine: list[TensorItem]
    txn: commit.Transaction
    token: str


@dataclass(slots=True)
class ExchangeStats:
    """Bytes this rank sent and received through the store in planning exchanges.

    Attributes:
        last: Bytes of the most recent planning exchange (sent + received).
        total: Bytes of every planning exchange of this process.
        full: Whether the most recent exchange sent the full reports and plan.
    """

    last: int = 0
    total: int = 0
    full: bool = False


STATS = ExchangeStats()

_CACHE_LOCK = threading.Lock()
_CACHE: dict[str, _Kept] = {}  # group scope -> what this rank kept from the last full exchange
_LEADERS: dict[str, _Leader] = {}  # rank 0: decided in a full round, kept once it succeeds


class _Counting:
    """A Channel that counts the bytes set and fetched through it."""

    def __init__(self, inner: Channel) -> None:
        self.inner, self.rank, self.world_size, self.bytes = inner, inner.rank, inner.world_size, 0

    def set(self, key: str, value: bytes) -> None:
        self.bytes += len(value)
        self.inner.set(key, value)

    def wait(self, keys: Sequence[str], timeout: float) -> list[bool]:
        return self.inner.wait(keys, timeout)

    def fetch(self, keys: Sequence[str]) -> list[bytes]:
        out = self.inner.fetch(keys)
        self.bytes += sum(len(v) for v in out)
        return out

    def delete(self, key: str) -> None:
        self.inner.delete(key)


def layout_digest(rows: Sequence[Any], items: Sequence[TensorItem]) -> bytes:
    """16 bytes naming this rank's layout: its rows (paths, shapes, holders) and box positions."""
    body = json.dumps([rows, [list(it.offsets or ()) for it in items]], separators=(",", ":"))
    return hashlib.blake2b(body.encode("utf-8"), digest_size=16).digest()


def tree_digest(tree: Node) -> bytes:
    """16 bytes naming a structure tree (its plain values included)."""
    body = json.dumps(tree, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return hashlib.blake2b(body, digest_size=16).digest()


@dataclass(slots=True)
class _Kept:
    """What a rank keeps from its group's last full exchange (cached planning)."""

    layout: bytes
    plan: bytes
    gids: list[int]  # local item id -> global id
    solo: set[int]  # global ids of plain tensors only this rank holds
    leader: _Leader | None = None  # rank 0 only


@dataclass(slots=True)
class _Leader:
    """Rank 0's part of the cache: every rank's digests and trees, and the union."""

    layouts: list[bytes]
    tree_digests: list[bytes]
    trees: list[Node]  # each rank's tree with global ids
    merged: Node
    paths: list[Any]
    meta: list[tuple[str, str, list[int]]]


def _errors(messages: Sequence[bytes]) -> dict[str, Any] | None:
    for r, raw in enumerate(messages):
        if raw[:1] == b"E":
            return {"error": f"rank {r} failed: {raw[1:].decode('utf-8', 'replace')}"}
    return None


def _transaction(storage: Storage, spath: str, overwrite: bool) -> dict[str, Any]:
    """Rank 0: picks the token and plans the transaction (a decision's common part)."""
    try:
        token = uuid.uuid4().hex[:16]
        txn = commit.plan_transaction(storage, spath, overwrite=overwrite, token=token)
    except (ValueError, TypeError, CheckpointError, OSError) as e:
        return {"error": f"rank 0 failed: {type(e).__name__}: {e}"}
    return {"token": token, "workdir": txn.workdir, "replace": txn.replace}


def decide_first(lead: _Leader | None, messages: Sequence[bytes],
                 txn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Rank 0, first round: "same" (reuse the kept plans), "trees" (only some trees
    changed: send those) or "full" (send everything). ``lead``: what rank 0 kept from
    the last full exchange (what ``decide_full`` passed to its ``keep``), or None."""
    error = _errors(messages)
    if error is not None:
        return error
    if lead is None or any(m[:1] != b"D" or m[1:17] != d for m, d in zip(messages, lead.layouts)):
        return {"full": True}
    changed = [r for r, (m, d) in enumerate(zip(messages, lead.tree_digests)) if m[17:33] != d]
    return {"trees": changed} if changed else {"same": True, **txn()}


def first_message(layout: bytes, tree_digest: bytes, hit: bool) -> bytes:
    """A rank's first-round message (33 bytes): "D" when its layout equals the one it
    kept from the last full exchange ("N" otherwise), its layout digest, its tree digest."""
    return (b"D" if hit else b"N") + layout + tree_digest


def full_message(rows: Sequence[Any], tree: Node, layout: bytes, tree_digest: bytes) -> bytes:
    """A rank's report in a full round: "R", its digests, then its rows and tree as JSON."""
    body = json.dumps({"rows": rows, "tree": tree}, separators=(",", ":"))
    return b"R" + layout + tree_digest + body.encode("utf-8")


def _decide_trees(lead: _Leader, messages: Sequence[bytes],
                  txn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Rank 0, after "trees": merges the changed trees into the kept ones."""
    trees = list(lead.trees)
    for r, raw in enumerate(messages):
        if raw:
            trees[r] = json.loads(raw.decode("utf-8"))
    try:
        merged = merge_all(trees)
    except PlanError as e:
        return {"error": f"rank 0 failed: PlanError: {e}"}
    lead.trees, lead.merged = trees, merged
    lead.tree_digests = [tree_digest(t) for t in trees]
    return {"same": True, **txn()}


def decide_full(world: int, messages: Sequence[bytes], txn: Callable[[], dict[str, Any]],
                keep: Callable[[_Leader], None]) -> dict[str, Any]:
    """Rank 0, full round: merges the ranks' tables and trees, plans the writers.

    ``messages``: every rank's ``full_message``; ``keep`` receives what rank 0 keeps for
    repeat saves (once the decision is made)."""
    error = _errors(messages)
    if error is not None:
        return error
    try:
        bodies = [json.loads(raw[33:].decode("utf-8")) for raw in messages]
        u = union([b["rows"] for b in bodies])
        trees = [remap(b["tree"], ids) for b, ids in zip(bodies, u.ids)]
        merged = merge_all(trees)
        plan = plan_writers(world, u.reports)
    except (ValueError, TypeError, KeyError) as e:  # PlanError is a ValueError
        return {"error": f"rank 0 failed: {type(e).__name__}: {e}"}
    decision = txn()
    if "error" in decision:
        return decision
    keep(_Leader([m[1:17] for m in messages], [tree_digest(t) for t in trees], trees, merged,
                 u.paths, u.meta))
    solo = [g for g, h in u.plain_holders.items() if len(h) == 1]
    return {**decision, "plan": encode_plan(plan).decode("utf-8"), "paths": u.paths, "solo": solo}


@dataclass(slots=True)
class _Local:
    """This rank's flattened state and what it sends."""

    tree: Node
    items: list[TensorItem]
    holders: list[Any]
    rows: list[Any]
    layout: bytes
    tree_digest: bytes


def _prepare_local(state: Mapping[str, Any], comm: Comm, metadata: Mapping[str, Any]) -> _Local:
    """Flattens and localises this rank's state."""
    check_metadata(metadata)  # the same metadata everywhere: every rank raises the same error
    tree, items = flatten(state)
    holders = localize(items, comm.group_rank)
    rows = rows_of(items, holders)
    return _Local(tree, items, holders, rows, layout_digest(rows, items), tree_digest(tree))


def plan_collective(state: Mapping[str, Any], storage: Storage, spath: str, comm: Comm, *,
                    overwrite: bool, metadata: Mapping[str, Any],
                    timeout: float | None = None) -> Planned:
    """The planning collective (caller's thread): every rank of ``comm`` calls it.

    Ranks may hold different states (pipeline stages, keys held by some ranks): the
    checkpoint stores their union.

    Raises:
        TypeError: this rank's state holds a value that cannot be saved.
        CheckpointError: another rank failed to prepare, the ranks' states contradict each
            other (the message names the key and the ranks), or the path is not writable.
        CheckpointTimeoutError: a rank did not join within ``timeout`` seconds (default
            ``SHARDSAFE_TIMEOUT``); the message names it. Nothing was written.
    """
    wait = knobs.timeout() if timeout is None else float(timeout)
    scope = str(getattr(comm, "scope", ""))
    ch = _Counting(comm.channel(next_namespace(comm, "plan")))
    join(ch)
    local: _Local | None = None
    with _CACHE_LOCK:
        kept = _CACHE.get(scope)
    try:
        local = _prepare_local(state, comm, metadata)
        first = first_message(local.layout, local.tree_digest,
                              kept is not None and kept.layout == local.layout)
    except BaseException as e:  # noqa: BLE001 - reported to the other ranks, then re-raised
        first = b"E" + f"{type(e).__name__}: {e}".encode("utf-8", "replace")
        local_error: BaseException | None = e
    else:
        local_error = None
    decision: dict[str, Any] = {}
    try:
        decision = _rounds(ch, comm, kept, local, first, wait,
                           lambda: _transaction(storage, spath, overwrite), scope)
    finally:
        leave(ch)
        STATS.last, STATS.full = ch.bytes, "plan" in decision
        STATS.total += ch.bytes
    if local_error is not None:
        raise local_error
    assert local is not None
    return _planned(decision, scope, local, storage, spath, comm)


def _rounds(ch: Channel, comm: Comm, kept: _Kept | None, local: _Local | None, first: bytes,
            wait: float, txn: Callable[[], dict[str, Any]], scope: str) -> dict[str, Any]:
    """The store rounds of planning: first, then "trees" or "full" when rank 0 asks."""
    what = "planning a save"
    decision = leader_round(ch, "first", first, lambda ms: decide_first(kept.leader if kept is not None else None, ms, txn), wait,
                            what=what, first=True)
    if "trees" in decision:
        assert local is not None and kept is not None
        send = b""
        if comm.rank in decision["trees"]:
            send = json.dumps(remap(local.tree, kept.gids), separators=(",", ":")).encode("utf-8")
        lead = kept.leader
        decision = leader_round(ch, "trees", send,
                                lambda ms: _decide_trees(lead, ms, txn),  # type: ignore[arg-type]
                                wait, what=what, first=False)
    elif "full" in decision:
        assert local is not None
        message = full_message(local.rows, local.tree, local.layout, local.tree_digest)

        def keep(lead: _Leader) -> None:
            with _CACHE_LOCK:
                _LEADERS[scope] = lead

        decision = leader_round(ch, "full", message,
                                lambda ms: decide_full(comm.world_size, ms, txn, keep),
                                wait, what=what, first=False)
    return decision


def _planned(decision: dict[str, Any], scope: str, local: _Local, storage: Storage,
             spath: str, comm: Comm) -> Planned:
    """This rank's outcome from rank 0's decision (keeps a full plan for repeat saves)."""
    if "error" in decision:
        raise CheckpointError(f"collective save to {spath!r} aborted before writing: "
                              f"{decision['error']}")
    if "plan" in decision:
        where = {path_key(p): g for g, p in enumerate(decision["paths"])}
        with _CACHE_LOCK:
            kept = _Kept(local.layout, decision["plan"].encode("utf-8"),
                         [where[path_key(r[0])] for r in local.rows], set(decision["solo"]),
                         _LEADERS.pop(scope, None) if comm.rank == 0 else None)
            _CACHE[scope] = kept
    else:
        with _CACHE_LOCK:
            kept = _CACHE[scope]
    for it, g in zip(local.items, kept.gids):
        it.id = g
    mine = my_share(decode_plan(kept.plan), comm.rank, local.items, local.holders, kept.solo)
    tree, items = local.tree, local.items
    if kept.leader is not None:  # rank 0 builds the index: the union of every rank's state
        tree, items = kept.leader.merged, _union_items(kept.leader, local.items)
    txn = commit.Transaction(storage, spath, decision["workdir"], bool(decision["replace"]))
    return Planned(tree, items, mine, txn, decision["token"])


def my_share(plan: WriterPlan, rank: int, items: Sequence[TensorItem], holders: Sequence[Any],
             solo: set[int]) -> list[TensorItem]:
    """The items this rank writes (global ids): its own boxes, what ``plan`` gives it, and
    the plain tensors only it holds (``solo``)."""
    chosen = plan.items_written_by(rank)
    return [it for it, h in zip(items, holders)
            if (h is not None and tuple(h) == (rank,)) or it.id in chosen
            or (h is None and it.id in solo)]


def _union_items(lead: _Leader, local: Sequence[TensorItem]) -> list[TensorItem]:
    """Every item of the union in global id order (placeholders for other ranks' keys)."""
    have = {it.id: it for it in local}
    out = []
    for g, (path, (kind, dtype, shape)) in enumerate(zip(lead.paths, lead.meta)):
        it = have.get(g)
        if it is None:
            it = TensorItem(id=g, path=decode_key_path(path), value=None, kind=kind, dtype=dtype,
                            shape=tuple(shape), offsets=(0,) * len(shape), replicated=False)
        out.append(it)
    return out
