"""Comm over a torch.distributed process group, and a Channel over its c10d Store.

This module (with ``comm/__init__``) is the only place in shardsafe that calls
torch.distributed. Messages are bytes carried in uint8 tensors; nothing is pickled
(``all_gather_object`` and friends would unpickle whatever a peer sends).
"""

from __future__ import annotations

import datetime
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..errors import CheckpointError
from . import store_values
from .base import JsonCollectives
from .channel import Channel

_LEN = struct.Struct("<Q")


def _store_error(e: BaseException, key: str) -> CheckpointError:
    return CheckpointError(f"lost contact with the coordination store while waiting for {key!r} "
                           f"(the rank hosting it, usually rank 0, may have died): {e}")


class StoreChannel:
    """A Channel over a c10d Store (TCPStore under torchrun), safe from any thread.

    Each operation borrows a connection of its own to the store (``_Connections``: clones
    of it, ``Store.clone()``, reused by every channel of this process), so a blocking
    ``wait`` neither stalls other threads' store traffic (the training thread's included)
    nor makes anyone poll. A connection whose wait timed out is dropped: the server may
    still answer that wait later. Stores that cannot be cloned are polled with ``check``
    instead. Keys are under ``prefix``. No value set is longer than
    ``store_values.MAX_VALUE`` (1 MB): a longer message is set in pieces.
    """

    def __init__(self, store: dist.Store, rank: int, world_size: int, prefix: str = "") -> None:
        self.rank = rank
        self.world_size = world_size
        self._base, self._prefix = store, prefix
        self._pool = _connections(store)  # None: the store cannot be cloned, so it is polled
        self._pieces: dict[str, int] = {}  # long messages set or read here -> their piece count

    @contextmanager
    def _store(self) -> Iterator[dist.Store]:
        """A connection for one operation (given back when it ends without an error)."""
        if self._pool is None:
            yield self._keyed(self._base)
            return
        with self._pool.borrow() as conn:
            yield self._keyed(conn)

    def _keyed(self, store: dist.Store) -> dist.Store:
        return dist.PrefixStore(self._prefix, store) if self._prefix else store

    def set(self, key: str, value: bytes) -> None:
        """Sets ``key``; a value above ``store_values.MAX_VALUE`` bytes goes in pieces."""
        pairs = store_values.split(key, bytes(value))
        try:
            with self._store() as store:
                for k, v in pairs:
                    store.set(k, v)
        except dist.DistError as e:
            raise _store_error(e, key) from None
        if len(pairs) > 1:
            self._pieces[key] = len(pairs) - 1

    def _check(self, keys: Sequence[str]) -> list[bool]:
        try:
            with self._store() as store:
                if store.check(list(keys)):  # "all present": narrow down only if not
                    return [True] * len(keys)
                return [store.check([k]) for k in keys] if len(keys) > 1 else [False]
        except dist.DistError as e:
            raise _store_error(e, keys[0]) from None

    def wait(self, keys: Sequence[str], timeout: float) -> list[bool]:
        if not keys:
            return []
        if self._pool is None:
            return _poll(self._check, keys, timeout)
        start = time.monotonic()
        try:
            with self._store() as store:
                store.wait(list(keys), datetime.timedelta(seconds=max(timeout, 0.001)))
            return [True] * len(keys)
        except dist.DistStoreError as e:  # its connection is dropped, not given back
            if time.monotonic() - start < 0.9 * timeout:  # not a timeout: the store failed
                raise _store_error(e, keys[0]) from None
        except dist.DistError as e:
            raise _store_error(e, keys[0]) from None
        return self._check(keys)

    def fetch(self, keys: Sequence[str]) -> list[bytes]:
        try:
            with self._store() as store:
                out = [bytes(v) for v in store.multi_get(list(keys))] if keys else []
                for i, (k, v) in enumerate(zip(keys, out)):
                    n = store_values.pieces_of(v)
                    if n is not None:
                        parts = store.multi_get([store_values.piece_key(k, j) for j in range(n)])
                        out[i] = store_values.join(k, v, [bytes(p) for p in parts])
                        self._pieces[k] = n
                return out
        except dist.DistError as e:
            raise _store_error(e, keys[0]) from None

    def delete(self, key: str) -> None:
        """Removes ``key`` (and its pieces, when it was a long message)."""
        try:
            with self._store() as store:
                n = self._pieces.pop(key, None)
                if n is None and store.check([key]):  # set by another rank, never read here
                    n = store_values.pieces_of(bytes(store.get(key)))
                for j in range(n or 0):
                    store.delete_key(store_values.piece_key(key, j))
                store.delete_key(key)
        except dist.DistError as e:
            raise _store_error(e, key) from None


class _Connections:
    """This process's idle connections to one store (clones of it), shared by every channel.

    An operation borrows an idle one and gives it back when it ends without an error; a
    new connection is made only when every one is in use. Connecting anew for every
    channel (several per collective save) cost a round trip each, and now and then a
    5-second stall of the store's server while it accepted the connection.
    """

    def __init__(self, base: dist.Store, first: dist.Store) -> None:
        self.base = base
        self.idle = [first]
        self.lock = threading.Lock()

    @contextmanager
    def borrow(self) -> Iterator[dist.Store]:
        with self.lock:
            conn = self.idle.pop() if self.idle else None
        if conn is None:
            conn = self.base.clone()
        yield conn  # an error inside drops the connection: it may still get a late answer
        with self.lock:
            self.idle.append(conn)


_POOLS: weakref.WeakKeyDictionary[Any, _Connections] = weakref.WeakKeyDictionary()
_POOLS_LOCK = threading.Lock()


def _connections(store: dist.Store) -> _Connections | None:
    """The shared connections to ``store``; None when it cannot be cloned."""
    with _POOLS_LOCK:
        pool = _POOLS.get(store)
        if pool is None:
            try:
                pool = _POOLS[store] = _Connections(store, store.clone())
            except (AttributeError, RuntimeError, NotImplementedError, TypeError):
                return None
        return pool


def _forget_connections() -> None:
    """After ``fork``: the parent's connections are its sockets; the child makes its own."""
    global _POOLS, _POOLS_LOCK
    _POOLS, _POOLS_LOCK = weakref.WeakKeyDictionary(), threading.Lock()


os.register_at_fork(after_in_child=_forget_connections)


def _poll(check: Callable[[Sequence[str]], list[bool]], keys: Sequence[str],
          timeout: float) -> list[bool]:
    """Polls ``check`` (with back-off) until every key exists or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while True:
        present = check(keys)
        if all(present) or time.monotonic() >= deadline:
            return present
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.05)


_GROUPS: dict[int, Any] = {}  # every group a TorchComm has seen (its id stays unique)


class TorchComm(JsonCollectives):
    """Collectives over ``process_group`` (default: the world group) on byte strings.

    Args:
        process_group: The group whose ranks take part; None for the default group.
        store: The store for channels; default: the store the default group was
            initialised with (what torchrun sets up).
    """

    bulk = True  # byte collectives run on the process group

    def __init__(self, process_group: dist.ProcessGroup | None = None,
                 store: dist.Store | None = None) -> None:
        self.group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        backend = str(dist.get_backend(process_group))
        # gloo moves CPU tensors; a pure NCCL group needs them on the current GPU
        cpu_ok = "gloo" in backend or backend.startswith("cpu:") or ",cpu" in backend
        self.device = torch.device("cpu") if cpu_ok or not torch.cuda.is_available() else \
            torch.device("cuda", torch.cuda.current_device())
        self._store = store
        pg = process_group or c10d._get_default_group()
        self._prefix = f"shardsafe/{pg.group_name}/"
        # names this very group object (a re-initialised world is a new one) in the
        # per-process collective counters and plan caches; _GROUPS keeps ids unique
        _GROUPS.setdefault(id(pg), pg)
        self.scope = f"{self._prefix}{id(pg)}"

    # ------------------------------------------------------------------ collectives
    def barrier(self) -> None:
        # a tiny all_reduce is a barrier that every backend implements the same way
        t = torch.zeros(1, dtype=torch.int64, device=self.device)
        dist.all_reduce(t, group=self.group)

    def allreduce_max(self, values: Sequence[int]) -> list[int]:
        t = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return [int(v) for v in t.cpu().tolist()]

    def _global(self, group_rank: int) -> int:
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes:
        if self.rank == src and data is None:
            raise ValueError("the broadcast source must provide data")
        n = torch.tensor([len(data) if self.rank == src else 0],  # type: ignore[arg-type]
                         dtype=torch.int64, device=self.device)
        dist.broadcast(n, self._global(src), group=self.group)
        size = int(n.item())
        if self.rank == src:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device) if size \
                else torch.empty(0, dtype=torch.uint8, device=self.device)
        else:
            buf = torch.empty(size, dtype=torch.uint8, device=self.device)
        if size:
            dist.broadcast(buf, self._global(src), group=self.group)
        return bytes(data) if self.rank == src else buf.cpu().numpy().tobytes()

    def gather_bytes(self, data: bytes, dst: int = 0) -> list[bytes] | None:
        # every rank's buffer must have the same length: agree on the longest, and carry
        # each real length in an 8-byte prefix
        n = torch.tensor([len(data) + _LEN.size], dtype=torch.int64, device=self.device)
        dist.all_reduce(n, op=dist.ReduceOp.MAX, group=self.group)
        size = int(n.item())
        mine = np.zeros(size, dtype=np.uint8)
        mine[: _LEN.size] = np.frombuffer(_LEN.pack(len(data)), dtype=np.uint8)
        mine[_LEN.size : _LEN.size + len(data)] = np.frombuffer(data, dtype=np.uint8)
        t = torch.from_numpy(mine).to(self.device)
        out = [torch.empty(size, dtype=torch.uint8, device=self.device)
               for _ in range(self.world_size)] if self.rank == dst else None
        dist.gather(t, out, dst=self._global(dst), group=self.group)
        if out is None:
            return None
        result = []
        for b in out:
            raw = b.cpu().numpy().tobytes()
            (length,) = _LEN.unpack_from(raw)
            result.append(raw[_LEN.size : _LEN.size + length])
        return result

    # ------------------------------------------------------------------ store side
    def channel(self, namespace: str) -> Channel:
        store = self._store if self._store is not None else c10d._get_default_store()
        return StoreChannel(store, self.rank, self.world_size, prefix=self._prefix + namespace + "/")

    def group_rank(self, global_rank: int) -> int:
        if self.group is None:
            return global_rank if 0 <= global_rank < self.world_size else -1
        try:
            return dist.get_group_rank(self.group, global_rank)
        except ValueError:  # not a member of this group
            return -1
