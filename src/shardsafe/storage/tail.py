"""When to hedge a request and when a request counts as stalled (pure decisions).

A job of thousands of ranks waits for its slowest request, and an object store's latency
has a long tail: most ranged GETs take a fraction of a second, a few take many times that
and some stall. Two decisions cut that tail, both learned from what the store has been
doing in this process (``LatencyTracker``), both taking the time as an argument so that
the real request runner (``storage.runner``) and the restore simulation
(``bench.tail``) run the same objects, one on the monotonic clock, one on a simulated one:

* **hedging** (``TailPolicy.hedge_now``, ``HedgeBudget``): an idempotent request (a
  ranged GET, a HEAD) gets one duplicate, and whichever finishes first is used and the
  other is cancelled, when it is *silent* (no byte for ``silence_factor`` times the usual
  longest gap without progress, see ``silence_limit``: the likely stall) or *slow*
  (still running after the ``hedge_quantile`` of the recent durations of requests of its
  size class, at least ``hedge_floor``; see ``hedge_delay``). Until a size class has
  ``min_samples`` durations, a request is slow after ``sibling_factor`` times the median
  of those it has (the siblings sent with it that finished), or ``hedge_initial``. A
  request the rest of its batch waits for (*draining*: the batch has nothing left to
  send and slots are idle, or it is a request alone, such as an index read) is slow
  sooner, after ``drain_factor`` times the median of its class: a duplicate then takes
  a slot nothing else would use, and the caller waits for this request only.
  ``HedgeBudget`` keeps duplicates within ``hedge_budget`` of the requests made (plus
  ``hedge_burst``), so a store that is slow for everyone is not sent twice the load; a
  request that is only slow leaves ``hedge_reserve`` of them for silent ones, since a
  stall costs far more than a slow read that is still arriving.
* **stall detection** (``TailPolicy.stall_limit``, ``Progress``): a request that made no
  progress (no byte received, or sent) for ``max(stall_floor, stall_factor *`` the
  ``stall_quantile`` of the longest gaps without progress of recent successful
  requests``)`` is abandoned and retried; ``stall_cap`` (``SHARDSAFE_STALL_TIMEOUT``)
  bounds it, and applies alone until ``min_gaps`` gaps have been seen. An attempt that
  moves bytes but far slower than its siblings (``TailPolicy.crawling``: on course to
  take ``crawl_factor`` times the median of its class while others of the class finish)
  counts as stalled too, never before ``stall_floor``. And however an attempt progresses,
  it may take ``attempt_limit`` in all: the stall cap plus its bytes at
  ``slowest_rate`` (a connection that trickles a byte now and then is never silent).

Size classes are powers of four from 64 KiB (a 32 MiB read and a 20 MiB read share
one), so small index reads do not set the hedge delay of large data reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import knobs

_SMALLEST_CLASS_BITS = 16  # sizes below 64 KiB share class 0


def size_class(size: int) -> int:
    """The class of a request moving ``size`` bytes: 0 below 64 KiB, then one per power of 4."""
    return max(0, (int(size).bit_length() - _SMALLEST_CLASS_BITS + 1) // 2)


class _Window:
    """The last ``capacity`` values of a series and their quantiles (recomputed lazily)."""

    __slots__ = ("capacity", "values", "next", "sorted", "stale", "added")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.values: list[float] = []
        self.next = 0
        self.sorted: list[float] = []
        self.stale = 0
        self.added = 0  # values ever added

    def add(self, value: float) -> None:
        self.added += 1
        if len(self.values) < self.capacity:
            self.values.append(value)
        else:
            self.values[self.next] = value
            self.next = (self.next + 1) % self.capacity
        self.stale += 1

    def quantile(self, q: float) -> float:
        # re-sorting after every sample would cost O(n log n) per request; a few new
        # samples move a quantile of a full window very little
        if self.stale and (self.stale * 16 >= len(self.values) or len(self.values) < 64):
            self.sorted = sorted(self.values)
            self.stale = 0
        s = self.sorted
        return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


class LatencyTracker:
    """Recent durations of successful requests by size class, and their longest gaps
    without progress (one series for all sizes: a gap is a wait for the store, not for
    bytes to move). Pure: durations are given, never measured here.

    Args:
        window: Samples kept per series (the oldest is forgotten first).
    """

    def __init__(self, window: int = 256) -> None:
        self.window = window
        self._durations: dict[int, _Window] = {}
        self._gaps = _Window(window)

    def record(self, size: int, seconds: float, gap: float | None = None) -> None:
        """A request of ``size`` bytes succeeded in ``seconds``; ``gap``: its longest wait
        without progress, when it reported progress."""
        c = size_class(size)
        w = self._durations.get(c)
        if w is None:
            w = self._durations[c] = _Window(self.window)
        w.add(seconds)
        if gap is not None:
            self._gaps.add(gap)

    def samples(self, size: int) -> int:
        """Durations of ``size``'s class kept (at most ``window``)."""
        w = self._durations.get(size_class(size))
        return 0 if w is None else len(w.values)

    def finished(self, size: int) -> int:
        """Requests of ``size``'s class that ever succeeded (a count that only grows:
        compare two readings to know whether any finished in between)."""
        w = self._durations.get(size_class(size))
        return 0 if w is None else w.added

    def duration_quantile(self, size: int, q: float, min_samples: int) -> float | None:
        """The ``q`` quantile of recent durations of ``size``'s class, or None with fewer
        than ``min_samples`` of them."""
        w = self._durations.get(size_class(size))
        return None if w is None or len(w.values) < min_samples else w.quantile(q)

    def gap_quantile(self, q: float, min_samples: int) -> float | None:
        """The ``q`` quantile of recent longest gaps, or None with fewer than ``min_samples``."""
        return None if len(self._gaps.values) < min_samples else self._gaps.quantile(q)


@dataclass(frozen=True, slots=True, kw_only=True)
class TailPolicy:
    """Hedging and stall detection of object-store requests (see the module doc)."""

    hedge: bool = True
    """Whether idempotent requests are hedged at all (``SHARDSAFE_HEDGE``)."""
    hedge_quantile: float = 0.95
    """A request is hedged when it has taken longer than this quantile of its class."""
    hedge_floor: float = 0.05
    """Seconds before which no request is hedged."""
    hedge_initial: float = 1.0
    """Hedge delay (seconds) of a size class with no durations yet, and the longest one
    while it has fewer than ``min_samples``."""
    sibling_factor: float = 3.5
    """With fewer than ``min_samples`` durations, a request is hedged after this many
    times their median."""
    drain_factor: float = 2.5
    """A draining request (its batch has nothing left to send and slots are idle) is
    hedged after this many times the median duration of its class, when that is sooner."""
    hedge_budget: float = 0.05
    """Duplicates per request made, at most (``SHARDSAFE_HEDGE_BUDGET``)."""
    hedge_burst: int = 4
    """Duplicates allowed beyond ``hedge_budget`` (see ``HedgeBudget``)."""
    hedge_reserve: int = 2
    """Duplicates of the budget that only silent requests may take (a slow request that is
    still receiving bytes gets one while more than this many are left): slow requests get
    ``hedge_burst - hedge_reserve`` beyond the fraction, silent ones all of it."""
    silence_factor: float = 4.0
    """A request that received no byte for this many times the usual longest gap without
    progress (the ``stall_quantile`` of recent ones) is silent: hedged as a likely stall."""
    silence_floor: float = 0.25
    """Seconds without a byte that never make a request silent (a store's first byte
    rarely takes longer when it is not stalled, and a few early gaps say little)."""
    silence_initial: float = 0.5
    """Seconds without a byte that make a request silent before this process has seen any
    gap (its first requests: the index reads of a restore), and the most it takes while it
    has seen fewer than ``min_gaps``."""
    min_samples: int = 32
    """Durations of a size class a hedge quantile needs before it is trusted."""
    min_gaps: int = 8
    """Gaps the stall limit needs before it is learned."""
    stall_floor: float = 2.0
    """Seconds without progress that never count as a stall (``SHARDSAFE_STALL_FLOOR``)."""
    stall_factor: float = 4.0
    """A stall is this many times the usual longest wait without progress."""
    stall_quantile: float = 0.99
    """The quantile of recent longest gaps that counts as usual."""
    crawl_factor: float = 8.0
    """An attempt on course to take this many times the median duration of its class,
    while others of the class finish, is stalled (see ``crawling``)."""
    slowest_rate: float = float(1 << 20)
    """Bytes per second below which an attempt counts as stalled whatever its progress
    (see ``attempt_limit``)."""
    stall_cap: float = 30.0
    """Seconds without progress that always count as a stall (``SHARDSAFE_STALL_TIMEOUT``)."""

    def __post_init__(self) -> None:
        if not (0 < self.hedge_quantile < 1 and 0 < self.stall_quantile < 1):
            raise ValueError(f"quantiles must lie in (0, 1), got {self.hedge_quantile}, {self.stall_quantile}")
        if not 0 <= self.hedge_budget <= 1:
            raise ValueError(f"hedge_budget must lie in [0, 1], got {self.hedge_budget}")
        if not 0 < self.stall_floor <= self.stall_cap:
            raise ValueError(f"need 0 < stall_floor <= stall_cap, got {self.stall_floor}, {self.stall_cap}")
        if self.hedge_floor < 0 or self.hedge_initial < self.hedge_floor or self.stall_factor <= 0 \
                or self.sibling_factor < 1 or self.drain_factor < 1 or self.crawl_factor < 1 \
                or self.silence_factor <= 0 or not 0 < self.silence_floor <= self.silence_initial:
            raise ValueError("need 0 <= hedge_floor <= hedge_initial, 0 < silence_floor <= silence_initial, "
                             "stall_factor > 0, silence_factor > 0, sibling_factor, drain_factor and "
                             "crawl_factor >= 1")
        if self.min_samples < 1 or self.min_gaps < 1 or self.hedge_burst < 0 or self.hedge_reserve < 0 \
                or self.slowest_rate <= 0:
            raise ValueError("need min_samples >= 1, min_gaps >= 1, hedge_burst >= 0, hedge_reserve >= 0 "
                             "and slowest_rate > 0")

    @classmethod
    def from_knobs(cls) -> TailPolicy:
        """The policy the environment asks for (``SHARDSAFE_HEDGE``, ``SHARDSAFE_HEDGE_BUDGET``,
        ``SHARDSAFE_STALL_FLOOR``, ``SHARDSAFE_STALL_TIMEOUT``)."""
        cap = knobs.stall_timeout()
        return cls(hedge=knobs.hedge(), hedge_budget=knobs.hedge_budget(),
                   stall_floor=min(knobs.stall_floor(), cap), stall_cap=cap)

    def hedge_delay(self, tracker: LatencyTracker, size: int, draining: bool = False) -> float | None:
        """Seconds after its start at which a request of ``size`` bytes is hedged (None:
        never, hedging is off); ``draining``: the rest of its batch waits for it. The delay
        changes as requests finish: callers ask again while they wait."""
        if not self.hedge:
            return None
        median = tracker.duration_quantile(size, 0.5, 1)
        q = tracker.duration_quantile(size, self.hedge_quantile, self.min_samples)
        if q is not None:
            delay = max(self.hedge_floor, q)
        elif median is None:
            delay = self.hedge_initial
        else:
            # too few for a quantile: the first requests of a job are sent together, and
            # one far slower than the siblings that already finished is hedged
            delay = min(self.hedge_initial, max(self.hedge_floor, self.sibling_factor * median))
        if draining and median is not None:
            delay = min(delay, max(self.hedge_floor, self.drain_factor * median))
        return delay

    def silence_limit(self, tracker: LatencyTracker) -> float | None:
        """Seconds without progress after which an idempotent request is hedged as a likely
        stall (None: hedging is off): ``silence_factor`` times the usual longest gap, at
        least ``silence_floor``. Before ``min_gaps`` gaps it is their largest times the factor,
        at most ``silence_initial`` (``silence_initial`` with none): a wrong guess costs one
        duplicate, not a cut connection, so it need not wait to be learned as the stall
        limit does."""
        if not self.hedge:
            return None
        q = tracker.gap_quantile(self.stall_quantile, self.min_gaps)
        if q is not None:
            return max(self.silence_floor, self.silence_factor * q)
        largest = tracker.gap_quantile(1.0, 1)
        if largest is None:
            return self.silence_initial
        return min(self.silence_initial, max(self.silence_floor, self.silence_factor * largest))

    def hedge_now(self, tracker: LatencyTracker, budget: HedgeBudget, size: int, elapsed: float,
                  silent: float | None, draining: bool = False) -> bool:
        """Whether a request of ``size`` bytes, running for ``elapsed`` seconds and without
        progress for the last ``silent`` of them (None: it reports no progress), gets its
        duplicate now (``draining``: see ``hedge_delay``); takes it from ``budget`` if so.
        Callers ask again while they wait (the limits change as requests finish), and never
        once a duplicate was sent."""
        if not self.hedge:
            return False
        if silent is not None and silent >= self.silence_limit(tracker):  # type: ignore[operator]
            return budget.take()
        delay = self.hedge_delay(tracker, size, draining)
        return delay is not None and elapsed >= delay and budget.take(self.hedge_reserve)

    def stall_limit(self, tracker: LatencyTracker) -> float:
        """Seconds without progress after which a request counts as stalled."""
        q = tracker.gap_quantile(self.stall_quantile, self.min_gaps)
        if q is None:
            return self.stall_cap
        return min(self.stall_cap, max(self.stall_floor, self.stall_factor * q))

    def attempt_limit(self, size: int) -> float:
        """Seconds one attempt to move ``size`` bytes may take in all, however it
        progresses: ``stall_cap`` plus its bytes at ``slowest_rate`` (a 32 MiB part: 62 s
        by default). The call's deadline bounds it too."""
        return self.stall_cap + size / self.slowest_rate

    def crawling(self, tracker: LatencyTracker, size: int, elapsed: float, moved: int,
                 finished_since: int) -> bool:
        """Whether an attempt to move ``size`` bytes that moved ``moved`` of them in
        ``elapsed`` seconds, while ``finished_since`` requests of its class succeeded, is
        far slower than its siblings, and so stalled: it has run for ``stall_floor`` at
        least, others of its class finished meanwhile (a store slow for everyone is not a
        stall), and at its rate so far it would take more than ``crawl_factor`` times the
        median of its class (from ``min_gaps`` durations at least) in all, with more than
        twice that median still to go (a new attempt would very likely be sooner)."""
        if moved <= 0 or moved >= size or elapsed < self.stall_floor or finished_since < 1:
            return False
        median = tracker.duration_quantile(size, 0.5, self.min_gaps)
        if median is None:
            return False
        projected = elapsed * size / moved
        return projected > self.crawl_factor * median and projected - elapsed > 2 * median


class HedgeBudget:
    """Counts requests and duplicates; a duplicate is allowed while duplicates stay within
    ``fraction`` of the requests made plus ``burst`` (so that a process that makes few
    requests, such as one rank's restore, can still hedge a stall after a slow request)."""

    __slots__ = ("fraction", "burst", "requests", "hedges")

    def __init__(self, fraction: float, burst: int = 1) -> None:
        self.fraction = fraction
        self.burst = burst
        self.requests = 0
        self.hedges = 0

    def started(self) -> None:
        """A request (not a duplicate) started."""
        self.requests += 1

    def take(self, reserve: int = 0) -> bool:
        """Whether one more duplicate may be sent now, leaving ``reserve`` of the budget
        untaken; counts it if so."""
        if self.fraction <= 0 or self.hedges + 1 + reserve > self.fraction * self.requests + self.burst:
            return False
        self.hedges += 1
        return True


class Progress:
    """What one attempt has done so far: when it started and last made progress, and its
    longest wait without progress. ``reporting`` is set once the request notes progress
    at all (only such requests are judged by ``stalled``)."""

    __slots__ = ("started", "last", "longest_gap", "bytes", "reporting")

    def __init__(self, now: float) -> None:
        self.started = self.last = now
        self.longest_gap = 0.0
        self.bytes = 0
        self.reporting = False

    def note(self, now: float, nbytes: int) -> None:
        """``nbytes`` more bytes moved at ``now`` (0: the request reports progress, none yet)."""
        self.reporting = True
        if nbytes:
            self.longest_gap = max(self.longest_gap, now - self.last)
            self.last = now
            self.bytes += nbytes

    def silence(self, now: float) -> float | None:
        """Seconds since the attempt's last progress (None: it reports none)."""
        return now - self.last if self.reporting else None

    def stalled(self, now: float, limit: float) -> bool:
        """Whether the attempt has made no progress for ``limit`` seconds."""
        return self.reporting and now - self.last >= limit


__all__ = ["HedgeBudget", "LatencyTracker", "Progress", "TailPolicy", "size_class"]
