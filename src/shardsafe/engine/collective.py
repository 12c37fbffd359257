"""The distributed phases of a save: plan together, agree on begin, commit in two phases.

``engine.pipeline`` calls these when the group has more than one rank:

* **plan** (caller's thread, process-group collectives, like any training
  collective): each rank flattens its state, localises DTensors and reports what it
  holds; rank 0 plans who writes what (``plan.distribute``), checks the target path,
  picks the transaction token and broadcasts the decision. A rank that fails here
  (an unsavable value) reports its error instead, and every rank raises.
* **begin / commit / abort** (any thread; the c10d Store only, never the process
  group): rank 0 creates the working directory and says so; every rank writes its own
  data file into it; each rank then sends its chunk entries (JSON) to rank 0, which
  publishes the index only if every rank succeeded within ``timeout``, and tells the
  others. A rank that died or raised leaves no commit, and the others raise
  ``CheckpointTimeoutError``/``CheckpointError`` instead of hanging.

Store keys live under ``shardsafe/<group>/<token>/``; the token is unique per save.
"""

from __future__ import annotations

import json
import logging
import math
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..comm import Channel, Comm
from ..comm.channel import announce, gather, get, missing_ranks, receive, timeout_error
from ..errors import CheckpointError
from ..format import index as fmt
from ..format.tree import Node, render_path
from ..plan.distribute import decode_plan, decode_report, encode_plan, plan_writers
from ..plan.distribute import encode_report
from ..plan.flatten import TensorItem, flatten
from ..plan.sharding import everywhere, localize, make_report, my_share
from ..storage import Storage
from . import commit

if TYPE_CHECKING:
    from .pipeline import PreparedSave

log = logging.getLogger("shardsafe")


def default_timeout() -> float:
    """Seconds a rank waits for the others (``SHARDSAFE_TIMEOUT``, default 600)."""
    return float(os.environ.get("SHARDSAFE_TIMEOUT", "600"))


@dataclass(slots=True)
class Planned:
    """This rank's outcome of the planning collective."""

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
                    overwrite: bool, check_metadata: Any) -> Planned:
    """The planning collective (caller's thread): every rank of ``comm`` calls it.

    Raises:
        TypeError: this rank's state holds a value that cannot be saved.
        CheckpointError: another rank failed to prepare, or the path is not writable.
    """
    local_error: BaseException | None = None
    try:
        check_metadata()  # the same metadata everywhere: every rank raises the same error
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


# ----------------------------------------------------------------------------- store side


def begin(prep: PreparedSave) -> None:
    """Rank 0 creates the working directory; the others wait (bounded) until it has."""
    ch = prep.channel
    assert ch is not None
    if prep.comm.rank == 0:
        commit.begin(prep.txn)
        ch.set("begun", b"1")
        return
    if get(ch, "begun", prep.timeout) != b"1":
        raise CheckpointError(f"the coordinator (rank 0) failed to start the save to "
                              f"{prep.txn.final!r}")


def encode_entries(by_item: dict[int, list[fmt.ChunkEntry]], files: list[fmt.FileEntry]) -> bytes:
    """JSON bytes of one rank's chunk and file entries (what it sends to rank 0)."""
    body = {"files": [[f.name, f.size, f.data_start, f.rank] for f in files],
            "chunks": [[i, c.file, c.offset, c.nbytes, list(c.offsets), list(c.shape),
                        list(c.checksums)] for i, cs in by_item.items() for c in cs]}
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def decode_entries(data: bytes) -> tuple[dict[int, list[fmt.ChunkEntry]], list[fmt.FileEntry]]:
    """Inverse of ``encode_entries``."""
    body = json.loads(data.decode("utf-8"))
    by_item: dict[int, list[fmt.ChunkEntry]] = {}
    for i, name, off, nbytes, offsets, shape, sums in body["chunks"]:
        by_item.setdefault(i, []).append(
            fmt.ChunkEntry(name, off, nbytes, tuple(offsets), tuple(shape), tuple(sums)))
    return by_item, [fmt.FileEntry(*f) for f in body["files"]]


def check_coverage(items: Sequence[TensorItem],
                   parts: Sequence[tuple[dict[int, list[fmt.ChunkEntry]], list[fmt.FileEntry]]]) -> None:
    """Raises CheckpointError unless every tensor's chunks hold exactly its elements."""
    count: dict[int, int] = {}
    for by_item, _ in parts:
        for i, cs in by_item.items():
            count[i] = count.get(i, 0) + sum(math.prod(c.shape) for c in cs)
    for it in items:
        if count.get(it.id, 0) != math.prod(it.shape):
            raise CheckpointError(f"the ranks' chunks of {render_path(it.path)!r} hold "
                                  f"{count.get(it.id, 0)} elements, its global shape "
                                  f"{list(it.shape)} needs {math.prod(it.shape)}")


def commit_save(prep: PreparedSave, entries: bytes, build_index: Any) -> None:
    """The two-phase commit; every rank calls it once its files are durable.

    Rank 0 publishes the index only if every rank sent its entries within the timeout,
    then waits (bounded) until the others have read its verdict: it usually hosts the
    store, and leaving at once could cut them off from the answer.

    Raises:
        CheckpointTimeoutError: a rank (or the coordinator) did not answer in time.
        CheckpointError: some rank failed; nothing was committed.
    """
    ch = prep.channel
    assert ch is not None
    if prep.comm.rank != 0:
        prep.reported = True
        gather(ch, "chunks", b"R" + entries, prep.timeout, dst=0)
        try:
            # waits a little longer than rank 0 does, so that its verdict (naming the rank
            # that failed) normally arrives before this rank's own timeout would fire
            get(ch, "gathered", prep.timeout + min(0.1 * prep.timeout + 0.5, 10.0))
        except CheckpointError:
            ch.set(f"result/read/{ch.rank}", b"1")  # rank 0 need not wait for us
            raise
        verdict = receive(ch, "result", prep.timeout)  # rank 0 writes the index meanwhile
        if verdict != b"ok":
            raise CheckpointError(verdict.decode("utf-8", "replace"))
        return
    msgs = gather(ch, "chunks", b"R" + entries, prep.timeout, dst=0) or []
    readers = [r for r, m in enumerate(msgs) if r and m is not None and m[:1] == b"R"]
    try:
        ch.set("gathered", b"1")
        missing = missing_ranks(msgs)
        if missing:
            raise timeout_error("chunk entries", prep.timeout, missing, prep.comm.world_size)
        failed = [(r, m[1:].decode("utf-8", "replace")) for r, m in enumerate(msgs) if m[:1] == b"E"]
        if failed:
            raise CheckpointError(f"rank {failed[0][0]} failed: {failed[0][1]}")
        parts = [decode_entries(m[1:]) for m in msgs]
        check_coverage(prep.items, parts)
        commit.finish(prep.txn, build_index(prep, parts))
    except BaseException as e:
        _announce_failure(prep, e, readers)
        raise
    prep.reported = True
    _finish_announcing(ch, b"ok", readers, prep.timeout)


def _announce_failure(prep: PreparedSave, error: BaseException,
                      readers: Sequence[int] | None = None) -> None:
    """Rank 0: tells every waiting rank that the save failed (and why).

    ``readers``: how many ranks will read the verdict (None when rank 0 failed before
    it could know: the keys are then left in the store rather than freed too early).
    """
    ch = prep.channel
    assert ch is not None
    prep.reported = True
    ch.set("begun", b"E")
    ch.set("gathered", b"1")
    verdict = (f"collective save to {prep.txn.final!r} not committed: "
               f"{type(error).__name__}: {error}").encode("utf-8", "replace")
    if readers is None:
        ch.set("result", verdict)
    else:
        _finish_announcing(ch, verdict, readers, prep.timeout)


def _finish_announcing(ch: Channel, verdict: bytes, readers: Sequence[int], timeout: float) -> None:
    """Rank 0: publishes the verdict, waits until ``readers`` have read it, frees the keys."""
    if not announce(ch, "result", verdict, readers, timeout):
        log.warning("%d rank(s) did not read the save verdict within %g s", len(readers), timeout)
        return
    ch.delete("begun")
    ch.delete("gathered")


def abort(prep: PreparedSave, error: BaseException | None) -> None:
    """After a failure on this rank: make sure nothing commits and nobody waits for us.

    Rank 0 announces the failure and removes the working directory; another rank that
    has not sent its entries yet sends its error instead, so rank 0 aborts at once.
    """
    ch = prep.channel
    assert ch is not None
    text = f"{type(error).__name__}: {error}" if error is not None else "aborted"
    try:
        if prep.comm.rank == 0:
            if not prep.reported:
                _announce_failure(prep, error or CheckpointError("aborted"))
        elif not prep.reported:
            prep.reported = True
            gather(ch, "chunks", b"E" + text.encode("utf-8", "replace"), prep.timeout, dst=0)
    except CheckpointError as e:  # the store is gone too; the original error matters more
        log.warning("could not tell the other ranks that this save failed: %s", e)


# ----------------------------------------------------------------------------- load side


def read_index_collective(storage: Storage, spath: str, comm: Comm) -> fmt.Index:
    """Rank 0 reads and validates the index once and broadcasts its bytes; all decode.

    With many ranks this replaces N index reads and N x files size checks (a metadata
    storm on shared file systems, N GETs on object stores) with one. When rank 0 fails,
    every other rank reads the index itself, so it raises the very same error.
    """
    message, error = None, None
    if comm.rank == 0:
        try:
            raw, index = commit.read_index_bytes(storage, spath)
            message = b"R" + raw
        except CheckpointError as e:
            error, message = e, b"E"
    data = comm.broadcast_bytes(message, src=0)
    if error is not None:
        raise error
    if comm.rank == 0:
        return index
    if data[:1] != b"R":
        return commit.read_index(storage, spath)
    return fmt.decode_index(data[1:])
