"""Bytes and rank 0's work of the planning exchange of a collective save, simulated.

Every simulated rank of the FSDP job of ``bench.scale`` builds the messages a real rank
sends, with the functions ``engine.plan_exchange`` uses (``first_message``,
``full_message``, ``layout_digest``, ``tree_digest``, ``plan.union.rows_of``'s row
format), and rank 0's decisions are made by the real ``decide_first``/``decide_full``
and encoded by ``comm.rounds.encode_decision``. Bytes are counted as
``plan_exchange.STATS`` counts them on each rank: what the rank sets in the store plus
what it fetches (rank 0: its arrival mark, its own message, every rank's message, the
decision; another rank: its message, the decision, its 1-byte acknowledgement).

A first save runs two rounds (33-byte digests answered by "full", then every rank's
report answered by the plan); a repeat save with an unchanged layout runs one (the
digests, answered by "same").
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..comm.rounds import encode_decision
from ..engine import commit
from ..engine.plan_exchange import decide_first, decide_full, first_message, full_message, \
    layout_digest, tree_digest
from ..format.index_v2 import ColumnarIndex
from ..format.tree import Node, decode_key_path, encode_key_path
from ..plan.flatten import TensorItem
from ..storage.local import LocalStorage

Message = Callable[[int], bytes]


@dataclass(slots=True)
class Round:
    """Byte counts of one leader round."""

    messages: list[int]  # len of each rank's message
    decision: int  # len of rank 0's encoded decision

    def per_rank(self) -> list[int]:
        """Bytes each rank sets plus fetches in this round (rank 0 first)."""
        w = len(self.messages)
        rank0 = self.messages[0] + sum(self.messages) + self.decision
        return [rank0] + [self.messages[r] + self.decision + 1 for r in range(1, w)]


class SimulatedJob:
    """What every rank of the simulated FSDP job holds: rows, tree, digests (built lazily)."""

    def __init__(self, index: ColumnarIndex) -> None:
        self.world = len(index.files)
        infos = index.tensors
        self.paths = [encode_key_path(i.key) for i in infos]
        ct = index.chunks
        step = np.array([s.step if s is not None else 0 for s in ct.splits], dtype=np.int64)
        rows = np.array([i.shape[0] for i in infos], dtype=np.int64)
        self.lo = np.minimum(np.arange(self.world, dtype=np.int64)[None, :] * step[:, None],
                             rows[:, None])  # [tensors, ranks]: first row of each rank's shard
        inner = np.array([int(np.prod(i.shape[1:])) for i in infos], dtype=np.int64)
        inner *= ct.itemsizes.astype(np.int64)
        self.nbytes = np.clip(rows[:, None] - self.lo, 0, step[:, None]) * inner[:, None]
        self.infos = infos
        self.tree: Node = index.tree  # every rank holds every key path (local id = global id)
        self.tree_digest = tree_digest(self.tree)
        self._layouts: dict[int, bytes] = {}
        self._items = [TensorItem(id=t, path=decode_key_path(p), value=None, kind=i.kind,
                                  dtype=i.dtype, shape=tuple(i.shape), offsets=(), replicated=False)
                       for t, (p, i) in enumerate(zip(self.paths, infos))]

    def rows(self, rank: int) -> list[list[Any]]:
        """Rank ``rank``'s rows, as ``plan.union.rows_of`` builds them after ``localize``
        (a DTensor shard: holders [rank], or none for an empty shard)."""
        nb = self.nbytes[:, rank].tolist()
        return [[p, i.kind, i.dtype, list(i.shape), [rank] if n else [], n]
                for p, i, n in zip(self.paths, self.infos, nb)]

    def layout(self, rank: int, rows: list[list[Any]]) -> bytes:
        """``layout_digest`` of the rank (its rows and its shards' positions; kept)."""
        got = self._layouts.get(rank)
        if got is None:
            for it, lo in zip(self._items, self.lo[:, rank].tolist()):
                it.offsets = (lo,) + (0,) * (len(it.shape) - 1)
            got = self._layouts[rank] = layout_digest(rows, self._items)
        return got

    def full(self, rank: int) -> bytes:
        """The rank's message of a full round."""
        rows = self.rows(rank)
        return full_message(rows, self.tree, self.layout(rank, rows), self.tree_digest)

    def first(self, rank: int, hit: bool) -> bytes:
        """The rank's message of the first round."""
        layout = self._layouts.get(rank) or self.layout(rank, self.rows(rank))
        return first_message(layout, self.tree_digest, hit)


def _txn(spath: str) -> Callable[[], dict[str, Any]]:
    """Rank 0's transaction part of a decision, from the real ``commit.plan_transaction``."""
    def txn() -> dict[str, Any]:
        token = uuid.uuid4().hex[:16]
        t = commit.plan_transaction(LocalStorage(), spath, overwrite=False, token=token)
        return {"token": token, "workdir": t.workdir, "replace": t.replace}
    return txn


def _all(world: int, make: Message) -> Iterator[bytes]:
    return (make(r) for r in range(world))


def simulate(index: ColumnarIndex, *, keep_reports: bool = True) -> dict[str, Any]:
    """Byte counts of a first and a repeat save; with ``keep_reports``, rank 0's work too.

    Without ``keep_reports`` (very large jobs) every rank's report is still encoded, but
    only its length is kept: rank 0's plan is then not made, so the first save's figures
    leave out the plan decision (``plan_decision_bytes`` and ``plan_first_s`` are None)."""
    job = SimulatedJob(index)
    world = job.world
    with tempfile.TemporaryDirectory() as d:
        txn = _txn(os.path.join(d, "step_000100"))
        first = [job.first(r, False) for r in range(world)]
        dec1 = decide_first(None, first, txn)
        assert dec1 == {"full": True}, dec1
        r1 = Round([len(m) for m in first], len(encode_decision(dec1)))
        out: dict[str, Any] = {}
        kept: list[Any] = []
        if keep_reports:
            reports, encode_s = _timed(lambda: list(_all(world, job.full)))
            dec2, plan_s = _timed(lambda: decide_full(world, reports, txn, kept.append))
            if "plan" not in dec2:
                raise AssertionError(f"the simulated first save did not plan: {dec2}")
            r2 = Round([len(m) for m in reports], len(encode_decision(dec2)))
            del reports
            again = [job.first(r, True) for r in range(world)]
            dec3 = decide_first(kept[0], again, txn)
            assert "same" in dec3, dec3
            r3 = Round([len(m) for m in again], len(encode_decision(dec3)))
            out["plan_first_s"] = round(plan_s, 3)
            out["plan_reports_encode_s"] = round(encode_s, 3)
        else:
            lengths, encode_s = _timed(lambda: [len(m) for m in _all(world, job.full)])
            r2 = Round(lengths, 0)
            r3 = Round([len(m) for m in first], len(encode_decision({"same": True, **txn()})))
            out["plan_first_s"] = None
            out["plan_reports_encode_s"] = round(encode_s, 3)
    first_ranks = [a + b for a, b in zip(r1.per_rank(), r2.per_rank())]
    first_ranks[0] += 1  # rank 0's arrival mark
    repeat_ranks = r3.per_rank()
    repeat_ranks[0] += 1
    out.update({
        "plan_bytes_first": sum(first_ranks), "plan_bytes_first_rank0": first_ranks[0],
        "plan_bytes_first_rank": max(first_ranks[1:], default=0),
        "plan_bytes_repeat": sum(repeat_ranks), "plan_bytes_repeat_rank0": repeat_ranks[0],
        "plan_bytes_repeat_rank": max(repeat_ranks[1:], default=0),
        "plan_report_bytes": max(r2.messages), "plan_decision_bytes": r2.decision or None})
    return out


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0
