"""Agreement between ranks for whoever coordinates saves from above (the manager).

Callers above the comm layer never talk the store protocol or call collectives
themselves; they ask one of these questions, and every rank gets the same answer:

* ``any_rank(flags)``: element-wise "is this true on some rank?" (a time interval or a
  preemption signal can differ between ranks). Collective, caller's thread.
* ``worst(outcome)``: the largest outcome code of all ranks (a chunk that failed to
  verify on one rank only). Collective, caller's thread.
* ``leader_decides(decide)``: rank 0 runs ``decide``; every rank returns its JSON-like
  decision, or raises if rank 0 failed. Collective, caller's thread.
* ``leader_acts_in_background(namespace, act)``: rank 0 runs ``act`` and the other ranks
  wait until it has, through the store (never the process group, so it is safe on a
  background thread), bounded by a timeout.

With world size 1 every function is a plain call: no process group is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..knobs import timeout as default_timeout
from ..errors import CheckpointError
from . import get_comm
from .channel import announce, receive

T = TypeVar("T")

_OK = b"ok"


class LeaderFailedError(CheckpointError):
    """Rank 0 failed while deciding or acting for every rank (raised on the other ranks)."""


def rank() -> int:
    """This process's rank in the default group (0 without torch.distributed)."""
    return get_comm().rank


def world_size() -> int:
    """Ranks taking part (1 without torch.distributed)."""
    return get_comm().world_size


def is_leader() -> bool:
    """True on the rank that acts for all (rank 0), and in a single process."""
    return get_comm().rank == 0


def any_rank(flags: Sequence[bool]) -> list[bool]:
    """For each flag, whether it is True on at least one rank (one tiny all-reduce)."""
    comm = get_comm()
    if comm.world_size == 1:
        return [bool(f) for f in flags]
    return [bool(v) for v in comm.allreduce_max([int(bool(f)) for f in flags])]


def worst(outcome: int) -> int:
    """The largest ``outcome`` over all ranks (outcome codes ordered best first)."""
    return get_comm().allreduce_max([outcome])[0]


def leader_decides(decide: Callable[[], T], *, what: str,
                   errors: tuple[type[Exception], ...] = (CheckpointError, OSError)) -> T:
    """Rank 0 runs ``decide``; every rank returns its (JSON-like) decision.

    Every rank must call this at the same point (it is a broadcast on the caller's
    thread). If ``decide`` raises one of ``errors`` on rank 0, rank 0 re-raises it and
    the other ranks raise ``LeaderFailedError`` with its message.

    Raises:
        LeaderFailedError: On ranks other than 0, when rank 0 failed.
    """
    comm = get_comm()
    if comm.world_size == 1:
        return decide()
    if comm.rank != 0:
        out = comm.broadcast(None)
        if "error" in out:
            raise LeaderFailedError(f"{what} failed on rank 0: {out['error']}")
        return out["value"]  # type: ignore[no-any-return]
    outcome: dict[str, Any] = {"error": "rank 0 stopped with an unexpected error"}
    try:
        value = decide()
        outcome = {"value": value}
        return value
    except errors as e:
        outcome = {"error": f"{type(e).__name__}: {e}"}
        raise
    finally:
        comm.broadcast(outcome)


def leader_acts_in_background(namespace: str, act: Callable[[], None], *, what: str,
                              errors: tuple[type[Exception], ...] = (CheckpointError, OSError),
                              timeout: float | None = None) -> None:
    """Rank 0 runs ``act``; every rank returns once it has (safe on any thread).

    The verdict travels through the store under ``namespace`` (unique per use, the same
    on every rank), never through the process group. Rank 0 re-raises an error of
    ``act``; the other ranks then raise ``LeaderFailedError`` with its message.

    Raises:
        LeaderFailedError: On ranks other than 0, when rank 0's ``act`` failed.
        CheckpointTimeoutError: On ranks other than 0, when rank 0 gave no verdict within
            ``timeout`` seconds (default ``SHARDSAFE_TIMEOUT``).
    """
    comm = get_comm()
    if comm.world_size == 1:
        act()
        return
    ch = comm.channel(namespace)
    wait = default_timeout() if timeout is None else float(timeout)
    if comm.rank != 0:
        verdict = receive(ch, "verdict", wait)
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
        announce(ch, "verdict", verdict, range(1, comm.world_size), wait)


__all__ = ["LeaderFailedError", "any_rank", "is_leader", "leader_acts_in_background",
           "leader_decides", "rank", "world_size", "worst"]
