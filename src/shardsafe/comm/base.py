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
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..errors import CheckpointTimeoutError


class Channel(Protocol):
    """Namespaced, thread-safe byte messages between the ranks of one save or load."""

    rank: int
    world_size: int

    def set(self, key: str, value: bytes) -> None:
        """Publishes ``value`` under ``key`` (visible to every rank)."""
        ...

    def get(self, key: str, timeout: float) -> bytes:
        """Waits up to ``timeout`` seconds for ``key`` and returns its value.

        Raises:
            CheckpointTimeoutError: the key did not appear in time.
        """
        ...

    def delete(self, key: str) -> None:
        """Removes ``key`` if present (frees store memory)."""
        ...

    def add(self, key: str, amount: int) -> int:
        """Atomically adds ``amount`` to the counter ``key`` (0 if absent); returns the sum."""
        ...

    def gather(self, key: str, value: bytes, timeout: float,
               dst: int = 0) -> list[bytes | None] | None:
        """Sends ``value`` to rank ``dst``; there returns every rank's value (rank order).

        On ``dst`` the list holds None for each rank that did not send within
        ``timeout`` (the caller decides what that means); elsewhere returns None.
        """
        ...


class Comm(Protocol):
    """Collectives over a group of ranks.

    The primitives move bytes (never pickled objects); ``gather`` and ``broadcast``
    carry JSON-like values over them (with more than one rank, values come back as
    JSON decodes them: tuples become lists).
    """

    rank: int
    world_size: int

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


def _missing(ranks: Sequence[int]) -> str:
    shown = ", ".join(map(str, ranks[:16]))
    return shown + (f" and {len(ranks) - 16} more" if len(ranks) > 16 else "")


def poll_until(have: Callable[[list[str]], list[bool]], keys: list[str],
               timeout: float) -> list[bool]:
    """Polls ``have`` until every key is present or ``timeout`` passes; returns presence.

    Polling (rather than a blocking store wait) keeps the store connection free for
    other threads and never leaves a timed-out request behind on the socket.
    """
    deadline = time.monotonic() + timeout
    present = [False] * len(keys)
    pending = list(range(len(keys)))
    delay = 0.0005
    while True:
        found = have([keys[i] for i in pending])
        for i, ok in zip(pending, found):
            present[i] = ok
        pending = [i for i in pending if not present[i]]
        if not pending or time.monotonic() >= deadline:
            return present
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def poll_gather(channel: Channel, key: str, value: bytes, timeout: float, dst: int,
                have: Callable[[list[str]], list[bool]],
                fetch: Callable[[str], bytes]) -> list[bytes | None] | None:
    """Shared gather logic: everyone sets ``key/<rank>``; ``dst`` polls until all are there."""
    channel.set(f"{key}/{channel.rank}", value)
    if channel.rank != dst:
        return None
    keys = [f"{key}/{r}" for r in range(channel.world_size)]
    present = poll_until(have, keys, timeout)
    out = [fetch(k) if ok else None for k, ok in zip(keys, present)]
    for k, ok in zip(keys, present):
        if ok:
            channel.delete(k)
    return out


def missing_ranks(values: Sequence[bytes | None]) -> list[int]:
    """Ranks whose entry of a channel gather is None (they did not send in time)."""
    return [r for r, v in enumerate(values) if v is None]


def timeout_error(what: str, timeout: float, missing: Sequence[int], world_size: int) -> CheckpointTimeoutError:
    """The error for ranks that did not answer within ``timeout``."""
    return CheckpointTimeoutError(
        f"waited {timeout:g} s for rank(s) {_missing(missing)} of {world_size} ({what}): a rank "
        f"died, raised, or is much slower")


def announce(channel: Channel, key: str, value: bytes, readers: int, timeout: float) -> bool:
    """Publishes ``value`` and waits (bounded) until ``readers`` ranks have ``receive``d it.

    The publisher usually hosts the store: leaving at once could cut the readers off
    from the answer. Frees the key afterwards. Returns False if not all read in time.
    """
    channel.set(key, value)
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while channel.add(key + "/read", 0) < readers:
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(2 * delay, 0.05)
    channel.delete(key)
    channel.delete(key + "/read")
    return True


def receive(channel: Channel, key: str, timeout: float) -> bytes:
    """Waits (bounded) for an ``announce``d value and acknowledges it."""
    try:
        return channel.get(key, timeout)
    finally:
        channel.add(key + "/read", 1)


class LocalChannel:
    """An in-memory Channel for world size 1 (and for unit tests of the protocol)."""

    def __init__(self, rank: int = 0, world_size: int = 1,
                 shared: dict[str, bytes] | None = None,
                 cond: threading.Condition | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self._data = {} if shared is None else shared
        self._cond = cond or threading.Condition()

    def set(self, key: str, value: bytes) -> None:
        with self._cond:
            self._data[key] = bytes(value)
            self._cond.notify_all()

    def get(self, key: str, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        with self._cond:
            while key not in self._data:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CheckpointTimeoutError(f"waited {timeout:g} s for key {key!r}")
                self._cond.wait(left)
            return self._data[key]

    def delete(self, key: str) -> None:
        with self._cond:
            self._data.pop(key, None)

    def _have(self, keys: list[str]) -> list[bool]:
        with self._cond:
            return [k in self._data for k in keys]

    def add(self, key: str, amount: int) -> int:
        with self._cond:
            value = int(self._data.get(key, b"0")) + amount
            self._data[key] = str(value).encode()
            self._cond.notify_all()
            return value

    def gather(self, key: str, value: bytes, timeout: float,
               dst: int = 0) -> list[bytes | None] | None:
        return poll_gather(self, key, value, timeout, dst, self._have,
                           lambda k: self.get(k, timeout))


class SingleProcessComm:
    """World size 1 without any process group: collectives are identities.

    ``gather``/``broadcast`` return the very objects given (no JSON round trip).
    """

    rank = 0
    world_size = 1

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


SingleProcess = SingleProcessComm  # the name the save pipeline's seam first used
