"""Store channels: byte messages between the ranks of one save, safe from any thread.

A ``Channel`` is a namespaced key-value store with a blocking, bounded ``wait``; the
c10d Store implements it under torch.distributed (``torch_comm.StoreChannel``) and
``LocalChannel`` in memory. Everything a save needs is built from that here:
``get`` (one key), ``gather`` (every rank's message on one rank), and
``announce``/``receive`` (one verdict to many readers, who acknowledge it so that the
announcer, which usually hosts the store, does not leave before they have read it).
Every wait is bounded: a dead rank turns into ``CheckpointTimeoutError``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

from ..errors import CheckpointTimeoutError


class Channel(Protocol):
    """Namespaced byte messages between the ranks of one save (the primitives)."""

    rank: int
    world_size: int

    def set(self, key: str, value: bytes) -> None:
        """Publishes ``value`` under ``key`` (visible to every rank)."""
        ...

    def wait(self, keys: Sequence[str], timeout: float) -> list[bool]:
        """Blocks until every key exists or ``timeout`` seconds pass; returns which exist."""
        ...

    def fetch(self, keys: Sequence[str]) -> list[bytes]:
        """Values of keys known to exist."""
        ...

    def delete(self, key: str) -> None:
        """Removes ``key`` if present (frees store memory)."""
        ...


def _ranks(ranks: Sequence[int]) -> str:
    shown = ", ".join(map(str, ranks[:16]))
    return shown + (f" and {len(ranks) - 16} more" if len(ranks) > 16 else "")


def timeout_error(what: str, timeout: float, missing: Sequence[int], world_size: int) -> CheckpointTimeoutError:
    """The error for ranks that did not answer within ``timeout``."""
    return CheckpointTimeoutError(
        f"waited {timeout:g} s for rank(s) {_ranks(missing)} of {world_size} ({what}): a rank "
        f"died, raised, or is much slower")


def get(channel: Channel, key: str, timeout: float) -> bytes:
    """The value of ``key`` once some rank sets it.

    Raises:
        CheckpointTimeoutError: it did not appear within ``timeout`` seconds.
    """
    if not channel.wait([key], timeout)[0]:
        raise CheckpointTimeoutError(f"waited {timeout:g} s for {key!r} from another rank: a "
                                     f"rank died, raised, or is much slower")
    return channel.fetch([key])[0]


def gather(channel: Channel, key: str, value: bytes, timeout: float,
           dst: int = 0) -> list[bytes | None] | None:
    """Sends ``value`` to rank ``dst``; there returns every rank's value (rank order).

    On ``dst`` the list holds None for each rank that did not send within ``timeout``
    (the caller decides what that means); elsewhere returns None.
    """
    channel.set(f"{key}/{channel.rank}", value)
    if channel.rank != dst:
        return None
    keys = [f"{key}/{r}" for r in range(channel.world_size)]
    present = channel.wait(keys, timeout)
    found = [k for k, ok in zip(keys, present) if ok]
    values = dict(zip(found, drain(channel, found)))
    return [values.get(k) for k in keys]


def drain(channel: Channel, keys: Sequence[str], batch: int = 256) -> Iterator[bytes]:
    """The values of ``keys`` (known to exist), in order, fetched ``batch`` at a time.

    Each key is deleted once fetched, and so are the keys left unread when the caller
    stops early (close the iterator), so a reader holds one batch at a time, not all.
    """
    done = 0
    try:
        for at in range(0, len(keys), batch):
            part = keys[at : at + batch]
            values = channel.fetch(part)
            for k in part:
                channel.delete(k)
            done = at + len(part)
            yield from values
    finally:
        for k in keys[done:]:
            channel.delete(k)


def missing_ranks(values: Sequence[bytes | None]) -> list[int]:
    """Ranks whose entry of a ``gather`` is None (they did not send in time)."""
    return [r for r, v in enumerate(values) if v is None]


def announce(channel: Channel, key: str, value: bytes, readers: Sequence[int],
             timeout: float) -> bool:
    """Publishes ``value`` and waits (bounded) until every rank in ``readers`` has read it.

    Frees the keys afterwards. Returns False if not every reader acknowledged in time
    (the keys are then left in place for late readers).
    """
    return not announce_missing(channel, key, value, readers, timeout)


def announce_missing(channel: Channel, key: str, value: bytes, readers: Sequence[int],
                     timeout: float) -> list[int]:
    """``announce``, returning the readers that did not acknowledge within ``timeout``."""
    channel.set(key, value)
    readers = list(readers)
    acks = [f"{key}/read/{r}" for r in readers]
    present = channel.wait(acks, timeout)
    if not all(present):
        return [r for r, ok in zip(readers, present) if not ok]
    for k in [key, *acks]:
        channel.delete(k)
    return []


def receive(channel: Channel, key: str, timeout: float) -> bytes:
    """Waits (bounded) for an ``announce``d value and acknowledges it.

    Raises:
        CheckpointTimeoutError: nothing was announced within ``timeout`` seconds.
    """
    try:
        return get(channel, key, timeout)
    finally:
        channel.set(f"{key}/read/{channel.rank}", b"1")


class LocalChannel:
    """An in-memory Channel: world size 1, and the ranks of unit tests (shared dict)."""

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

    def wait(self, keys: Sequence[str], timeout: float) -> list[bool]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not all(k in self._data for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return [k in self._data for k in keys]

    def fetch(self, keys: Sequence[str]) -> list[bytes]:
        with self._cond:
            return [self._data[k] for k in keys]

    def delete(self, key: str) -> None:
        with self._cond:
            self._data.pop(key, None)
