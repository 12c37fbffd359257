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


def _make(silent_first: float):  # noqa: ANN202 - the request: its first copy sends nothing for a while
    calls: list[int] = []

    async def make() -> bytes:
        calls.append(1)
        p = progress()
        assert p is not None
        p.note(time.monotonic(), 0)
        if len(calls) == 1:
            await asyncio.sleep(silent_first)
        p.note(time.monotonic(), 3)
        return b"abc"

    return make, calls


def test_a_silent_read_is_hedged_before_it_is_slow() -> None:
    runner = _runner(hedge_initial=30.0)
    make, calls = _make(silent_first=60.0)
    pending = runner.submit(Request("GET", "b/k", "bytes 0-3", size=64 * MiB, idempotent=True), make)
    assert pending.future.result(timeout=10) == b"abc"
    assert len(calls) == 2 and runner.tail.budget.hedges == 1


def test_a_request_that_is_not_idempotent_is_never_hedged() -> None:
    runner = _runner(hedge_initial=31.0)
    make, calls = _make(silent_first=1.0)
    pending = runner.submit(Request("PUT", "b/k", "part 1/1", size=64 * MiB), make)
    assert pending.future.result(timeout=10) == b"abc"
    assert len(calls) == 1 and runner.tail.budget.hedges == 0
