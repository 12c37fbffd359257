"""Comm over a ``jax.distributed`` job: its processes are the ranks, its coordination
service the store.

A multi-process JAX job (a TPU pod slice, a GPU cluster, or N processes on one CPU
machine) has no torch.distributed process group; every process is connected to JAX's
coordination service instead (``jax.distributed.initialize``). ``JaxComm`` gives
shardsafe's collective planning, two-phase commit and agreements the same ``Comm``
interface over it: rank = ``jax.process_index()``, world = ``jax.process_count()``,
channels = ``comm.jax_channel.JaxChannel``, and the collectives (``barrier``,
``gather``, ``broadcast``, ``allreduce_max``) are bounded store rounds, so a process
that never arrives turns into ``CheckpointTimeoutError`` naming it within ``timeout``
instead of a hang. Values move through the store in pieces of at most 1 MB.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import Any

from .. import knobs
from . import channel as channels
from .base import JsonCollectives
from .jax_channel import JaxChannel, client

_PREFIX = "shardsafe/"


def jax_distributed_active() -> bool:
    """True when this process is one of several of an initialised ``jax.distributed`` job
    (never imports JAX)."""
    if client() is None:
        return False
    from jax._src import distributed

    return int(distributed.global_state.num_processes or 1) > 1


class JaxComm(JsonCollectives):
    """Collectives among the processes of the initialised ``jax.distributed`` job.

    Args:
        timeout: Seconds a collective waits for the other processes (default
            ``SHARDSAFE_TIMEOUT``).

    Raises:
        RuntimeError: ``jax.distributed`` is not initialised in this process.
    """

    bulk = False  # every byte goes through the coordination service's key-value store

    def __init__(self, timeout: float | None = None) -> None:
        kv = client()
        if kv is None:
            raise RuntimeError("JaxComm needs jax.distributed.initialize() first")
        from jax._src import distributed

        state = distributed.global_state
        self._kv = kv
        self.rank = int(state.process_id)
        self.world_size = int(state.num_processes)
        self.timeout = knobs.timeout() if timeout is None else float(timeout)
        # names this very job (a re-initialised job gets a new client) in the per-process
        # collective counters and plan caches
        self.scope = f"jax/{state.coordinator_address}/{id(kv)}"
        _CLIENTS.setdefault(id(kv), kv)

    def _round(self, kind: str) -> JaxChannel:
        """A channel for the next collective of this process (the same name on every rank)."""
        n = _next(self.scope, kind)
        return JaxChannel(self._kv, f"{_PREFIX}{kind}/{n}/", self.rank, self.world_size)

    def barrier(self) -> None:
        """Blocks until every process arrives (bounded by ``timeout``)."""
        self.gather_bytes(b"", 0)
        self.broadcast_bytes(b"" if self.rank == 0 else None, 0)

    def gather_bytes(self, data: bytes, dst: int = 0) -> list[bytes] | None:
        """Every rank's ``data`` on rank ``dst`` (rank order); None elsewhere.

        Raises:
            CheckpointTimeoutError: on ``dst``, a rank did not send within ``timeout``.
        """
        ch = self._round("gather")
        out = channels.gather(ch, "v", data, self.timeout, dst)
        if out is None:
            return None
        missing = channels.missing_ranks(out)
        if missing:
            raise channels.timeout_error("a gather", self.timeout, missing, self.world_size)
        return [bytes(v) for v in out if v is not None]

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes:
        """``data`` of rank ``src``, returned on every rank.

        Raises:
            CheckpointTimeoutError: the value (or, on ``src``, a reader's acknowledgement)
                did not arrive within ``timeout``.
        """
        ch = self._round("broadcast")
        if self.rank == src:
            if data is None:
                raise ValueError("the broadcast source must provide data")
            readers = [r for r in range(self.world_size) if r != src]
            missing = channels.announce_missing(ch, "v", bytes(data), readers, self.timeout)
            if missing:
                raise channels.timeout_error("a broadcast", self.timeout, missing, self.world_size)
            return bytes(data)
        return channels.receive(ch, "v", self.timeout)

    def allreduce_max(self, values: Sequence[int]) -> list[int]:
        """The element-wise maximum of every rank's ``values``."""
        gathered = self.gather([int(v) for v in values], 0)
        best = [max(col) for col in zip(*gathered)] if gathered is not None else None
        return [int(v) for v in self.broadcast(best, 0)]

    def channel(self, namespace: str) -> JaxChannel:
        """A store channel whose keys live under ``namespace`` (unique per save or load)."""
        return JaxChannel(self._kv, f"{_PREFIX}{namespace}/", self.rank, self.world_size)

    def group_rank(self, global_rank: int) -> int:
        """``global_rank`` itself (the job is one group); -1 outside the job."""
        return global_rank if 0 <= global_rank < self.world_size else -1


_CLIENTS: dict[int, Any] = {}  # every client a JaxComm has seen (its id stays unique)
_COUNT_LOCK = threading.Lock()
_COUNTERS: dict[tuple[str, str], itertools.count] = {}


def _next(scope: str, kind: str) -> int:
    with _COUNT_LOCK:
        return next(_COUNTERS.setdefault((scope, kind), itertools.count(1)))
