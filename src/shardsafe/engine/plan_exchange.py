"""The planning exchange of a collective save (caller's thread, process-group collectives).

Every rank flattens its state, localises DTensors and reports what it holds; rank 0
plans who writes what (``plan.distribute``), checks the target path, picks the
transaction token and broadcasts the decision. A rank that fails here (an unsavable
value, metadata that is not JSON) reports its error instead, and every rank raises.
Like any training collective, every rank of the group must call ``plan_collective``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..comm import Comm
from ..errors import CheckpointError
from ..format.tree import Node
from ..plan.distribute import decode_plan, decode_report, encode_plan, encode_report, plan_writers
from ..plan.flatten import TensorItem, flatten
from ..plan.sharding import everywhere, localize, make_report, my_share
from ..storage import Storage
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


def _decide(comm: Comm, storage: Storage, spath: str, overwrite: bool, messages: Sequence[bytes],
            plain: list[tuple[int, int]]) -> dict[str, Any]:
    """Rank 0: plans the writers and the transaction; returns the decision to broadcast."""
    for r, raw in enumerate(messages):
        if raw[:1] == b"E":
            return {"error": f"rank {r} failed: {raw[1:].decode('utf-8', 'replace')}"}
    try:
        plan = plan_writers(comm.world_size, [decode_report(raw[1:]) for raw in messages], plain)
        token = uuid.uuid4().hex[:16]
        txn = commit.plan_transaction(storage, spath, overwrite=overwrite, token=token)
    except (ValueError, TypeError, CheckpointError, OSError) as e:
        return {"error": f"rank 0 failed: {type(e).__name__}: {e}"}
    return {"token": token, "workdir": txn.workdir, "replace": txn.replace,
            "plan": encode_plan(plan).decode("utf-8")}


def plan_collective(state: Mapping[str, Any], storage: Storage, spath: str, comm: Comm, *,
                    overwrite: bool, metadata: Mapping[str, Any]) -> Planned:
    """The planning collective (caller's thread): every rank of ``comm`` calls it.

    Raises:
        TypeError: this rank's state holds a value that cannot be saved.
        CheckpointError: another rank failed to prepare, or the path is not writable.
    """
    local_error: BaseException | None = None
    try:
        check_metadata(metadata)  # the same metadata everywhere: every rank raises the same error
        tree, items = flatten(state)
        holders = localize(items, comm.group_rank)
        message = b"R" + encode_report(make_report(comm.rank, items, holders))
    except BaseException as e:  # noqa: BLE001 - reported to the other ranks, then re-raised
        local_error = e
        message = b"E" + f"{type(e).__name__}: {e}".encode("utf-8", "replace")
    gathered = comm.gather_bytes(message, dst=0)
    decision_bytes = None
    if comm.rank == 0:
        plain = everywhere(items, holders) if local_error is None else []
        decision = _decide(comm, storage, spath, overwrite, gathered or [], plain)
        decision_bytes = json.dumps(decision).encode("utf-8")
    decision = json.loads(comm.broadcast_bytes(decision_bytes, src=0).decode("utf-8"))
    if local_error is not None:
        raise local_error
    if "error" in decision:
        raise CheckpointError(f"collective save to {spath!r} aborted before writing: "
                              f"{decision['error']}")
    txn = commit.Transaction(storage, spath, decision["workdir"], bool(decision["replace"]))
    mine = my_share(decode_plan(decision["plan"].encode("utf-8")), comm.rank, items, holders)
    return Planned(tree, items, mine, txn, decision["token"])
