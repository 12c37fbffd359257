"""The collective index read of a load: rank 0 reads what every rank needs, once.

With many ranks this replaces N reads of the same index (a metadata storm on shared
file systems, N GETs of one object on object stores) with one read by rank 0. The ranks
first agree through a bounded store round (``comm.rounds``: a rank that never joins
turns into ``CheckpointTimeoutError`` naming it, and nobody is left waiting in a
collective), whose values are a few bytes; the index bytes then travel by the process
group's broadcast, never through the c10d store (docs/concepts/index-parts.md).
"""

from __future__ import annotations

from typing import Any

from .. import knobs
from ..comm import Comm, next_namespace
from ..comm.rounds import Answer, join, leader_exchange, leave
from ..errors import CheckpointError
from ..format.index.objects import Index
from ..format.index.versions import decode_index
from ..storage import Storage
from . import commit


def read_index_collective(storage: Storage, spath: str, comm: Comm,
                          timeout: float | None = None) -> Index:
    """Rank 0 reads and validates the index once and broadcasts its bytes; all decode.

    When rank 0 fails, every other rank reads the index itself, so it raises the very
    same error.

    Raises:
        CheckpointTimeoutError: a rank did not join within ``timeout`` seconds (default
            ``SHARDSAFE_TIMEOUT``); the message names it.
    """
    wait = knobs.timeout() if timeout is None else float(timeout)
    raw, index, error = b"", None, None
    if comm.rank == 0:
        try:
            raw, index = commit.read_index_bytes(storage, spath)
        except CheckpointError as e:
            error = e
    verdict: dict[str, Any] = {"error": True} if error is not None else {"bytes": len(raw)}
    decision = _agree(comm, verdict, wait)
    if error is not None:
        raise error
    if "error" in decision:
        return commit.read_index(storage, spath)
    data = comm.broadcast_bytes(raw if comm.rank == 0 else None)
    if index is not None:
        return index
    if len(data) != decision["bytes"]:
        raise CheckpointError(f"received {len(data)} index bytes from rank 0, it announced "
                              f"{decision['bytes']}")
    return decode_index(data)


def _agree(comm: Comm, verdict: dict[str, Any], wait: float) -> dict[str, Any]:
    """The bounded round: every rank arrives (or every rank raises, naming the missing
    ones), and rank 0's verdict reaches all of them."""
    ch = comm.channel(next_namespace(comm, "load"))
    join(ch)
    try:
        return leader_exchange(ch, "index", b"", lambda _: Answer(verdict), wait,
                               what="reading the index of a load", first=True).decision
    finally:
        leave(ch)
