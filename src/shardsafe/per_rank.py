"""``PerRank``: state that differs from rank to rank, saved for every rank.

A collective save treats plain tensors and values as replicated: one copy is written.
That is right for model weights under DDP, and wrong for what each rank owns alone:
its RNG states (dropout masks), its data-loader position, its own counters. Wrap such
a value in ``PerRank`` and every rank's copy is saved, under the rank's number::

    state = {"model": ..., "rng": shardsafe.PerRank(shardsafe.RNGState())}
    # in the checkpoint: {"rng": {"0": <rank 0's RNG>, "1": <rank 1's>, ...}}

On load each rank restores its own entry, so per-rank state resumes exactly on the
same number of ranks. A rank whose number the checkpoint lacks (a job resumed on more
ranks) raises ``StateMismatchError`` unless ``missing="keep"`` was given, which keeps
its current value. Inside a collective ``shardsafe.save`` ``state_dict()`` describes
only this rank's entry (see ``own_entry``): the planning exchange carries it to rank 0
alone, which writes every rank's entry into the index. Called directly, it is a
collective call (every rank's local state goes to every rank, as JSON bytes: nothing
is pickled). Inside ``shardsafe.load`` it only names this rank's entry (see
``loading``), so loads need no extra collective.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import json
from collections.abc import Iterator, Mapping
from typing import Any, Literal, get_args

from . import knobs, values
from .comm import get_comm, next_namespace
from .comm.channel import gather, missing_ranks, timeout_error
from .comm.rounds import broadcast_from_leader, join, leave
from .errors import StateMismatchError
from .format.tree import Node, build
from .plan.flatten import flatten, is_stateful

MissingPolicy = Literal["raise", "keep"]
"""What a rank the checkpoint has no entry for does on load."""

MISSING_POLICIES: tuple[MissingPolicy, ...] = get_args(MissingPolicy)

_LOADING: contextvars.ContextVar[bool] = contextvars.ContextVar("shardsafe_loading", default=False)
_OWN_ENTRY: contextvars.ContextVar[bool] = contextvars.ContextVar("shardsafe_own_entry", default=False)


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Marks a ``shardsafe.load`` in progress (``PerRank.state_dict`` then describes only
    what this rank restores, instead of gathering every rank's state)."""
    token = _LOADING.set(True)
    try:
        yield
    finally:
        _LOADING.reset(token)


@contextlib.contextmanager
def own_entry() -> Iterator[None]:
    """Marks the flattening of a collective save (``PerRank.state_dict`` then gives this
    rank's entry alone; the planning exchange brings every rank's entry to rank 0)."""
    token = _OWN_ENTRY.set(True)
    try:
        yield
    finally:
        _OWN_ENTRY.reset(token)


def _encode(value: Mapping[str, Any]) -> bytes:
    """JSON bytes of a (small) state: its tree plus each tensor's bytes in base64."""
    tree, items = flatten(value)
    blobs = [{"kind": it.kind, "dtype": it.dtype, "shape": list(it.shape),
              "data": base64.b64encode(values.host_bytes(it.value).tobytes()).decode("ascii")}
             for it in items]
    return json.dumps({"tree": tree, "tensors": blobs}, separators=(",", ":")).encode("utf-8")


def _decode(data: bytes) -> Any:
    body = json.loads(data.decode("utf-8"))
    blobs = body["tensors"]

    def leaf(_path: Any, node: Node) -> Any:
        b = blobs[node["id"]]
        value, view = values.stored_kind(b["kind"]).empty(b["dtype"], tuple(b["shape"]))
        view[:] = memoryview(base64.b64decode(b["data"])).cast("B")
        return value

    return build(body["tree"], leaf)


def _exchange(comm: Any, mine: bytes) -> bytes:
    """Every rank's bytes on every rank, through the store (bounded by SHARDSAFE_TIMEOUT).

    Raises:
        CheckpointTimeoutError: a rank did not take part in time (named on rank 0).
    """
    wait = knobs.timeout()
    ch = comm.channel(next_namespace(comm, "per-rank"))
    join(ch)
    try:
        gathered = gather(ch, "state", mine, wait)
        blob = None
        if gathered is not None:
            missing = missing_ranks(gathered)
            if missing:
                raise timeout_error("gathering PerRank states", wait, missing, comm.world_size)
            lengths = json.dumps([len(b or b"") for b in gathered]).encode("utf-8")
            blob = lengths + b"\n" + b"".join(b or b"" for b in gathered)
        return broadcast_from_leader(ch, blob, wait, what="gathering PerRank states")
    finally:
        leave(ch)


class PerRank:
    """Stateful wrapper whose value is saved once per rank and restored per rank.

    Args:
        value: A Stateful object (``state_dict``/``load_state_dict``) or a mutable
            mapping holding this rank's state.
        process_group: The group whose ranks take part (default: the world).
        missing: What a rank the checkpoint has no entry for does on load: ``"raise"``
            (StateMismatchError) or ``"keep"`` (keeps its current value).
    """

    def __init__(self, value: Any, *, process_group: Any = None, missing: MissingPolicy = "raise") -> None:
        if missing not in MISSING_POLICIES:
            raise ValueError(f"missing must be one of {MISSING_POLICIES}, got {missing!r}")
        if not is_stateful(value) and not isinstance(value, Mapping):
            raise TypeError(f"PerRank wraps a Stateful object or a mapping, got {type(value).__name__}")
        self.value = value
        self.process_group = process_group
        self.missing = missing

    def _local(self) -> Mapping[str, Any]:
        return self.value.state_dict() if is_stateful(self.value) else self.value

    def state_dict(self) -> dict[str, Any]:
        """``{"<rank>": state of that rank}`` for every rank (a collective call).

        During ``shardsafe.load``: only this rank's entry (empty with ``missing="keep"``,
        so that a checkpoint without it is no mismatch). During a collective save: only
        this rank's entry (rank 0 gathers the entries while it plans).
        """
        comm = get_comm(self.process_group)
        if _LOADING.get():
            return {str(comm.rank): self._local()} if self.missing == "raise" else {}
        if comm.world_size == 1 or _OWN_ENTRY.get():
            return {str(comm.rank): self._local()}
        everyone = _exchange(comm, _encode(self._local()))
        head, _, rest = everyone.partition(b"\n")
        out, pos = {}, 0
        for r, n in enumerate(json.loads(head.decode("utf-8"))):
            # this rank keeps its live objects; the others' states are decoded copies
            out[str(r)] = self._local() if r == comm.rank else _decode(rest[pos : pos + n])
            pos += n
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores this rank's entry of ``state_dict``."""
        rank = get_comm(self.process_group).rank
        mine = state_dict.get(str(rank))
        if mine is None:
            if self.missing == "keep":
                return
            raise StateMismatchError([f"PerRank: the checkpoint holds ranks "
                                      f"{sorted(state_dict, key=int)}, not rank {rank}"])
        if is_stateful(self.value):
            self.value.load_state_dict(mine)
        elif mine is not self.value:
            self.value.clear()
            self.value.update(mine)
