"""Bounded leader rounds over a store channel: the collectives of a save or a load.

A round is "every rank sends rank 0 a message; rank 0 answers every rank with one
decision". It runs through the c10d store (a ``Channel``), never through the process
group, so every wait has a timeout: a rank that never joins turns into
``CheckpointTimeoutError`` naming it, on every rank that did join, within the timeout
(a process-group gather or broadcast cannot be bounded on gloo or NCCL).

Rank 0 marks its arrival (``HERE``) so that the other ranks can tell "rank 0 is missing"
from "rank 0 is still deciding". Rank 0 reads the messages a batch at a time (it never
holds every rank's message at once), and an answer may carry parts besides the
decision: byte values that each rank reads only when its decision names them (its
share of a plan). Keys are freed once every reader has acknowledged.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .channel import Channel, announce_missing, drain, get, timeout_error

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


@dataclass(slots=True)
class Answer:
    """Rank 0's answer in a leader round.

    Attributes:
        decision: The JSON object every rank reads.
        parts: Byte values published beside it; a rank reads those its ``wanted``
            names (rank 0 takes its own from here).
    """

    decision: dict[str, Any]
    parts: dict[str, bytes] = field(default_factory=dict)


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
    return leader_exchange(channel, name, message, lambda ms: Answer(decide(list(ms))), timeout,
                           what=what, first=first).decision


def _no_parts(decision: dict[str, Any]) -> Sequence[str]:
    return ()


def leader_exchange(channel: Channel, name: str, message: bytes,
                    decide: Callable[[Iterator[bytes]], Answer], timeout: float, *, what: str,
                    first: bool, wanted: Callable[[dict[str, Any]], Sequence[str]] = _no_parts) -> Answer:
    """``leader_round`` whose rank 0 reads the messages one batch at a time (``decide``
    gets an iterator over them, in rank order) and may answer with parts: every rank
    gets the decision and the parts ``wanted(decision)`` names (absent ones left out).

    Raises:
        CheckpointTimeoutError: as ``leader_round``.
    """
    world = channel.world_size
    key = f"{name}/{channel.rank}"
    channel.set(key, message)
    if channel.rank == 0:
        answer, missing = _decide(channel, name, decide, timeout)
        for k, v in answer.parts.items():
            channel.set(f"{name}/part/{k}", v)
        readers = [r for r in range(1, world) if r not in missing]
        late = announce_missing(channel, f"{name}/decision", encode_decision(answer.decision),
                                readers, timeout)
        if not late:
            for k in answer.parts:
                channel.delete(f"{name}/part/{k}")
        decision = answer.decision
        parts = {k: answer.parts[k] for k in wanted(decision) if k in answer.parts}
    else:
        if first and not channel.wait([HERE], timeout)[0]:
            channel.delete(key)
            raise timeout_error(what, timeout, [0], world)
        try:
            # rank 0 waits up to ``timeout`` for the others, then decides
            decision = json.loads(get(channel, f"{name}/decision", 2 * timeout).decode("utf-8"))
            parts = {} if decision.get("missing") else _read_parts(channel, name, wanted(decision))
        finally:
            channel.set(f"{name}/decision/read/{channel.rank}", b"1")
    if decision.get("missing"):
        raise timeout_error(what, timeout, decision["missing"], world)
    return Answer(decision, parts)


def _decide(channel: Channel, name: str, decide: Callable[[Iterator[bytes]], Answer],
            timeout: float) -> tuple[Answer, list[int]]:
    """Rank 0: waits (bounded) for every message, then decides over them, streamed."""
    keys = [f"{name}/{r}" for r in range(channel.world_size)]
    present = channel.wait(keys, timeout)
    missing = [r for r, ok in enumerate(present) if not ok]
    if missing:
        for k, ok in zip(keys, present):
            if ok:
                channel.delete(k)
        return Answer({"missing": missing}), missing
    with contextlib.closing(drain(channel, keys)) as messages:
        return decide(messages), []


def _read_parts(channel: Channel, name: str, names: Sequence[str]) -> dict[str, bytes]:
    """The parts of an answer that exist (rank 0 publishes them before the decision)."""
    keys = [f"{name}/part/{k}" for k in names]
    present = channel.wait(keys, 1.0) if keys else []
    found = [(n, k) for n, k, ok in zip(names, keys, present) if ok]
    return dict(zip((n for n, _ in found), channel.fetch([k for _, k in found])))


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

