"""Bounded leader rounds over a store channel: the collectives of a save or a load.

A round is "every rank sends rank 0 a message; rank 0 answers every rank with one
decision". It runs through the c10d store (a ``Channel``), never through the process
group, so every wait has a timeout: a rank that never joins turns into
``CheckpointTimeoutError`` naming it, on every rank that did join, within the timeout
(a process-group gather or broadcast cannot be bounded on gloo or NCCL).

Rank 0 marks its arrival (``HERE``) so that the other ranks can tell "rank 0 is missing"
from "rank 0 is still deciding". Keys are freed once every reader has acknowledged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .channel import Channel, announce_missing, gather, get, missing_ranks, timeout_error

HERE = "here"


def join(channel: Channel) -> None:
    """Rank 0: marks that it has reached this collective (call first)."""
    if channel.rank == 0:
        channel.set(HERE, b"1")


def leave(channel: Channel) -> None:
    """Rank 0: frees the arrival key (call once the collective is over)."""
    if channel.rank == 0:
        channel.delete(HERE)


def encode_decision(decision: dict[str, Any]) -> bytes:
    """The bytes rank 0 sends every rank for a round's decision."""
    return json.dumps(decision).encode("utf-8")


def leader_round(channel: Channel, name: str, message: bytes,
                 decide: Callable[[list[bytes]], dict[str, Any]], timeout: float, *,
                 what: str, first: bool) -> dict[str, Any]:
    """Gathers every rank's ``message`` on rank 0, which answers with ``decide(messages)``.

    Returns the decision (a JSON object) on every rank. ``first`` marks the first round
    of a collective: the other ranks then check that rank 0 arrived at all.

    Raises:
        CheckpointTimeoutError: a rank did not join within ``timeout`` (every rank that
            joined raises it, naming the missing ranks).
    """
    world = channel.world_size
    if channel.rank == 0:
        got = gather(channel, name, message, timeout)
        assert got is not None
        missing = missing_ranks(got)
        decision = {"missing": missing} if missing else decide([m or b"" for m in got])
        readers = [r for r in range(1, world) if r not in missing]
        announce_missing(channel, f"{name}/decision", encode_decision(decision),
                         readers, timeout)
    else:
        gather(channel, name, message, timeout)
        if first and not channel.wait([HERE], timeout)[0]:
            channel.delete(f"{name}/{channel.rank}")
            raise timeout_error(what, timeout, [0], world)
        try:
            # rank 0 waits up to ``timeout`` for the others, then decides
            raw = get(channel, f"{name}/decision", 2 * timeout)
        finally:
            channel.set(f"{name}/decision/read/{channel.rank}", b"1")
        decision = json.loads(raw.decode("utf-8"))
    if decision.get("missing"):
        raise timeout_error(what, timeout, decision["missing"], world)
    return decision


def broadcast_from_leader(channel: Channel, value: bytes | None, timeout: float, *,
                          what: str) -> bytes:
    """Rank 0's ``value`` on every rank (others pass None); bounded by ``timeout``.

    Raises:
        CheckpointTimeoutError: on rank 0, naming the ranks that did not read the value
            within ``timeout``; elsewhere, when rank 0 did not arrive or answer in time.
    """
    world = channel.world_size
    if channel.rank == 0:
        if value is None:
            raise ValueError("rank 0 must provide the value")
        missing = announce_missing(channel, "value", value, range(1, world), timeout)
        if missing:
            for k in ["value", *(f"value/read/{r}" for r in range(1, world))]:
                channel.delete(k)
            raise timeout_error(what, timeout, missing, world)
        return value
    if not channel.wait([HERE], timeout)[0]:
        raise timeout_error(what, timeout, [0], world)
    try:
        return get(channel, "value", 2 * timeout)
    finally:
        channel.set(f"value/read/{channel.rank}", b"1")

