"""Collective saves: plan together, write in parallel, commit in two phases.

Every rank of the group calls ``save`` at the same point of its program. Then:

1. **Plan** (caller's thread, process-group collectives): each rank flattens its
   state, turns DTensors into its local boxes and reports what it holds; rank 0 plans
   who writes what (``plan.distribute``), picks the transaction token, creates the
   working directory and broadcasts the decision. A rank that fails here (an
   unsavable value) reports its error instead, and every rank raises.
2. **Write** (any thread, no collectives): each rank writes its own data file
   ``data-r<rank>-000.safetensors`` into the shared working directory and fsyncs it.
3. **Commit** (any thread, store only): each rank sends its chunk entries (JSON) to
   rank 0 through the c10d Store; rank 0 waits for all of them, writes the index and
   renames the directory into place; the others wait for its verdict. Every wait is
   bounded by ``timeout``: a rank that died or raised leaves no commit, and the others
   get ``CheckpointTimeoutError``/``CheckpointError`` instead of hanging.

Phases 2 and 3 never touch the process group, so they may run on a background thread
while training collectives continue (async saves).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import __version__
from ..comm import Channel, Comm
from ..comm.base import missing_ranks, timeout_error
from ..engine import commit, staging
from ..engine.buffers import HostBuffer
from ..errors import CheckpointError
from ..format import index as fmt
from ..format.tree import Node, render_path
from ..plan.distribute import decode_plan, decode_report, encode_plan, encode_report, plan_writers
from ..plan.flatten import TensorItem, flatten
from ..plan.layout import FilePlan, chunk_entries, data_file_name, plan_file
from ..plan.sharding import Holders, everywhere, localize, make_report, my_share
from ..storage import Storage, storage_for

log = logging.getLogger("shardsafe")

BLOCK_SIZE = 16 << 20  # the checksum block of api.save (partial reads verify whole blocks)


def default_timeout() -> float:
    """Seconds a rank waits for the others in a collective save (``SHARDSAFE_TIMEOUT``, 600)."""
    return float(os.environ.get("SHARDSAFE_TIMEOUT", "600"))


@dataclass(slots=True)
class CollectiveSave:
    """One rank's part of a planned collective save.

    Attributes:
        comm: The group.
        storage: Backend of the checkpoint path.
        txn: The transaction (same working directory on every rank).
        token: Unique name of this save (store namespace, working directory suffix).
        tree: The structure tree (rank 0's is the one committed).
        items: All tensor items of this rank's state (DTensors localised).
        mine: The items this rank writes.
        plan: Layout of this rank's data file; None when it writes nothing.
        metadata: User metadata for the index.
        timeout: Seconds any wait for another rank may take.
    """

    comm: Comm
    storage: Storage
    txn: commit.Transaction
    token: str
    tree: Node
    items: list[TensorItem]
    mine: list[TensorItem]
    plan: FilePlan | None
    metadata: dict[str, Any]
    timeout: float


def _fail(rank: int, message: str) -> CheckpointError:
    return CheckpointError(f"collective save aborted: rank {rank} failed: {message}")


def _coordinate(comm: Comm, storage: Storage, spath: str, overwrite: bool, reports: list[bytes],
                plain: list[tuple[int, int]], metadata: dict[str, Any]) -> dict[str, Any]:
    """Rank 0: plan the writers, open the transaction; returns the decision to broadcast."""
    for r, raw in enumerate(reports):
        if raw[:1] == b"E":
            return {"error": f"rank {r}", "message": raw[1:].decode("utf-8", "replace")}
    try:
        fmt.encode_index(fmt.Index(tree={"t": "dict", "k": [], "v": []}, tensors=(), files=(),
                                   block_size=BLOCK_SIZE, metadata=metadata))  # JSON-able?
        plan = plan_writers(comm.world_size, [decode_report(raw[1:]) for raw in reports], plain)
        token = uuid.uuid4().hex[:16]
        txn = commit.plan_transaction(storage, spath, overwrite=overwrite, token=token)
        commit.begin(txn)
    except (ValueError, TypeError, CheckpointError, OSError) as e:
        return {"error": "rank 0", "message": f"{type(e).__name__}: {e}"}
    return {"token": token, "workdir": txn.workdir, "replace": txn.replace,
            "plan": encode_plan(plan).decode("utf-8")}


def prepare(state: Mapping[str, Any], path: str, comm: Comm, *, overwrite: bool = False,
            metadata: Mapping[str, Any] | None = None, storage_options: dict | None = None,
            timeout: float | None = None) -> CollectiveSave:
    """Phase 1, collective: flatten, localise, plan together, open the transaction.

    Raises:
        TypeError: this rank's state holds a value that cannot be saved.
        CheckpointError: another rank failed to prepare, or the path is not writable.
    """
    storage, spath = storage_for(path, storage_options)
    md = dict(metadata or {})
    local_error: BaseException | None = None
    try:
        tree, items = flatten(state)
        holders = localize(items, comm.group_rank)
        message = b"R" + encode_report(make_report(comm.rank, items, holders))
    except BaseException as e:  # noqa: BLE001 - reported to the other ranks, then re-raised
        local_error = e
        message = b"E" + f"{type(e).__name__}: {e}".encode("utf-8", "replace")
    gathered = comm.gather_bytes(message, dst=0)
    decision_bytes = None
    if comm.rank == 0:
        assert gathered is not None
        plain = everywhere(items, holders) if local_error is None else []
        decision_bytes = json.dumps(_coordinate(comm, storage, spath, overwrite, gathered,
                                                plain, md)).encode("utf-8")
    decision = json.loads(comm.broadcast_bytes(decision_bytes, src=0).decode("utf-8"))
    if local_error is not None:
        raise local_error
    if "error" in decision:
        raise CheckpointError(f"collective save to {path!r} aborted before writing: "
                              f"{decision['error']} failed: {decision['message']}")
    txn = commit.Transaction(storage, spath, decision["workdir"], bool(decision["replace"]))
    mine = my_share(decode_plan(decision["plan"].encode("utf-8")), comm.rank, items, holders)
    fplan = plan_file(data_file_name(comm.rank), mine) if mine else None
    return CollectiveSave(comm, storage, txn, decision["token"], tree, items, mine, fplan, md,
                          default_timeout() if timeout is None else float(timeout))


# ----------------------------------------------------------------------------- write


def stage(cs: CollectiveSave) -> HostBuffer | None:
    """Copies this rank's share into a fresh page-aligned host buffer."""
    if cs.plan is None:
        return None
    buf = HostBuffer(cs.plan.layout.size)
    staging.stage(cs.plan, buf.array)
    return buf


def write(cs: CollectiveSave, buf: HostBuffer | None) -> bytes:
    """Phase 2: checksums and writes this rank's file (durable); returns its chunk entries."""
    if cs.plan is None:
        return json.dumps({"files": [], "chunks": []}).encode("utf-8")
    p, s = cs.plan, cs.storage
    sums = staging.checksums(p, buf.array, BLOCK_SIZE)
    s.write(s.join(cs.txn.workdir, p.name), [buf.view(0, p.layout.size)])
    entries = chunk_entries(p, sums)
    body = {"files": [[p.name, p.layout.size, p.layout.data_start]],
            "chunks": [[i, c.offset, c.nbytes, list(c.offsets), list(c.shape), list(c.checksums)]
                       for i, c in entries.items()]}
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


# ----------------------------------------------------------------------------- commit


def assemble_index(cs: CollectiveSave, payloads: list[bytes]) -> bytes:
    """Rank 0: the index bytes from every rank's chunk entries.

    Raises:
        CheckpointError: the chunks of a tensor do not cover it exactly (the ranks'
            DTensor layouts disagree).
    """
    chunks: dict[int, list[fmt.ChunkEntry]] = {it.id: [] for it in cs.items}
    files = []
    for rank, raw in enumerate(payloads):
        body = json.loads(raw.decode("utf-8"))
        for name, size, data_start in body["files"]:
            files.append(fmt.FileEntry(name, size, data_start, rank))
        name = body["files"][0][0] if body["files"] else ""
        for i, off, nbytes, offsets, shape, sums in body["chunks"]:
            chunks[i].append(fmt.ChunkEntry(name, off, nbytes, tuple(offsets), tuple(shape),
                                            tuple(sums)))
    tensors = []
    for it in cs.items:
        cl = sorted(chunks[it.id], key=lambda c: c.offsets)
        if sum(math.prod(c.shape) for c in cl) != math.prod(it.shape):
            raise CheckpointError(f"the saved chunks of {render_path(it.path)!r} do not cover its "
                                  f"global shape {list(it.shape)} exactly once")
        tensors.append(fmt.TensorEntry(it.path, it.kind, it.dtype, it.shape, tuple(cl)))
    index = fmt.Index(tree=cs.tree, tensors=tuple(tensors), files=tuple(files),
                      block_size=BLOCK_SIZE, world_size=cs.comm.world_size, created=time.time(),
                      metadata=cs.metadata, library=f"shardsafe {__version__}")
    return fmt.encode_index(index)


def commit_collective(cs: CollectiveSave, payload: bytes | None, error: str | None = None) -> None:
    """Phase 3: the two-phase commit over the store (safe from background threads).

    Every rank calls it once its file is durable (``payload``) or after failing
    (``error``). Rank 0 publishes the index only if every rank succeeded in time, then
    waits (bounded) until every surviving rank has read its verdict: it usually hosts
    the store, and leaving at once could cut the others off from the answer.

    Raises:
        CheckpointTimeoutError: a rank (or the coordinator) did not answer in time.
        CheckpointError: some rank failed; nothing was committed.
    """
    ch = cs.comm.channel(cs.token)
    message = b"E" + error.encode("utf-8", "replace") if error is not None else b"R" + payload
    if cs.comm.rank != 0:
        ch.gather("chunks", message, cs.timeout, dst=0)
        if error is not None:
            return  # the caller raises its own error; rank 0 aborts
        try:
            # waits a little longer than rank 0 does, so that its verdict (naming the rank
            # that failed) normally arrives before this rank's own timeout would fire
            ch.get("gathered", cs.timeout + min(0.1 * cs.timeout + 0.5, 10.0))
            verdict = ch.get("result", cs.timeout)  # rank 0 writes the index meanwhile
        finally:
            ch.add("read", 1)
        if verdict != b"ok":
            raise CheckpointError(verdict.decode("utf-8", "replace"))
        return
    msgs = ch.gather("chunks", message, cs.timeout, dst=0)
    assert msgs is not None
    waiting = sum(1 for m in msgs[1:] if m is not None and m[:1] == b"R")  # will read the verdict
    try:
        ch.set("gathered", b"1")
        missing = missing_ranks(msgs)
        if missing:
            raise timeout_error("chunk entries", cs.timeout, missing, cs.comm.world_size)
        failed = [(r, m[1:].decode("utf-8", "replace")) for r, m in enumerate(msgs) if m[:1] == b"E"]
        if failed:
            raise _fail(*failed[0])
        commit.finish(cs.txn, assemble_index(cs, [m[1:] for m in msgs]))
    except BaseException as e:
        ch.set("result", f"collective save to {cs.txn.final!r} not committed: {e}".encode())
        commit.abort(cs.txn)
        _await_readers(ch, waiting, cs.timeout)
        raise
    ch.set("result", b"ok")
    _await_readers(ch, waiting, cs.timeout)


def _await_readers(ch: Channel, n: int, timeout: float) -> None:
    """Rank 0: waits until ``n`` ranks have read the verdict, then frees the keys."""
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while ch.add("read", 0) < n:
        if time.monotonic() >= deadline:
            log.warning("%d rank(s) did not read the save verdict within %g s", n, timeout)
            return
        time.sleep(delay)
        delay = min(2 * delay, 0.05)
    for key in ("gathered", "result", "read"):
        ch.delete(key)


def save(state: Mapping[str, Any], path: str, comm: Comm, *, overwrite: bool = False,
         metadata: Mapping[str, Any] | None = None, storage_options: dict | None = None,
         timeout: float | None = None) -> None:
    """A synchronous collective save (see the module docstring for the protocol)."""
    cs = prepare(state, path, comm, overwrite=overwrite, metadata=metadata,
                 storage_options=storage_options, timeout=timeout)
    buf = None
    try:
        buf = stage(cs)
        payload = write(cs, buf)
    except BaseException as e:
        report_failure(cs, e)
        raise
    finally:
        if buf is not None:
            buf.close()
    commit_collective(cs, payload)


def report_failure(cs: CollectiveSave, error: BaseException) -> None:
    """Tells rank 0 that this rank failed (so nothing commits); never masks ``error``."""
    try:
        commit_collective(cs, None, error=f"{type(error).__name__}: {error}")
    except CheckpointError as e:  # the caller re-raises the original failure
        log.warning("could not report a failed save to the other ranks: %s", e)
