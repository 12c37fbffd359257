"""The planning exchange of a collective save (caller's thread, bounded store rounds).

Every rank flattens its state (its own ``PerRank`` entries only), localises DTensors
and describes what it holds (``plan.collective.report``); rank 0 joins the descriptions, plans who
writes what, checks the target path, picks the transaction token and answers every
rank (``plan.collective.answer``). A rank that fails here (an unsavable value, metadata that is
not JSON) reports its error instead, and every rank raises. Like any training
collective, every rank of the group must call ``plan_collective``; the exchange runs
through the c10d store (``comm.rounds``), so a rank that never calls it turns into
``CheckpointTimeoutError`` naming it within ``timeout``.

Rounds: a 49-byte hello from every rank (digests of its layout, shape and PerRank
values). When every layout equals the one of the group's last full exchange, rank 0
answers "same" and every rank reuses the share it kept, or first asks for the new
trees and values only. Otherwise a full round follows: each rank sends its report
(its own bytes and the shared boxes it leads as binary columns; its shape only when
rank 0 has no copy of that shape yet), and reads back only its own share of the plan.
``STATS`` counts the bytes this rank exchanged.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import knobs
from ...comm import Comm, next_namespace
from ...comm.channel import Channel
from ...comm.rounds import Answer, join, leader_exchange, leave
from ...errors import CheckpointError
from ...format.tree import Node, decode_key_path
from ...per_rank import own_entry
from ...plan.collective.answer import (Decision, Leader, decide_first, decide_full, decide_trees, in_ranks,
                           read_hellos, read_share, wanted)
from ...plan.flatten import TensorItem, flatten
from ...plan.localize import localize, localize_spanning
from ...plan.collective.report import Description, describe, hello, report
from ...plan.collective.union import Table
from ...plan.collective.writers import PlanError
from ...storage import Storage
from .. import commit
from ...format.index.container import check_metadata


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


@dataclass(slots=True)
class _Kept:
    """What a rank keeps from its group's last full exchange (cached planning)."""

    layout: bytes
    gids: list[int]  # local item id -> global id
    writes: list[int]  # local ids of the items this rank writes
    leader: Leader | None = None  # rank 0 only


@dataclass(slots=True)
class _Local:
    """This rank's flattened state and what it sends about it."""

    tree: Node
    items: list[TensorItem]
    desc: Description


def _prepare_local(state: Mapping[str, Any], comm: Comm, metadata: Mapping[str, Any]) -> _Local:
    """Flattens and localises this rank's state and describes it."""
    check_metadata(metadata)  # the same metadata everywhere: every rank raises the same error
    with own_entry():
        tree, items = flatten(state)
    holders = localize(items, comm.group_rank)
    localize_spanning(items, holders, comm.rank, comm.world_size)  # jax.distributed arrays
    return _Local(tree, items, describe(tree, items, holders, comm.rank))


def _transaction(storage: Storage, spath: str, overwrite: bool) -> Decision:
    """Rank 0: picks the token and plans the transaction (a decision's common part)."""
    try:
        token = uuid.uuid4().hex[:16]
        txn = commit.plan_transaction(storage, spath, overwrite=overwrite, token=token)
    except (ValueError, TypeError, CheckpointError, OSError) as e:
        return {"error": f"rank 0 failed: {type(e).__name__}: {e}"}
    return {"token": token, "workdir": txn.workdir, "replace": txn.replace}


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
        d = local.desc
        first = hello(kept is not None and kept.layout == d.layout, d.layout, d.shape.digest, d.values.digest)
    except BaseException as e:  # noqa: BLE001 - reported to the other ranks, then re-raised
        first = b"E" + f"{type(e).__name__}: {e}".encode("utf-8", "replace")
        local_error: BaseException | None = e
    else:
        local_error = None
    answer = Answer({})
    lead: list[Leader] = []
    try:
        answer = _rounds(ch, kept, local, first, wait, lambda: _transaction(storage, spath, overwrite),
                         lead)
    finally:
        leave(ch)
        STATS.last, STATS.full = ch.bytes, "plan" in answer.decision
        STATS.total += ch.bytes
    if local_error is not None:
        raise local_error
    assert local is not None
    return _planned(answer, scope, local, lead, storage, spath, comm)


def _rounds(ch: Channel, kept: _Kept | None, local: _Local | None, first: bytes, wait: float,
            txn: Callable[[], Decision], lead_out: list[Leader]) -> Answer:
    """The store rounds of planning: first, then "trees" or "full" when rank 0 asks."""
    what, rank = "planning a save", ch.rank
    lead = kept.leader if kept is not None else None
    seen: list[Any] = []

    def on_first(messages: Iterator[bytes]) -> Answer:
        seen.append(read_hellos(messages, ch.world_size))
        return Answer(decide_first(lead, seen[0], txn))

    decision = leader_exchange(ch, "first", first, on_first, wait, what=what, first=True).decision
    if "full" in decision:
        assert local is not None
        d = local.desc
        message = report(rank, d.boxes, d.shape.body if in_ranks(decision["shapes"], rank) else b"",
                         d.values.body)

        def on_full(messages: Iterator[bytes]) -> Answer:
            d, parts, new = decide_full(lead, seen[0], messages, txn)
            lead_out.extend([new] if new is not None else [])
            return Answer(d, parts)

        return leader_exchange(ch, "full", message, on_full, wait, what=what, first=False,
                               wanted=lambda a: wanted(d.shape.digest, d.boxes) if "plan" in a else [])
    if "trees" in decision:
        assert local is not None
        d = local.desc
        message = report(rank, None, d.shape.body if in_ranks(decision["shapes"], rank) else b"",
                         d.values.body if in_ranks(decision["values"], rank) else b"")
        decision = leader_exchange(
            ch, "trees", message,
            lambda ms: Answer(decide_trees(lead, seen[0], ms, txn)),  # type: ignore[arg-type]
            wait, what=what, first=False).decision
    return Answer(decision)


def _planned(answer: Answer, scope: str, local: _Local, lead: list[Leader], storage: Storage,
             spath: str, comm: Comm) -> Planned:
    """This rank's outcome from rank 0's decision (keeps a full plan's share for repeat saves)."""
    decision = answer.decision
    if "error" in decision:
        raise CheckpointError(f"collective save to {spath!r} aborted before writing: "
                              f"{decision['error']}")
    if "plan" in decision:
        kept = _keep(answer, local, comm.rank, lead[0] if lead else None, spath)
        with _CACHE_LOCK:
            _CACHE[scope] = kept
    else:
        with _CACHE_LOCK:
            kept = _CACHE[scope]
    for it, g in zip(local.items, kept.gids):
        it.id = g
    mine = my_share(kept, local.items)
    tree, items = local.tree, local.items
    if kept.leader is not None:  # rank 0 builds the index: the union of every rank's state
        tree, items = kept.leader.joined.tree, _union_items(kept.leader.joined.table, local.items)
    txn = commit.Transaction(storage, spath, decision["workdir"], bool(decision["replace"]))
    return Planned(tree, items, mine, txn, decision["token"])


def _keep(answer: Answer, local: _Local, rank: int, lead: Leader | None, spath: str) -> _Kept:
    """This rank's share of a full plan, in local item ids."""
    try:
        d = local.desc
        share = read_share(answer.decision, answer.parts, rank, d.shape.digest, d.boxes,
                           len(d.parts.value_ids))
    except PlanError as e:
        raise CheckpointError(f"collective save to {spath!r}: {e}") from None
    gids = np.zeros(len(local.items), dtype=np.int64)
    shape_ids = np.asarray(d.parts.shape_ids, dtype=np.int64)
    gids[shape_ids] = share.shape_gids
    gids[np.asarray(d.parts.value_ids, dtype=np.int64)] = share.value_gids
    writes = sorted(shape_ids[share.writes].tolist() + list(d.parts.value_ids))
    return _Kept(d.layout, gids.tolist(), writes, lead)


def my_share(kept: _Kept, items: Sequence[TensorItem]) -> list[TensorItem]:
    """The items this rank writes (its own boxes, the shared boxes and plain tensors the
    plan gives it, and its PerRank tensors), in item order."""
    return [items[i] for i in kept.writes]


def _union_items(table: Table, local: Sequence[TensorItem]) -> list[TensorItem]:
    """Every item of the union in global id order (placeholders for other ranks' keys)."""
    have = {it.id: it for it in local}
    out = []
    for g, (path, (kind, dtype, shape)) in enumerate(zip(table.paths, table.meta)):
        it = have.get(g)
        if it is None:
            it = TensorItem(id=g, path=decode_key_path(path), value=None, kind=kind, dtype=dtype,
                            shape=tuple(shape), offsets=(0,) * len(shape), replicated=False)
        out.append(it)
    return out
