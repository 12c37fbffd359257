"""Bytes and rank 0's work of the planning exchange of a collective save, simulated.

Every simulated rank of the FSDP job of ``bench.scale`` describes itself with the
functions a real rank runs in ``engine.save.plan_exchange`` (``plan.collective.report``: ``shape_of``,
``layout_digest``, ``hello``, ``report``), fed with columns instead of tensors; rank 0
answers with the real ``plan.collective.answer.read_hellos``/``decide_first``/``decide_full``,
which read the messages one rank at a time as ``comm.rounds.leader_exchange`` streams
them, and every rank reads its share with ``plan.collective.answer.read_share``. Bytes are counted
as ``plan_exchange.STATS`` counts them on each rank: what the rank sets in the store
plus what it fetches (rank 0: its arrival mark, its messages, every rank's messages,
the decisions and the parts it publishes; another rank: its messages, the decisions,
the parts it reads, its 1-byte acknowledgements).

A first save runs two rounds (49-byte hellos answered "full", then every rank's report
answered by the plan: one rank sends the shape every rank shares); a repeat save with
an unchanged layout runs one (the hellos, answered "same").
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..comm.rounds import encode_decision
from ..engine import commit
from ..format.dtypes import lookup
from ..format.index.model import TensorInfo
from ..format.tree import Node, encode_key_path
from ..plan.collective.answer import Leader, decide_first, decide_full, read_hellos, read_share, wanted
from ..plan.collective.report import EMPTY, NO_VALUES, OWN, Boxes, Values, hello, layout_digest, report, shape_of
from ..storage.local import LocalStorage

NO_PER_RANK = Values(b"", b"", NO_VALUES)


class SimulatedJob:
    """What every rank of the simulated FSDP job holds: one shape (every tensor a DTensor
    split along dimension 0 over the ranks), and per rank its boxes, computed when asked
    (an empty box where uneven sharding left the rank nothing)."""

    def __init__(self, world: int, infos: Sequence[TensorInfo], tree: Node) -> None:
        self.world = world
        self.rows = np.array([i.shape[0] for i in infos], dtype=np.int64)
        self.step = -(-self.rows // world)
        itemsize = np.array([lookup(i.dtype).itemsize for i in infos], dtype=np.int64)
        self.inner = np.array([int(np.prod(i.shape[1:])) for i in infos], dtype=np.int64) * itemsize
        self.shape = shape_of(tree, [[encode_key_path(i.key), i.kind, i.dtype, list(i.shape), True]
                                     for i in infos])
        ndim = np.array([len(i.shape) for i in infos], dtype=np.int64)
        self._dim0 = np.cumsum(ndim) - ndim  # where each tensor's offsets start
        self._noffsets = int(ndim.sum())

    def boxes(self, rank: int) -> Boxes:
        """Rank ``rank``'s columns, as ``plan.collective.report.boxes_of`` builds them after ``localize``."""
        lo = np.minimum(rank * self.step, self.rows)
        nb = np.clip(self.rows - lo, 0, self.step) * self.inner
        offsets = np.zeros(self._noffsets, dtype=np.int64)
        offsets[self._dim0] = lo
        return Boxes(np.where(nb > 0, OWN, EMPTY).astype(np.int32), nb, [], offsets)

    def hello(self, rank: int, kept: bool) -> bytes:
        """The rank's first-round message."""
        layout = layout_digest(self.shape, self.boxes(rank), NO_PER_RANK)
        return hello(kept, layout, self.shape.digest, NO_VALUES)

    def report(self, rank: int, send_shape: bool) -> bytes:
        """The rank's message of a full round."""
        return report(rank, self.boxes(rank), self.shape.body if send_shape else b"")


@dataclass(slots=True)
class _Tally:
    """Bytes each rank set plus fetched, and the time spent building the ranks' messages."""

    world: int
    ranks: np.ndarray = field(init=False)
    build_s: float = 0.0
    largest: int = 0

    def __post_init__(self) -> None:
        self.ranks = np.zeros(self.world, dtype=np.int64)
        self.ranks[0] = 1  # rank 0's arrival mark

    def messages(self, make: Callable[[int], bytes]) -> Iterator[bytes]:
        """Every rank's message in rank order, built lazily (rank 0 holds one at a time)."""
        for r in range(self.world):
            t0 = time.perf_counter()
            m = make(r)
            self.build_s += time.perf_counter() - t0
            self.ranks[r] += len(m)  # the rank sets it
            self.ranks[0] += len(m)  # rank 0 fetches it
            self.largest = max(self.largest, len(m))
            yield m

    def answer(self, decision: dict[str, Any], parts: dict[str, bytes],
               wanted_by: Callable[[int], list[str]]) -> int:
        """Counts an answer: rank 0 sets decision and parts; the others read what they need."""
        n = len(encode_decision(decision))
        self.ranks[0] += n + sum(map(len, parts.values()))
        read = 0
        for r in range(1, self.world):
            mine = sum(len(parts[k]) for k in wanted_by(r) if k in parts)
            self.ranks[r] += n + mine + 1
            read = max(read, mine)
        return n + read


def _txn(spath: str) -> Callable[[], dict[str, Any]]:
    """Rank 0's transaction part of a decision, from the real ``commit.plan_transaction``."""
    def txn() -> dict[str, Any]:
        token = uuid.uuid4().hex[:16]
        t = commit.plan_transaction(LocalStorage(), spath, overwrite=False, token=token)
        return {"token": token, "workdir": t.workdir, "replace": t.replace}
    return txn


def _first_save(job: SimulatedJob, txn: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], Leader]:
    """Both rounds of a first save; returns the figures and what rank 0 keeps."""
    world = job.world
    r1, r2 = _Tally(world), _Tally(world)
    t0 = time.perf_counter()
    hellos = read_hellos(r1.messages(lambda r: job.hello(r, False)), world)
    first = decide_first(None, hellos, txn)
    r1.answer(first, {}, lambda r: [])
    if not first.get("full"):
        raise AssertionError(f"a first save was not answered 'full': {first}")
    senders = {a for a, _ in first["shapes"]}
    decision, parts, lead = decide_full(None, hellos, r2.messages(lambda r: job.report(r, r in senders)), txn)
    if lead is None:
        raise AssertionError(f"the simulated first save did not plan: {decision}")
    share = read_share(decision, parts, 0, job.shape.digest, job.boxes(0), 0)
    rank0_s = time.perf_counter() - t0 - r1.build_s - r2.build_s
    decision_bytes = r2.answer(decision, parts, lambda r: wanted(job.shape.digest, job.boxes(r)))
    last = read_share(decision, parts, world - 1, job.shape.digest, job.boxes(world - 1), 0)
    if len(share.writes) != int((job.boxes(0).nbytes > 0).sum()) or \
            len(last.writes) != int((job.boxes(world - 1).nbytes > 0).sum()):
        raise AssertionError("a simulated rank's share is not its own shards")
    total = r1.ranks + r2.ranks
    return {"plan_first_s": round(rank0_s, 3), "plan_reports_encode_s": round(r1.build_s + r2.build_s, 3),
            "plan_bytes_first": int(total.sum()), "plan_bytes_first_rank0": int(total[0]),
            "plan_bytes_first_rank": int(total[1:].max(initial=0)),
            "plan_report_bytes": r2.largest, "plan_decision_bytes": decision_bytes,
            "write_imbalance": round(lead.joined.plan.imbalance(), 4)}, lead


def simulate(world: int, infos: Sequence[TensorInfo], tree: Node) -> dict[str, Any]:
    """Byte counts and rank 0's time of a first and a repeat save of an FSDP job of
    ``world`` ranks holding ``infos`` (their tree: ``tree``, tensor ids = positions)."""
    job = SimulatedJob(world, infos, tree)
    with tempfile.TemporaryDirectory() as d:
        txn = _txn(os.path.join(d, "step_000100"))
        out, lead = _first_save(job, txn)
        again = _Tally(job.world)
        same = decide_first(lead, read_hellos(again.messages(lambda r: job.hello(r, True)), job.world), txn)
        if not same.get("same"):
            raise AssertionError(f"a repeat save was not answered 'same': {same}")
        again.answer(same, {}, lambda r: [])
    out.update({"plan_bytes_repeat": int(again.ranks.sum()), "plan_bytes_repeat_rank0": int(again.ranks[0]),
                "plan_bytes_repeat_rank": int(again.ranks[1:].max(initial=0))})
    return out
