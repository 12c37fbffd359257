"""The two-phase commit of a collective save, through the c10d Store only.

Safe on any thread (it never touches the process group, so it may run on an async
save's background thread while training collectives go on):

* **begin**: rank 0 creates the working directory and says so; the others wait
  (bounded) before writing their data files into it.
* **commit**: each rank sends its chunk entries (binary columns) to rank 0, which checks that
  together they cover every tensor exactly, publishes the index only if every rank
  succeeded within ``timeout``, and tells the others. Entries larger than ``STORE_MAX``
  (a rank of a very large job, or many small tensors) do not go through the store: the
  rank writes them into the working directory (``entries-r<rank>``) and sends their name,
  size and CRC32C; rank 0 reads, checks and removes the file before it publishes.
* **abort**: a rank that failed tells the others, so nothing commits and nobody
  waits for it. A rank that died leaves no commit either: the others raise
  ``CheckpointTimeoutError``/``CheckpointError`` instead of hanging.

Store keys live under ``shardsafe/<group>/<token>/``; the token is unique per save.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Protocol

from ...comm import Channel, Comm
from ...comm.channel import announce, gather, get, missing_ranks, receive, timeout_error
from ...errors import CheckpointError, CorruptCheckpointError
from ...format.checksum import crc32c
from . import transaction as commit
from .entries import Entries
from .entries import decode as decode_entries
from .entries import encode as encode_entries
from .names import entries_file_name

log = logging.getLogger("shardsafe")

STORE_MAX = 1 << 20  # the most bytes of entries one rank sends through the store


class Participant(Protocol):
    """What the protocol needs of a rank's save (``engine.save.prepare.PreparedSave`` is one)."""

    txn: commit.Transaction
    comm: Comm
    channel: Channel | None
    timeout: float
    reported: bool

    def index_bytes(self, parts: Sequence[Entries]) -> bytes:
        """The index of the whole save from every rank's entries."""


def begin(prep: Participant) -> None:
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


def commit_collective(prep: Participant, local: Entries) -> None:
    """The two-phase commit; every rank calls it once its files are durable.

    ``local`` is this rank's part of the index (``prepared.local_entries``), sent to
    rank 0 as binary columns (``entries.encode``); rank 0 builds the index from all
    parts (``prepared.build_index``, which refuses parts that do not cover every tensor
    exactly) before it publishes it.

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
        message = _message(prep, encode_entries(local))
        prep.reported = True
        gather(ch, "chunks", message, prep.timeout, dst=0)
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
    msgs = gather(ch, "chunks", b"R", prep.timeout, dst=0) or []  # rank 0's own entries stay here
    readers = [r for r, m in enumerate(msgs) if r and m is not None and m[:1] in (b"R", b"F")]
    try:
        ch.set("gathered", b"1")
        missing = missing_ranks(msgs)
        if missing:
            raise timeout_error("chunk entries", prep.timeout, missing, prep.comm.world_size)
        failed = [(r, m[1:].decode("utf-8", "replace")) for r, m in enumerate(msgs) if m[:1] == b"E"]
        if failed:
            raise CheckpointError(f"rank {failed[0][0]} failed: {failed[0][1]}")
        parts = [local] + [_entries(prep, r, m) for r, m in enumerate(msgs) if r]
        commit.finish(prep.txn, prep.index_bytes(parts))
    except BaseException as e:
        _announce_failure(prep, e, readers)
        raise
    prep.reported = True
    _finish_announcing(ch, b"ok", readers, prep.timeout)


def _message(prep: Participant, entries: bytes) -> bytes:
    """What a rank sends rank 0: its entries (``R``), or where it wrote them (``F``: name,
    size and CRC32C of a file in the working directory) when they exceed ``STORE_MAX``."""
    if len(entries) <= STORE_MAX:
        return b"R" + entries
    txn = prep.txn
    name = entries_file_name(prep.comm.rank)
    txn.storage.write(txn.storage.join(txn.workdir, name), [memoryview(entries)])
    return b"F" + json.dumps({"name": name, "size": len(entries), "crc32c": crc32c(entries)}).encode()


def _entries(prep: Participant, rank: int, message: bytes) -> Entries:
    """Rank 0: the entries rank ``rank`` sent, read back (checked, then removed) from the
    working directory when it wrote them there."""
    if message[:1] == b"R":
        return decode_entries(message[1:])
    ref = json.loads(message[1:])
    txn = prep.txn
    name = entries_file_name(rank)
    path = txn.storage.join(txn.workdir, name)
    if ref.get("name") != name:
        raise CorruptCheckpointError(f"rank {rank} sent entries named {ref.get('name')!r}, not {name}")
    size = txn.storage.size(path)
    if size != ref["size"]:
        raise CorruptCheckpointError(f"{path}: {size} bytes, rank {rank} wrote {ref['size']}")
    data = bytearray(size)
    txn.storage.read_into(path, 0, memoryview(data))
    if crc32c(data) != ref["crc32c"]:
        raise CorruptCheckpointError(f"{path}: CRC32C mismatch: rank {rank}'s entries changed on the way")
    txn.storage.delete(path)  # not part of the checkpoint
    return decode_entries(data)  # read once, decoded in place (no second copy)


def _announce_failure(prep: Participant, error: BaseException,
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


def abort(prep: Participant, error: BaseException | None) -> None:
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
