"""The collective index read of a load: rank 0 reads the index once, every rank decodes it.

With many ranks this replaces N index reads and N x files size checks (a metadata
storm on shared file systems, N GETs on object stores) with one broadcast.
"""

from __future__ import annotations

from ..comm import Comm
from ..errors import CheckpointError
from ..format import index as fmt
from ..storage import Storage
from . import commit


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
