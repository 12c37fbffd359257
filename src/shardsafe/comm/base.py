"""The communication seam: what a save or load needs from the other ranks.

Two kinds of exchange exist, on purpose:

* ``Comm`` collectives (``gather``, ``broadcast``, ``barrier``) run on the caller's
  thread, in program order, on the training process group. Every rank calls them at the
  same point, exactly like a training collective.
* ``Channel`` exchanges go through a key-value store (the c10d Store under
  torch.distributed). They are safe from background threads because they never touch
  the process group, and every wait has a timeout, so a dead rank turns into
  ``CheckpointTimeoutError`` instead of a hang.

``SingleProcessComm`` (world size 1, no process group) implements both in memory.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from .channel import Channel, LocalChannel


class Comm(Protocol):
    """Collectives over a group of ranks.

    The primitives move bytes (never pickled objects); ``gather`` and ``broadcast``
    carry JSON-like values over them (with more than one rank, values come back as
    JSON decodes them: tuples become lists).
    """

    rank: int
    world_size: int
    bulk: bool
    """Whether ``broadcast_bytes`` and ``gather_bytes`` move bulk (megabytes: an index's
    head) over a transport made for it (a process group); False where they go through a
    key-value store, which should carry small values only (a load's ranks then read such
    payloads from storage themselves)."""

    def barrier(self) -> None:
        """Blocks until every rank of the group arrives."""
        ...

    def gather_bytes(self, data: bytes, dst: int = 0) -> list[bytes] | None:
        """Every rank's ``data`` on rank ``dst`` (rank order); None elsewhere."""
        ...

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes:
        """``data`` of rank ``src``, returned on every rank."""
        ...

    def gather(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Every rank's JSON-like ``obj`` on rank ``dst`` (rank order); None elsewhere."""
        ...

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """The JSON-like ``obj`` of rank ``src``, returned on every rank."""
        ...

    def allreduce_max(self, values: Sequence[int]) -> list[int]:
        """The element-wise maximum of every rank's ``values`` (how ranks agree on flags)."""
        ...

    def channel(self, namespace: str) -> Channel:
        """A store-backed channel whose keys live under ``namespace`` (unique per save)."""
        ...

    def group_rank(self, global_rank: int) -> int:
        """The rank in this group of a rank of the default (world) group; -1 if absent."""
        ...


def to_json(obj: Any) -> bytes:
    """JSON bytes of a value sent between ranks (NaN/inf allowed: they are Python's)."""
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def from_json(data: bytes) -> Any:
    return json.loads(data.decode("utf-8"))


class JsonCollectives:
    """``gather``/``broadcast`` of JSON-like values over the byte primitives."""

    rank: int

    def gather_bytes(self, data: bytes, dst: int = 0) -> list[bytes] | None:
        raise NotImplementedError

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes:
        raise NotImplementedError

    def gather(self, obj: Any, dst: int = 0) -> list[Any] | None:
        out = self.gather_bytes(to_json(obj), dst)
        return None if out is None else [from_json(b) for b in out]

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return from_json(self.broadcast_bytes(to_json(obj) if self.rank == src else None, src))


class SingleProcessComm:
    """World size 1 without any process group: collectives are identities.

    ``gather``/``broadcast`` return the very objects given (no JSON round trip).
    """

    rank = 0
    world_size = 1
    bulk = True  # nothing moves at all

    def barrier(self) -> None:
        return None

    def gather_bytes(self, data: bytes, dst: int = 0) -> list[bytes] | None:
        return [bytes(data)]

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes:
        if data is None:
            raise ValueError("broadcast from the only rank needs data")
        return bytes(data)

    def gather(self, obj: Any, dst: int = 0) -> list[Any] | None:
        return [obj]

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def allreduce_max(self, values: Sequence[int]) -> list[int]:
        return [int(v) for v in values]

    def channel(self, namespace: str) -> Channel:
        return LocalChannel()

    def group_rank(self, global_rank: int) -> int:
        return 0 if global_rank == 0 else -1


class ExternalRank:
    """A rank of a save that another system coordinates: it knows its place, and talks to
    no other rank itself.

    ``shardsafe.dcp`` writes through it: DCP's planner decides which rank writes what,
    gathers every rank's results and has one rank commit, so shardsafe's own collectives
    must never run; each of them raises ``RuntimeError``.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise RuntimeError("this save's ranks are coordinated outside shardsafe: no collective may run")

    barrier = gather_bytes = broadcast_bytes = gather = broadcast = _refuse
    allreduce_max = channel = group_rank = _refuse


_SEQ_LOCK = threading.Lock()
_SEQUENCES: dict[tuple[str, str], int] = {}


def next_namespace(comm: Comm, kind: str) -> str:
    """A store namespace for the next collective of ``kind`` on ``comm``'s group.

    Every rank counts its own calls, so the n-th save (or load) of a group uses the same
    namespace on every rank without any communication. A rank that skips a collective
    (it timed out on the others) leaves the group out of step: restart the job then, as
    after any collective timeout.
    """
    key = (str(getattr(comm, "scope", "")), kind)
    with _SEQ_LOCK:
        n = _SEQUENCES.get(key, 0) + 1
        _SEQUENCES[key] = n
    return f"{kind}/{n}"
