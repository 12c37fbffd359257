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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..comm import Comm, next_namespace
from ..comm.channel import Channel
from ..comm.rounds import join, leader_round, leave
from ..errors import CheckpointError
from ..format.tree import Node
from ..plan.distribute import decode_plan, decode_report, encode_plan, encode_report, plan_writers
from ..plan.flatten import TensorItem, flatten
from ..plan.sharding import everywhere, localize, make_report, my_share
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
# group scope -> (this rank's digest, plan bytes, every rank's digest on rank 0)
_CACHE: dict[str, tuple[bytes, bytes, list[bytes] | None]] = {}


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


def layout_digest(report: bytes, holders: Sequence[Any], items: Sequence[TensorItem]) -> bytes:
    """16 bytes naming this rank's layout: its report, holders and box positions."""
    h = hashlib.blake2b(report, digest_size=16)
    h.update(json.dumps([[list(x) if x is not None else None for x in holders],
                         [list(it.offsets or ()) for it in items]]).encode("utf-8"))
    return h.digest()


def _errors(messages: Sequence[bytes]) -> dict[str, Any] | None:
    for r, raw in enumerate(messages):
        if raw[:1] == b"E":
            return {"error": f"rank {r} failed: {raw[1:].decode('utf-8', 'replace')}"}
    return None


def _transaction(storage: Storage, spath: str, overwrite: bool) -> dict[str, Any]:
    """Rank 0: picks the token and plans the transaction (a decision's common part)."""
    token = uuid.uuid4().hex[:16]
    txn = commit.plan_transaction(storage, spath, overwrite=overwrite, token=token)
    return {"token": token, "workdir": txn.workdir, "replace": txn.replace}


def _decide_first(scope: str, storage: Storage, spath: str, overwrite: bool,
                  messages: Sequence[bytes]) -> dict[str, Any]:
    """Rank 0, first round: "same" (reuse the kept plans) or "full" (send reports)."""
    error = _errors(messages)
    if error is not None:
        return error
    with _CACHE_LOCK:
        kept = _CACHE.get(scope)
    if kept is None or kept[2] is None or any(m[:1] != b"D" or m[1:] != d
                                              for m, d in zip(messages, kept[2])):
        return {"full": True}
    try:
        return {"same": True, **_transaction(storage, spath, overwrite)}
    except (ValueError, TypeError, CheckpointError, OSError) as e:
        return {"error": f"rank 0 failed: {type(e).__name__}: {e}"}


def _decide(comm: Comm, storage: Storage, spath: str, overwrite: bool, messages: Sequence[bytes],
            plain: list[tuple[int, int]]) -> dict[str, Any]:
    """Rank 0, full round: plans the writers and the transaction."""
    error = _errors(messages)
    if error is not None:
        return error
    try:
        plan = plan_writers(comm.world_size, [decode_report(raw[17:]) for raw in messages], plain)
        decision = _transaction(storage, spath, overwrite)
    except (ValueError, TypeError, CheckpointError, OSError) as e:
        return {"error": f"rank 0 failed: {type(e).__name__}: {e}"}
    return {**decision, "plan": encode_plan(plan).decode("utf-8"),
            "digests": [raw[1:17].hex() for raw in messages]}


def _prepare_local(state: Mapping[str, Any], comm: Comm, metadata: Mapping[str, Any]
                   ) -> tuple[Any, bytes, bytes]:
    """Flattens and localises this rank's state: ((tree, items, holders), report, digest)."""
    check_metadata(metadata)  # the same metadata everywhere: every rank raises the same error
    tree, items = flatten(state)
    holders = localize(items, comm.group_rank)
    report = encode_report(make_report(comm.rank, items, holders))
    return (tree, items, holders), report, layout_digest(report, holders, items)


def plan_collective(state: Mapping[str, Any], storage: Storage, spath: str, comm: Comm, *,
                    overwrite: bool, metadata: Mapping[str, Any],
                    timeout: float | None = None) -> Planned:
    """The planning collective (caller's thread): every rank of ``comm`` calls it.

    Raises:
        TypeError: this rank's state holds a value that cannot be saved.
        CheckpointError: another rank failed to prepare, or the path is not writable.
        CheckpointTimeoutError: a rank did not join within ``timeout`` seconds (default
            ``SHARDSAFE_TIMEOUT``); the message names it. Nothing was written.
    """
    wait = knobs.timeout() if timeout is None else float(timeout)
    scope = str(getattr(comm, "scope", ""))
    ch = _Counting(comm.channel(next_namespace(comm, "plan")))
    join(ch)
    local_error: BaseException | None = None
    try:
        local, report, digest = _prepare_local(state, comm, metadata)
        with _CACHE_LOCK:
            kept = _CACHE.get(scope)
        first = (b"D" if kept is not None and kept[0] == digest else b"N") + digest
    except BaseException as e:  # noqa: BLE001 - reported to the other ranks, then re-raised
        local_error = e
        first = b"E" + f"{type(e).__name__}: {e}".encode("utf-8", "replace")
    what = "planning a save"
    decision: dict[str, Any] = {}
    try:
        decision = leader_round(ch, "first", first,
                                lambda ms: _decide_first(scope, storage, spath, overwrite, ms),
                                wait, what=what, first=True)
        if decision.get("full"):  # (never after an error: that is decided in round one)
            plain = everywhere(local[1], local[2]) if comm.rank == 0 else []
            decision = leader_round(ch, "full", b"R" + digest + report,
                                    lambda ms: _decide(comm, storage, spath, overwrite, ms, plain),
                                    wait, what=what, first=False)
    finally:
        leave(ch)
        STATS.last, STATS.full = ch.bytes, "plan" in decision
        STATS.total += ch.bytes
    if local_error is not None:
        raise local_error
    return _planned(decision, scope, digest, local, storage, spath, comm)


def _planned(decision: dict[str, Any], scope: str, digest: bytes, local: Any, storage: Storage,
             spath: str, comm: Comm) -> Planned:
    """This rank's outcome from rank 0's decision (keeps a full plan for repeat saves)."""
    if "error" in decision:
        raise CheckpointError(f"collective save to {spath!r} aborted before writing: "
                              f"{decision['error']}")
    tree, items, holders = local
    if "plan" in decision:
        plan_bytes = decision["plan"].encode("utf-8")
        everyone = [bytes.fromhex(d) for d in decision["digests"]] if comm.rank == 0 else None
        with _CACHE_LOCK:
            _CACHE[scope] = (digest, plan_bytes, everyone)
    else:
        with _CACHE_LOCK:
            plan_bytes = _CACHE[scope][1]
    txn = commit.Transaction(storage, spath, decision["workdir"], bool(decision["replace"]))
    mine = my_share(decode_plan(plan_bytes), comm.rank, items, holders)
    return Planned(tree, items, mine, txn, decision["token"])
