"""A Channel over JAX's coordination service: the key-value store of a ``jax.distributed`` job.

``jax.distributed.initialize`` connects every process to one coordination service (run
by process 0), whose key-value store and barriers are what JAX's own multi-host
utilities use. ``JaxChannel`` carries a save's or a load's store rounds over it exactly
as ``torch_comm.StoreChannel`` does over the c10d Store: safe from any thread (the
client's blocking calls release the GIL), every wait bounded, and no value above
``store_values.MAX_VALUE`` (1 MB) ever set: a longer message goes in pieces.

The client is JAX's internal ``DistributedRuntimeClient``
(``jax._src.distributed.global_state.client``); this module and ``comm.jax_comm`` are
the only places that touch it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from ..errors import CheckpointError
from . import store_values

MIN_WAIT_MS = 1  # the client refuses a zero timeout


def client() -> Any:
    """The coordination-service client of this process's ``jax.distributed`` job, or None
    when JAX is not imported or ``jax.distributed`` is not initialised (never imports JAX)."""
    import sys

    if "jax" not in sys.modules:
        return None
    from jax._src import distributed

    return distributed.global_state.client


def _status(e: BaseException) -> str:
    """The status code a coordination-service error starts with (``DEADLINE_EXCEEDED``...)."""
    return str(e).split(":", 1)[0].strip()


def _service_error(e: BaseException, key: str) -> CheckpointError:
    return CheckpointError(f"lost contact with JAX's coordination service while handling {key!r} "
                           f"(process 0, which hosts it, may have died): {str(e).splitlines()[0]}")


def _is_runtime_error(e: BaseException) -> bool:
    """Whether ``e`` is the client's error type (``jax.errors.JaxRuntimeError``)."""
    import jax

    return isinstance(e, jax.errors.JaxRuntimeError)


class JaxChannel:
    """A Channel whose keys live under ``prefix`` in the coordination service's store.

    Args:
        kv: The coordination-service client.
        prefix: The namespace of this channel's keys (unique per save or load).
        rank: This process's index in the job.
        world_size: Processes in the job.
    """

    def __init__(self, kv: Any, prefix: str, rank: int, world_size: int) -> None:
        self._kv, self._prefix = kv, prefix
        self.rank, self.world_size = rank, world_size
        self._seen: dict[str, bytes] = {}  # values a wait already fetched, until read
        self._lock = threading.Lock()

    def _key(self, key: str) -> str:
        return self._prefix + key

    def set(self, key: str, value: bytes) -> None:
        """Sets ``key``; a value above ``store_values.MAX_VALUE`` bytes goes in pieces."""
        for k, v in store_values.split(key, bytes(value)):
            try:
                self._kv.key_value_set_bytes(self._key(k), v, allow_overwrite=True)
            except RuntimeError as e:
                if not _is_runtime_error(e):
                    raise
                raise _service_error(e, key) from None

    def _try_get(self, key: str) -> bytes | None:
        try:
            return bytes(self._kv.key_value_try_get_bytes(self._key(key)))
        except RuntimeError as e:
            if not _is_runtime_error(e):
                raise
            if _status(e) == "NOT_FOUND":
                return None
            raise _service_error(e, key) from None

    def _blocking_get(self, key: str, seconds: float) -> bytes | None:
        ms = max(MIN_WAIT_MS, int(seconds * 1000))
        try:
            return bytes(self._kv.blocking_key_value_get_bytes(self._key(key), ms))
        except RuntimeError as e:
            if not _is_runtime_error(e):
                raise
            if _status(e) == "DEADLINE_EXCEEDED":
                return None
            raise _service_error(e, key) from None

    def wait(self, keys: Sequence[str], timeout: float) -> list[bool]:
        """Blocks until every key exists or ``timeout`` seconds pass; returns which exist."""
        deadline = time.monotonic() + timeout
        present = []
        for k in keys:
            with self._lock:
                if k in self._seen:
                    present.append(True)
                    continue
            left = deadline - time.monotonic()
            v = self._blocking_get(k, left) if left > 0 else self._try_get(k)
            if v is not None:
                with self._lock:
                    self._seen[k] = v
            present.append(v is not None)
        return present

    def fetch(self, keys: Sequence[str]) -> list[bytes]:
        """Values of keys known to exist (pieces of a long message joined)."""
        out = []
        for k in keys:
            with self._lock:
                v = self._seen.pop(k, None)
            if v is None:
                v = self._try_get(k)
            if v is None:
                raise CheckpointError(f"key {k!r} vanished from JAX's coordination service before it "
                                      f"was read")
            n = store_values.pieces_of(v)
            if n is not None:
                parts = [self._try_get(store_values.piece_key(k, j)) for j in range(n)]
                v = store_values.join(k, v, [p for p in parts if p is not None])
            out.append(v)
        return out

    def delete(self, key: str) -> None:
        """Removes ``key`` and its pieces (a key-value delete removes the whole directory)."""
        with self._lock:
            self._seen.pop(key, None)
        try:
            self._kv.key_value_delete(self._key(key))
        except RuntimeError as e:
            if not _is_runtime_error(e):
                raise
            if _status(e) != "NOT_FOUND":
                raise _service_error(e, key) from None
