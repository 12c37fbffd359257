"""A whole job's restore from a store with a heavy latency tail, simulated request by request.

``python -m shardsafe.bench.tail --ranks 16384 [--json]`` builds the index of
``bench.scale``'s FSDP job and records, with the real index reader
(``engine.load.index_exchange``), every rank's index requests: rank 0 reads the head
(the others receive it), then each rank reads the directory entries and parts its shard
needs and asks for its data file's size, one request after the other. Each rank then
reads its shard of ``--rank-mib`` MiB as ``FsspecStorage.read_into`` does: ranged GETs in
the parts ``storage.batch.split`` cuts (``storage.fsspec.PART_SIZE`` bytes, ``--part-mib``,
shrinking towards the end), ``MAX_CONCURRENCY`` in flight, and a slot is given to the
next GET at the moment any GET in flight has its answer (hedged or not), whichever it is
(``storage.batch.as_completed``); a duplicate takes no slot of the window, as a request
and its duplicate are one call of the runner. Once nothing is left to send and a slot
is idle, the GETs in flight are draining (hedged sooner), as is each index request,
which the rank waits for alone.

The modelled store (``StoreModel``) serves an attempt of ``n`` bytes in ``(ttfb + n /
bandwidth) * X``, ``X`` lognormal with median 1 and shape ``sigma``; with probability
``stall_p`` the attempt stalls instead (no byte for ``stall_s`` seconds, then the
connection drops). Every request runs through the real policy objects on a simulated
clock, one set per rank as in one process: ``storage.tail.TailPolicy`` (``hedge_now``
with a ``LatencyTracker`` fed with the attempts that have finished by then and the
``HedgeBudget``, the stall limit, ``crawling``) and ``storage.retry.RetryPolicy`` (the
backoff after a stall). A GET reports progress (its bytes, which arrive evenly after the
first; a HEAD's only progress is its answer), so an attempt is silent until its first
byte, a stalled one for good; a stall is cut at the learned limit, and an attempt far
slower than its siblings is cut as ``TailPolicy.crawling`` says (the model's draws never
reach ``TailPolicy.attempt_limit``, about a minute for 32 MiB, before one of those).
Three runs on the same draws: with hedging, without it, and with neither hedging nor the
learned stall limit (a fixed ``SHARDSAFE_STALL_TIMEOUT``).

Figures: ``job_over_median`` (the slowest rank's restore time over the median rank's,
with hedging), ``unhedged_job_over_median``, ``fixed_stall_job_over_median``,
``stalled_rank_over_median`` (the slowest of the ranks that met a stall, over the median
rank; ``unhedged_`` too: what stalls cost, apart from the ranks that are slow without one),
``extra_request_fraction`` (duplicates sent over all requests sent, retries and
duplicates included), and the model's parameters.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..engine.load import index_exchange as ix
from ..format.index.versions import encode_columnar
from ..harness.synthetic_job import build_index
from ..storage.batch import split
from ..storage.fsspec import MAX_CONCURRENCY, PART_SIZE
from ..storage.retry import RetryPolicy
from ..storage.tail import HedgeBudget, LatencyTracker, TailPolicy
from .restore import CKPT, SimulatedStorage, shard_regions

MiB = 1 << 20
HEAD = -1  # the size of a HEAD request in a plan: no body, no progress reported


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreModel:
    """The modelled store's service times (see the module doc)."""

    ttfb: float = 0.03
    """Median seconds to the first byte."""
    bandwidth_mib: float = 100.0
    """Median MiB/s of one connection."""
    sigma: float = 0.5
    """Shape of the lognormal factor on an attempt's time (its median is 1)."""
    stall_p: float = 0.0002
    """Probability that an attempt stalls."""
    stall_s: float = 120.0
    """Seconds a stalled attempt sends nothing before its connection drops."""


class _Requests(SimulatedStorage):
    """The simulated index storage, recording each request's size in order (HEAD for a size)."""

    def __init__(self, index: bytes, files: dict[str, int]) -> None:
        super().__init__(index, files)
        self.sizes: list[int] = []

    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        self.sizes.append(len(out))
        super().read_into(path, offset, out)

    def size(self, path: str) -> int:
        self.sizes.append(HEAD)
        return super().size(path)


def index_plans(ranks: int, tensors: int) -> tuple[list[int], list[list[int]]]:
    """Rank 0's head reads and every rank's own index requests (sizes in bytes, ``HEAD``
    for a size request), by the real index reader on ``bench.scale``'s FSDP job."""
    index = build_index(ranks, tensors)
    data = encode_columnar(index)
    files = {f.name: f.size for f in index.files}
    rank0 = _Requests(data, files)
    read = ix.read_index_alone(rank0, CKPT)  # type: ignore[arg-type]
    plans = []
    for rank in range(ranks):
        storage = _Requests(data, files)
        ix.from_head(storage, CKPT, read.raw).narrow(  # type: ignore[arg-type]
            shard_regions(read.head.infos, ranks, rank))  # type: ignore[union-attr]
        plans.append(storage.sizes)
    return rank0.sizes, plans


_START, _FINISH, _ATTEMPT, _CHECK, _STALL, _CRAWL = range(6)  # event kinds, in the order of equal times
_EPS = 1e-9  # a look scheduled for when a request is due sees it due, whatever the rounding


class _Rank:
    """One rank's process on a simulated clock: its policies' state, its random draws
    (one stream for first copies, one for duplicates, so that runs with and without
    hedging see the same store) and its counts."""

    def __init__(self, seed: int, rank: int, model: StoreModel, tail: TailPolicy, retry: RetryPolicy,
                 learn_stalls: bool) -> None:
        self.model, self.tail, self.retry, self.learn_stalls = model, tail, retry, learn_stalls
        self.tracker = LatencyTracker()
        self.budget = HedgeBudget(tail.hedge_budget, tail.hedge_burst)
        self.draws = [random.Random(seed * 1_000_003 + rank * 2 + k) for k in (0, 1)]
        self.sent = self.hedges = self.stalls = 0
        self.events: list[tuple[float, int, int, int, float]] = []

    def _push(self, t: float, kind: int, i: int, copy: int = 0, value: float = 0.0) -> None:
        heapq.heappush(self.events, (t, kind, i, copy, value))

    def _limit(self, size: int) -> float:
        """Seconds without progress after which an attempt is cut (a GET's progress is its
        bytes, a HEAD's its answer)."""
        return self.tail.stall_limit(self.tracker) if self.learn_stalls else self.tail.stall_cap

    def _attempt(self, t: float, i: int, copy: int, attempt: int, size: int) -> None:
        """Sends attempt ``attempt`` of copy ``copy`` of request ``i`` at ``t``: it
        finishes, or it stalls and is cut at the stall limit (looked at again whenever the
        tracker changes) and retried after the backoff."""
        m, rng = self.model, self.draws[copy]
        self.sent += 1
        if rng.random() < m.stall_p:
            self.stalls += 1
            self.stalled[(i, copy)] = (t, attempt)
            self.running.pop((i, copy), None)
            if copy == 0:
                self.silent[i] = (t, math.inf)
            self._push(t + min(self._limit(size), m.stall_s), _STALL, i, copy, t)
            return
        x = rng.lognormvariate(0.0, m.sigma)
        seconds = (m.ttfb + max(size, 0) / (m.bandwidth_mib * MiB)) * x
        gap = seconds if size == HEAD else m.ttfb * x
        if copy == 0:
            self.silent[i] = (t, t + gap)
        self.running[(i, copy)] = (t, gap, seconds, attempt, self.tracker.finished(max(size, 0)))
        self._push(t + seconds, _FINISH, i, copy, t)
        if size != HEAD and seconds > self.tail.stall_floor:
            self._push(t + self.tail.stall_floor, _CRAWL, i, copy, t)

    def _crawling(self, now: float, i: int, copy: int, size: int) -> bool:
        """Whether the running attempt of copy ``copy`` of request ``i`` counts as stalled
        at ``now`` by ``TailPolicy.crawling`` (its bytes arrive evenly after the first)."""
        sent, gap, seconds, _, finished = self.running[(i, copy)]
        moved = int(size * min(1.0, max(0.0, now - sent - gap) / (seconds - gap)))
        return self.tail.crawling(self.tracker, size, now - sent, moved,
                                  self.tracker.finished(size) - finished)

    def _cut(self, t: float, i: int, copy: int, attempt: int) -> None:
        """The attempt counts as stalled at ``t``: the next one follows after the backoff."""
        if copy == 0:
            self.silent.pop(i, None)  # no attempt during the backoff
        if attempt + 1 < self.retry.attempts:
            backoff = self.retry.delay(attempt, None, self.draws[copy])
            self._push(t + backoff, _ATTEMPT, i, copy, attempt + 1)

    def phase(self, start: float, sizes: Sequence[int], window: int, alone: bool = False) -> float:
        """Runs ``sizes`` from ``start`` with ``window`` requests in flight, the next sent
        at the moment any request in flight has its answer (``storage.batch.as_completed``,
        as ``FsspecStorage.read_into`` uses it); returns when the last answer is in. The
        hedge delays and stall limits of the requests in flight are looked at again
        whenever an answer changed the tracker, as the runner's wait does. A request is
        draining (``TailPolicy.hedge_delay``) once nothing is left to send and a slot is
        idle, or from its start if ``alone`` (each request a batch of its own, as the
        index reads, one after the other)."""
        n = len(sizes)
        began, done, hedged = [0.0] * n, [False] * n, [False] * n
        self.draining = [alone] * n
        self.stalled: dict[tuple[int, int], tuple[float, int]] = {}
        self.silent: dict[int, tuple[float, float]] = {}  # first copy's attempt: sent, first byte
        # each copy's running attempt: sent, first byte after, takes, attempt, class finished
        self.running: dict[tuple[int, int], tuple[float, float, float, int, int]] = {}
        sent = 0
        inflight: set[int] = set()
        last = start
        if n < window:
            self.draining = [True] * n
        while sent < min(window, n):
            self._push(start, _START, sent)
            inflight.add(sent)
            sent += 1
        while self.events:
            t, kind, i, copy, value = heapq.heappop(self.events)
            if done[i]:
                continue  # the loser of a hedged request: cancelled
            size = sizes[i]
            if kind == _START:
                began[i] = t
                self.budget.started()
                self._attempt(t, i, 0, 0, size)
                self._check(t, i, began[i], size)
            elif kind == _ATTEMPT:
                self._attempt(t, i, copy, int(value), size)
                if copy == 0:
                    self._check(t, i, began[i], size)
            elif kind == _STALL:
                since, attempt = self.stalled.get((i, copy), (None, 0))
                if since != value:
                    continue  # an older look at an attempt already cut
                limit = min(self._limit(size), self.model.stall_s)
                if t < since + limit - 1e-9:
                    self._push(since + limit, _STALL, i, copy, since)
                    continue
                del self.stalled[(i, copy)]
                self._cut(t, i, copy, attempt)
            elif kind == _CRAWL:
                run = self.running.get((i, copy))
                if run is None or run[0] != value or not self._crawling(t, i, copy, size):
                    continue  # another attempt by now, or not (yet) far slower than its siblings
                del self.running[(i, copy)]
                self.stalls += 1
                self._cut(t, i, copy, run[3])
            elif kind == _CHECK:
                if hedged[i]:
                    continue
                silent = self._silence(t, i)
                if self.tail.hedge_now(self.tracker, self.budget, max(size, 0), t - began[i] + _EPS,
                                       None if silent is None else silent + _EPS, self.draining[i]):
                    hedged[i] = True
                    self.hedges += 1
                    self._attempt(t, i, 1, 0, size)
                else:
                    self._check(t, i, began[i], size, refused=True)
            else:
                run = self.running.get((i, copy))
                if run is None or run[0] != value:
                    continue  # an attempt cut as far slower than its siblings
                done[i] = True
                last = max(last, t)
                self.running.pop((i, 0), None)
                self.running.pop((i, 1), None)
                self.tracker.record(max(size, 0), t - value, run[1])
                for (j, c), (since, _) in list(self.stalled.items()):  # the limits just changed
                    if not done[j]:
                        self._push(max(t, since + min(self._limit(sizes[j]), self.model.stall_s)), _STALL, j, c, since)
                for (j, c), other in self.running.items():  # and what counts as far slower
                    if t >= other[0] + self.tail.stall_floor:
                        self._push(t, _CRAWL, j, c, other[0])
                inflight.discard(i)
                if sent < n:  # its slot goes to the next request
                    self._push(t, _START, sent)
                    inflight.add(sent)
                    sent += 1
                elif len(inflight) < window:  # nothing left to send, slots idle
                    for j in inflight:
                        self.draining[j] = True
                for j in inflight:  # and the hedge delays
                    if not hedged[j]:
                        self._check(t, j, began[j], sizes[j])
        return last

    def _silence(self, now: float, i: int) -> float | None:
        """Seconds the first copy of request ``i`` has received nothing (its bytes arrive
        without pause once the first one has); None between attempts."""
        if i not in self.silent:
            return None
        sent, first_byte = self.silent[i]
        return now - sent if now < first_byte else 0.0

    def _check(self, now: float, i: int, began: float, size: int, refused: bool = False) -> None:
        """Looks at request ``i`` when it is slow or silent (at once if it is already);
        after a look the budget ``refused``, only at a time still to come (the next answer
        to come in looks again, as the budget grows with the requests sent)."""
        delay = self.tail.hedge_delay(self.tracker, max(size, 0), self.draining[i])
        silence = self.tail.silence_limit(self.tracker)
        if delay is None or silence is None:
            return
        due = [began + delay]
        if i in self.silent and self.silent[i][1] > self.silent[i][0] + silence:
            due.append(self.silent[i][0] + silence)
        if refused:  # only a look still to come
            due = [d for d in due if d > now + _EPS]
        if due:
            self._push(max(now, min(due)), _CHECK, i)


def simulate(head: Sequence[int], plans: Sequence[Sequence[int]], data: Sequence[int], model: StoreModel,
             tail: TailPolicy, retry: RetryPolicy, seed: int, learn_stalls: bool = True) -> dict[str, Any]:
    """Every rank's restore time (seconds from the job's start) and the requests sent."""
    rank0 = _Rank(seed, -1, model, tail, retry, learn_stalls)
    head_done = rank0.phase(0.0, head, 1, alone=True)  # rank 0 reads the head; the others receive it
    times, stalled, sent, hedges, stalls = [], [], rank0.sent, rank0.hedges, rank0.stalls
    for r, plan in enumerate(plans):
        rank = _Rank(seed, r, model, tail, retry, learn_stalls)
        t = rank.phase(head_done, plan, 1, alone=True)
        times.append(rank.phase(t, data, MAX_CONCURRENCY))
        if rank.stalls:
            stalled.append(times[-1])
        sent, hedges, stalls = sent + rank.sent, hedges + rank.hedges, stalls + rank.stalls
    median = statistics.median(times)
    return {"job_s": max(times), "median_rank_s": median, "job_over_median": max(times) / median,
            "stalled_rank_over_median": max(stalled, default=median) / median,
            "p99_over_median": sorted(times)[int(0.99 * (len(times) - 1))] / median,
            "requests_sent": sent, "duplicates": hedges, "stalls": stalls}


def run(ranks: int, tensors: int = 20, rank_mib: int = 1024, model: StoreModel | None = None,
        seed: int = 0, part_size: int = PART_SIZE) -> dict[str, Any]:
    """The figures of the module doc for a job of ``ranks`` ranks whose data reads are
    ranged GETs of ``part_size`` bytes."""
    t0 = time.perf_counter()
    model = model or StoreModel()
    head, plans = index_plans(ranks, tensors)
    data = [e - s for s, e in split(0, rank_mib * MiB, part_size, MAX_CONCURRENCY)]
    tail, retry = TailPolicy(), RetryPolicy()
    hedged = simulate(head, plans, data, model, tail, retry, seed)
    unhedged = simulate(head, plans, data, model, replace(tail, hedge=False), retry, seed)
    fixed = simulate(head, plans, data, model, replace(tail, hedge=False), retry, seed, learn_stalls=False)
    r3 = lambda x: round(x, 3)  # noqa: E731
    return {
        "ranks": ranks, "rank_mib": rank_mib, "window": MAX_CONCURRENCY,
        "part_mib": part_size // MiB if part_size % MiB == 0 else part_size / MiB,
        "requests_per_rank": len(data) + round(statistics.mean(len(p) for p in plans), 2),
        "head_requests": len(head), "model": asdict(model), "policy": asdict(tail), "seed": seed,
        "job_over_median": r3(hedged["job_over_median"]),
        "unhedged_job_over_median": r3(unhedged["job_over_median"]),
        "fixed_stall_job_over_median": r3(fixed["job_over_median"]),
        "stalled_rank_over_median": r3(hedged["stalled_rank_over_median"]),
        "unhedged_stalled_rank_over_median": r3(unhedged["stalled_rank_over_median"]),
        "extra_request_fraction": round(hedged["duplicates"] / hedged["requests_sent"], 4),
        "job_s": r3(hedged["job_s"]), "unhedged_job_s": r3(unhedged["job_s"]), "fixed_stall_job_s": r3(fixed["job_s"]),
        "median_rank_s": r3(hedged["median_rank_s"]), "unhedged_median_rank_s": r3(unhedged["median_rank_s"]),
        "p99_over_median": r3(hedged["p99_over_median"]), "unhedged_p99_over_median": r3(unhedged["p99_over_median"]),
        "duplicates": hedged["duplicates"], "requests_sent": hedged["requests_sent"], "stalls": hedged["stalls"],
        "sim_s": r3(time.perf_counter() - t0),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shardsafe.bench.tail", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=16384)
    p.add_argument("--tensors", type=int, default=20, help="tensors of the FSDP job (index size)")
    p.add_argument("--rank-mib", type=int, default=1024, help="MiB each rank reads")
    p.add_argument("--part-mib", type=float, default=PART_SIZE / MiB,
                   help="MiB per ranged GET of the data reads (default: the S3 backend's part size)")
    p.add_argument("--sigma", type=float, default=StoreModel().sigma)
    p.add_argument("--stall-p", type=float, default=StoreModel().stall_p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    a = p.parse_args(argv)
    out = run(a.ranks, a.tensors, a.rank_mib, StoreModel(sigma=a.sigma, stall_p=a.stall_p), a.seed,
              round(a.part_mib * MiB))
    if not a.json:
        for key in ("job_over_median", "unhedged_job_over_median", "fixed_stall_job_over_median",
                    "stalled_rank_over_median",
                    "extra_request_fraction", "median_rank_s", "job_s", "unhedged_job_s", "sim_s"):
            print(f"{key:>30}  {out[key]}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
