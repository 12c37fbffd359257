"""Agreement between ranks for whoever coordinates saves from above (the manager).

Callers above the comm layer never talk the store protocol or call collectives
themselves: they build one ``Agreement`` (carrying the timeout that bounds every wait)
and ask it questions; every rank gets the same answer:

* ``any_rank(flags)``: element-wise "is this true on some rank?" (a time interval or a
  preemption signal can differ between ranks).
* ``worst(outcome)``: the largest outcome code of all ranks (a chunk that failed to
  verify on one rank only).
* ``leader_decides(decide)``: rank 0 runs ``decide``; every rank returns its JSON-like
  decision, or raises if rank 0 failed.
* ``decide_together(mine, decide)``: every rank contributes a JSON-like value, rank 0
  runs ``decide`` on all of them, every rank gets the answer ("gather, run a pure
  function on rank 0, broadcast").
* ``leader_acts_in_background(namespace, act)``: rank 0 runs ``act`` and the other ranks
  wait until it has; safe on a background thread.
* ``peer_link(directory)``: the point-to-point link between the local tiers of
  different nodes (``comm.p2p``), bounded by the same timeout.

Every question is a bounded round through the c10d store (``comm.rounds``), never a
process-group collective, so a rank that stops calling turns into
``CheckpointTimeoutError`` naming it on every rank that did, within ``timeout`` seconds
(a gather or broadcast of the process group cannot be bounded on gloo or NCCL).
Questions asked on the caller's thread are named by a per-process counter (the n-th
question of a group has the same name on every rank, as for saves); background ones by
the caller's namespace. With world size 1 every question is a plain call: no process
group is needed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..errors import CheckpointError
from ..knobs import timeout as default_timeout
from . import distributed_active, get_comm, next_namespace
from .base import Comm
from .channel import announce, receive
from .jax_comm import JaxComm
from .rounds import join, leader_round, leave

T = TypeVar("T")

_OK = b"ok"


class LeaderFailedError(CheckpointError):
    """Rank 0 failed while deciding or acting for every rank (raised on the other ranks)."""


class Agreement:
    """The questions one coordinator (a manager) asks all ranks, each bounded by ``timeout``.

    Args:
        timeout: Seconds a rank waits for the others in each question (default
            ``SHARDSAFE_TIMEOUT``).
    """

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = default_timeout() if timeout is None else float(timeout)

    @property
    def comm(self) -> Comm:
        """The default group (a single process without torch.distributed)."""
        return get_comm()

    @property
    def rank(self) -> int:
        """This process's rank in the default group (0 without torch.distributed)."""
        return self.comm.rank

    @property
    def world_size(self) -> int:
        """Ranks taking part (1 without torch.distributed)."""
        return self.comm.world_size

    @property
    def is_leader(self) -> bool:
        """True on the rank that acts for all (rank 0), and in a single process."""
        return self.rank == 0

    def _round(self, comm: Comm, mine: Any, decide: Callable[[list[Any]], dict[str, Any]],
               what: str) -> dict[str, Any]:
        """One bounded round: every rank sends ``mine``; rank 0 answers ``decide(all)``."""
        ch = comm.channel(next_namespace(comm, "agree"))
        join(ch)
        try:
            return leader_round(ch, "q", json.dumps(mine).encode("utf-8"),
                                lambda msgs: decide([json.loads(m.decode("utf-8")) for m in msgs]),
                                self.timeout, what=what, first=True)
        finally:
            leave(ch)

    def decide_together(self, mine: Any, decide: Callable[[list[Any]], T], *, what: str) -> T:
        """Every rank's JSON-like ``mine`` goes to rank 0, which returns ``decide(values)``
        (rank order) to every rank; the answer comes back as JSON decodes it.

        Raises:
            CheckpointTimeoutError: a rank did not join within the timeout (naming it).
            LeaderFailedError: ``decide`` raised on rank 0 (rank 0 re-raises it).
        """
        comm = self.comm
        if comm.world_size == 1:
            return decide([mine])
        return self._decided(comm, mine, decide, what, (Exception,))

    def _decided(self, comm: Comm, mine: Any, decide: Callable[[list[Any]], T], what: str,
                 errors: tuple[type[BaseException], ...]) -> T:
        failure: list[BaseException] = []

        def run(values: list[Any]) -> dict[str, Any]:
            try:
                return {"value": decide(values)}
            except errors as e:
                failure.append(e)
                return {"error": f"{type(e).__name__}: {e}"}
            except BaseException as e:
                failure.append(e)
                return {"error": f"rank 0 stopped with an unexpected error: {type(e).__name__}"}

        out = self._round(comm, mine, run, what)
        if failure:
            raise failure[0]
        if "error" in out:
            raise LeaderFailedError(f"{what} failed on rank 0: {out['error']}")
        return out["value"]  # type: ignore[no-any-return]

    def leader_decides(self, decide: Callable[[], T], *, what: str,
                       errors: tuple[type[Exception], ...] = (CheckpointError, OSError)) -> T:
        """Rank 0 runs ``decide``; every rank returns its (JSON-like) decision.

        Every rank must call this at the same point. If ``decide`` raises on rank 0, rank 0
        re-raises it and the other ranks raise ``LeaderFailedError`` with its message (the
        ``errors`` are reported by type and message; anything else only as unexpected).

        Raises:
            LeaderFailedError: On ranks other than 0, when rank 0 failed.
            CheckpointTimeoutError: a rank did not join within the timeout (naming it);
                ``decide`` did not run then.
        """
        comm = self.comm
        if comm.world_size == 1:
            return decide()
        return self._decided(comm, None, lambda _: decide(), what, errors)

    def any_rank(self, flags: Sequence[bool], *, what: str = "agreeing on a save decision") -> list[bool]:
        """For each flag, whether it is True on at least one rank."""
        if self.world_size == 1:
            return [bool(f) for f in flags]
        return self.decide_together([bool(f) for f in flags],
                                    lambda all_: [any(col) for col in zip(*all_)], what=what)

    def worst(self, outcome: int, *, what: str = "agreeing on an outcome") -> int:
        """The largest ``outcome`` over all ranks (outcome codes ordered best first)."""
        if self.world_size == 1:
            return int(outcome)
        return int(self.decide_together(int(outcome), max, what=what))

    def leader_acts_in_background(self, namespace: str, act: Callable[[], None], *, what: str,
                                  errors: tuple[type[Exception], ...] = (CheckpointError, OSError)) -> None:
        """Rank 0 runs ``act``; every rank returns once it has (safe on any thread).

        The verdict travels through the store under ``namespace`` (unique per use, the same
        on every rank). Rank 0 re-raises an error of ``act``; the other ranks then raise
        ``LeaderFailedError`` with its message.

        Raises:
            LeaderFailedError: On ranks other than 0, when rank 0's ``act`` failed.
            CheckpointTimeoutError: On ranks other than 0, when rank 0 gave no verdict
                within the timeout.
        """
        comm = self.comm
        if comm.world_size == 1:
            act()
            return
        ch = comm.channel(namespace)
        if comm.rank != 0:
            verdict = receive(ch, "verdict", self.timeout)
            if verdict != _OK:
                raise LeaderFailedError(f"{what} failed on rank 0: {verdict.decode('utf-8', 'replace')}")
            return
        verdict = b"rank 0 stopped with an unexpected error"
        try:
            act()
            verdict = _OK
        except errors as e:
            verdict = f"{type(e).__name__}: {e}".encode("utf-8", "replace")
            raise
        finally:
            # bounded: a reader that died must not keep rank 0 here (late readers find the key)
            announce(ch, "verdict", verdict, range(1, comm.world_size), self.timeout)

    def peer_link(self, directory: str) -> Any:
        """The peers' point-to-point link (``comm.p2p.PeerLink``) of ``directory``, whose
        transfers give up after the timeout; None without torch.distributed. Collective.

        Raises:
            ValueError: the job is a ``jax.distributed`` one (peer copies travel over a
                torch.distributed gloo group).
        """
        if not distributed_active():
            return None
        if isinstance(self.comm, JaxComm):
            raise ValueError("local_replication copies local checkpoints between nodes over "
                             "torch.distributed; a jax.distributed job keeps them on its own nodes")
        from .p2p import PeerLink  # torch.distributed only when there are peers

        return PeerLink(directory, timeout=self.timeout)


__all__ = ["Agreement", "LeaderFailedError"]
