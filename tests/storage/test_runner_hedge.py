"""The request runner hedges on the tail policy's word: a read whose attempt receives
nothing is duplicated once it is silent, long before it would count as slow, and a
request that is not idempotent never is (real coroutines on fsspec's event loop)."""

from __future__ import annotations

import asyncio
import time

import pytest

fsspec_asyn = pytest.importorskip("fsspec.asyn")

from shardsafe.storage.runner import Request, Runner, progress  # noqa: E402
from shardsafe.storage.retry import RetryPolicy  # noqa: E402
from shardsafe.storage.tail import TailPolicy  # noqa: E402

MiB = 1 << 20


def _runner(hedge_initial: float) -> Runner:
    # a policy of its own (the learned state is kept per loop and policy); a request is
    # slow only after hedge_initial, and never cut for a stall within the test
    policy = TailPolicy(hedge_initial=hedge_initial, stall_floor=50.0, stall_cap=60.0)
    runner = Runner(fsspec_asyn.get_loop(), RetryPolicy(stall_timeout=60.0), tail=policy)
    for _ in range(10):  # gaps of 0.01 s learned: silent after 0.25 s (the silence floor)
        runner.tail.tracker.record(4 << 10, 0.02, 0.01)
    return runner


def _make(first_takes: float, every: float | None = None):  # noqa: ANN202
    """The request: its first copy takes ``first_takes`` s, silent all along (``every``
    None) or moving a byte each ``every`` s; the others answer at once."""
    calls: list[int] = []

    async def make() -> bytes:
        calls.append(1)
        p = progress()
        assert p is not None
        p.note(time.monotonic(), 0)
        if len(calls) == 1:
            end = time.monotonic() + first_takes
            while time.monotonic() < end:
                await asyncio.sleep(first_takes if every is None else every)
                if every is not None:
                    p.note(time.monotonic(), 1)
        p.note(time.monotonic(), 3)
        return b"abc"

    return make, calls


def test_a_silent_read_is_hedged_before_it_is_slow() -> None:
    runner = _runner(hedge_initial=30.0)
    make, calls = _make(60.0)
    pending = runner.submit(Request("GET", "b/k", "bytes 0-3", size=64 * MiB, idempotent=True), make)
    assert pending.future.result(timeout=10) == b"abc"
    assert len(calls) == 2 and runner.tail.budget.hedges == 1


def test_a_request_that_is_not_idempotent_is_never_hedged() -> None:
    runner = _runner(hedge_initial=31.0)
    make, calls = _make(1.0)
    pending = runner.submit(Request("PUT", "b/k", "part 1/1", size=64 * MiB), make)
    assert pending.future.result(timeout=10) == b"abc"
    assert len(calls) == 1 and runner.tail.budget.hedges == 0


def _draining_runner(stall_cap: float) -> Runner:
    # reads of the class took 0.1 s; too few for a quantile, and the sibling factor puts
    # the slow mark at 30 s: only draining (2.5 x the median, 0.25 s) hedges within a test
    # (a stall cap of each test's own keeps its learned state apart)
    policy = TailPolicy(hedge_initial=30.0, sibling_factor=300.0, drain_factor=2.5, stall_floor=50.0,
                        stall_cap=stall_cap)
    runner = Runner(fsspec_asyn.get_loop(), RetryPolicy(stall_timeout=60.0), tail=policy)
    for _ in range(10):
        runner.tail.tracker.record(64 * MiB, 0.1, 0.01)
    return runner


def test_a_request_is_hedged_sooner_once_its_batch_is_draining() -> None:
    runner = _draining_runner(stall_cap=60.0)
    make, calls = _make(60.0, every=0.05)
    pending = runner.submit(Request("GET", "b/k", "bytes 0-3", size=64 * MiB, idempotent=True), make)
    time.sleep(0.75)  # three times the draining delay, and never silent: not hedged yet
    assert runner.tail.budget.hedges == 0 and len(calls) == 1
    pending.drain()
    assert pending.future.result(timeout=10) == b"abc"
    assert len(calls) == 2 and runner.tail.budget.hedges == 1


def test_a_request_run_alone_is_draining_from_its_start() -> None:
    runner = _draining_runner(stall_cap=61.0)
    make, calls = _make(60.0, every=0.05)
    assert runner.run(Request("GET", "b/k", "bytes 0-3", size=64 * MiB, idempotent=True), make) == b"abc"
    assert len(calls) == 2 and runner.tail.budget.hedges == 1


def test_an_attempt_far_slower_than_its_siblings_is_cut_and_retried() -> None:
    # no hedging: the crawling attempt (a byte per 50 ms of 64 MiB, siblings took 50 ms)
    # is cut after the stall floor once a sibling finished, and the retry answers
    policy = TailPolicy(hedge=False, stall_floor=0.5, stall_cap=60.0)
    runner = Runner(fsspec_asyn.get_loop(), RetryPolicy(stall_timeout=60.0, base_delay=0.01), tail=policy)
    for _ in range(10):
        runner.tail.tracker.record(64 * MiB, 0.05, 0.01)
    make, calls = _make(60.0, every=0.05)
    pending = runner.submit(Request("GET", "b/k", "bytes 0-3", size=64 * MiB, idempotent=True), make)
    sibling, _ = _make(0.0, every=0.05)
    assert runner.run(Request("GET", "b/j", "bytes 0-3", size=64 * MiB, idempotent=True), sibling) == b"abc"
    assert pending.future.result(timeout=10) == b"abc"
    assert len(calls) == 2 and runner.tail.budget.hedges == 0


def test_an_attempt_that_trickles_is_cut_at_the_time_sized_to_its_bytes() -> None:
    # never silent for the stall limit (a byte each 50 ms) and no siblings to be slower
    # than: only the attempt limit, 0.3 s + 16 MiB at 32 MiB/s = 0.8 s, cuts it
    policy = TailPolicy(hedge=False, stall_floor=0.2, stall_cap=0.3, slowest_rate=32 * MiB)
    runner = Runner(fsspec_asyn.get_loop(), RetryPolicy(stall_timeout=0.3, base_delay=0.01), tail=policy)
    make, calls = _make(60.0, every=0.05)
    assert policy.attempt_limit(16 * MiB) == pytest.approx(0.8)
    pending = runner.submit(Request("PUT", "b/k", "part 1/1", size=16 * MiB), make)
    assert pending.future.result(timeout=10) == b"abc"
    assert len(calls) == 2
