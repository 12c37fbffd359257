"""Values of the c10d store: at most ``MAX_VALUE`` bytes each.

The store carries agreements between ranks: verdicts, hellos, a rank's report to rank 0.
Its server is one process (usually on rank 0's host), so nothing whose size grows with
the job may be sent through it to every rank: the index of a load travels by the
process group's broadcast (its small global part) and by each rank's ranged reads of
storage (its own part), see docs/concepts/index-parts.md.

What remains are messages between one rank and rank 0 whose size follows the state,
not the job (a rank's chunk entries when it commits, the plan share of a state with
100,000 tensors). One of those may exceed ``MAX_VALUE``; it is then stored as pieces of
at most ``MAX_VALUE`` bytes under ``<key>/~piece/<i>`` and, last, a short header under
``<key>`` itself, so that "``key`` exists" still means "the whole message is there".
A value that happens to begin like a header is stored as pieces too, so a header is
never mistaken for a message. Pure functions: ``comm.torch_comm.StoreChannel`` applies
them.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from ..errors import CheckpointError

MAX_VALUE = 1_000_000  # bytes: the largest value ever set in the store (1 MB)
MAGIC = b"\x00shardsafe:pieces\x00"
_HEAD = struct.Struct("<QQ")  # number of pieces, total length
HEADER_SIZE = len(MAGIC) + _HEAD.size


def piece_key(key: str, i: int) -> str:
    """The store key of piece ``i`` of the message under ``key``."""
    return f"{key}/~piece/{i}"


def split(key: str, value: bytes, limit: int = MAX_VALUE) -> list[tuple[str, bytes]]:
    """The ``(key, value)`` pairs to set, in order, for ``value`` under ``key``: the value
    itself, or its pieces followed by the header."""
    if len(value) <= limit and not value.startswith(MAGIC):
        return [(key, value)]
    count = max(1, -(-len(value) // limit))
    view = memoryview(value)
    out = [(piece_key(key, i), bytes(view[i * limit : (i + 1) * limit])) for i in range(count)]
    out.append((key, MAGIC + _HEAD.pack(count, len(value))))
    return out


def pieces_of(stored: bytes) -> int | None:
    """The number of pieces a stored value announces, or None for a plain value."""
    if len(stored) != HEADER_SIZE or not stored.startswith(MAGIC):
        return None
    return int(_HEAD.unpack_from(stored, len(MAGIC))[0])


def join(key: str, stored: bytes, pieces: Sequence[bytes]) -> bytes:
    """The message whose header is ``stored`` from its ``pieces`` (in order).

    Raises:
        CheckpointError: the pieces do not add up to the announced length (a store that
            lost a key, or a writer that is not shardsafe).
    """
    count, total = _HEAD.unpack_from(stored, len(MAGIC))
    out = b"".join(pieces)
    if len(pieces) != count or len(out) != total:
        raise CheckpointError(f"store message {key!r}: {len(pieces)} piece(s) of {len(out)} bytes, "
                              f"its header announced {count} of {total}")
    return out
