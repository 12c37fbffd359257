"""The collective index read of a load: rank 0 reads the index once, every rank decodes it.

With many ranks this replaces N index reads and N x files size checks (a metadata
storm on shared file systems, N GETs on object stores) with one message through the
c10d store, bounded by ``timeout`` like every collective step (``comm.rounds``).
"""

from __future__ import annotations

from .. import knobs
from ..comm import Comm, next_namespace
from ..comm.rounds import broadcast_from_leader, join, leave
from ..errors import CheckpointError
from ..format.index.objects import Index
from ..format.index.versions import decode_index
from ..storage import Storage
from . import commit


def read_index_collective(storage: Storage, spath: str, comm: Comm,
                          timeout: float | None = None) -> Index:
    """Rank 0 reads and validates the index once and sends its bytes; all decode.

    When rank 0 fails, every other rank reads the index itself, so it raises the very
    same error.

    Raises:
        CheckpointTimeoutError: a rank did not join within ``timeout`` seconds (default
            ``SHARDSAFE_TIMEOUT``); the message names it.
    """
    wait = knobs.timeout() if timeout is None else float(timeout)
    ch = comm.channel(next_namespace(comm, "load"))
    join(ch)
    message, error, index = None, None, None
    if comm.rank == 0:
        try:
            raw, index = commit.read_index_bytes(storage, spath)
            message = b"R" + raw
        except CheckpointError as e:
            error, message = e, b"E"
    try:
        data = broadcast_from_leader(ch, message, wait, what="reading the index of a load")
    finally:
        leave(ch)
    if error is not None:
        raise error
    if index is not None:
        return index
    if data[:1] != b"R":
        return commit.read_index(storage, spath)
    return decode_index(data[1:])
