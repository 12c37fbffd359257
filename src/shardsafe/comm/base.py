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

import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

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

    def gather(self, key: str, value: bytes, timeout: float, dst: int = 0) -> list[bytes] | None:
        """Sends ``value`` to rank ``dst``; there returns every rank's value (rank order).

        Raises:
            CheckpointTimeoutError: on ``dst``, some rank did not send in time (the
                message names the missing ranks).
        """
        ...


class Comm(Protocol):
    """Collectives over a group of ranks, on bytes (never pickled objects)."""

    rank: int
    world_size: int

    def barrier(self) -> None:
        """Blocks until every rank of the group arrives."""
        ...

    def gather(self, data: bytes, dst: int = 0) -> list[bytes] | None:
        """Every rank's ``data`` on rank ``dst`` (rank order); None elsewhere."""
        ...

    def broadcast(self, data: bytes | None, src: int = 0) -> bytes:
        """``data`` of rank ``src``, returned on every rank."""
        ...

    def channel(self, namespace: str) -> Channel:
        """A store-backed channel whose keys live under ``namespace`` (unique per save)."""
        ...

    def group_rank(self, global_rank: int) -> int:
        """The rank in this group of a rank of the default (world) group; -1 if absent."""
        ...


def _missing(ranks: Sequence[int]) -> str:
    shown = ", ".join(map(str, ranks[:16]))
    return shown + (f" and {len(ranks) - 16} more" if len(ranks) > 16 else "")


def poll_gather(channel: Channel, key: str, value: bytes, timeout: float, dst: int,
                have: Callable[[list[str]], list[bool]],
                fetch: Callable[[str], bytes]) -> list[bytes] | None:
    """Shared gather logic: everyone sets ``key/<rank>``; ``dst`` polls until all are there.

    Polling (rather than a blocking store wait) keeps the store connection free for
    other threads and never leaves a timed-out request behind on the socket.
    """
    channel.set(f"{key}/{channel.rank}", value)
    if channel.rank != dst:
        return None
    keys = [f"{key}/{r}" for r in range(channel.world_size)]
    deadline = time.monotonic() + timeout
    pending = list(range(channel.world_size))
    delay = 0.0005
    while True:
        present = have([keys[r] for r in pending])
        pending = [r for r, ok in zip(pending, present) if not ok]
        if not pending:
            break
        if time.monotonic() >= deadline:
            raise CheckpointTimeoutError(
                f"waited {timeout:g} s for rank(s) {_missing(pending)} of {channel.world_size} "
                f"(key {key!r}): a rank died, raised, or is much slower")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    out = [fetch(k) for k in keys]
    for k in keys:
        channel.delete(k)
    return out


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

    def gather(self, key: str, value: bytes, timeout: float, dst: int = 0) -> list[bytes] | None:
        return poll_gather(self, key, value, timeout, dst, self._have,
                           lambda k: self.get(k, timeout))


class SingleProcessComm:
    """World size 1 without any process group: collectives are identities."""

    rank = 0
    world_size = 1

    def barrier(self) -> None:
        return None

    def gather(self, data: bytes, dst: int = 0) -> list[bytes] | None:
        return [bytes(data)]

    def broadcast(self, data: bytes | None, src: int = 0) -> bytes:
        if data is None:
            raise ValueError("broadcast from the only rank needs data")
        return bytes(data)

    def channel(self, namespace: str) -> Channel:
        return LocalChannel()

    def group_rank(self, global_rank: int) -> int:
        return 0 if global_rank == 0 else -1
