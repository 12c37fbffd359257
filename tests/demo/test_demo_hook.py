"""The worker's checkpoint hook on a real CheckpointManager, and the parent's event log."""

from __future__ import annotations

import logging
import os
import signal

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

import shardsafe  # noqa: E402
from shardsafe.demo.events import WorkerLog  # noqa: E402
from shardsafe.demo.hook import CheckpointHook, CommitClock  # noqa: E402


class Events:
    def __init__(self) -> None:
        self.items: list[tuple[str, dict]] = []

    def __call__(self, event: str, **fields) -> None:
        self.items.append((event, fields))

    def of(self, kind: str) -> list[dict]:
        return [f for e, f in self.items if e == kind]


@pytest.fixture
def clock():
    c = CommitClock.install()
    yield c
    logging.getLogger("shardsafe").removeHandler(c)


@pytest.mark.parametrize("async_save", [True, False])
def test_hook_saves_on_schedule_and_reports_stall_and_time_to_durable(tmp_path, clock,
                                                                      async_save) -> None:
    events = Events()
    state = {"w": np.arange(1000, dtype=np.float32), "step": 0}
    with shardsafe.CheckpointManager(tmp_path, save_interval_steps=3, max_to_keep=2,
                                     async_save=async_save) as mgr:
        hook = CheckpointHook(mgr, events, clock)
        for step in range(1, 11):
            state["step"] = step
            assert hook(step, state) is False
        hook.finish(10, state)
        assert mgr.all_steps() == [9, 10]  # max_to_keep 2
    saves = events.of("save")
    assert [(s["step"], s["reason"]) for s in saves] == [
        (3, "schedule"), (6, "schedule"), (9, "schedule"), (10, "final")]
    assert [s["step"] for s in events.of("step")] == list(range(1, 11))
    # every save became durable; an async save took at least as long as save() blocked, a
    # synchronous one was durable before save() returned (it returns after retention too)
    durable = {d["step"]: d["after_s"] for d in events.of("durable")}
    assert sorted(durable) == [3, 6, 9, 10]
    for s in saves:
        if async_save:
            assert 0 <= s["stall_s"] <= durable[s["step"]] + 1e-3
        else:
            assert 0 <= durable[s["step"]] <= s["stall_s"] + 1e-3


def test_hook_stops_the_loop_once_a_preemption_is_saved(tmp_path, clock) -> None:
    events = Events()
    state = {"w": np.ones(10), "step": 0}
    with shardsafe.CheckpointManager(tmp_path, save_interval_steps=100,
                                     preemption_signals=(signal.SIGTERM,)) as mgr:
        hook = CheckpointHook(mgr, events, clock)
        assert hook(1, state) is False
        os.kill(os.getpid(), signal.SIGTERM)  # a real signal; the manager's handler notes it
        assert hook(2, state) is True
        assert hook.preempted_at == 2
        hook.wait()
        assert mgr.all_steps() == [2]
    assert [(s["step"], s["reason"]) for s in events.of("save")] == [(2, "preemption")]


def test_worker_log_folds_events() -> None:
    log = WorkerLog("w")
    for ev in [
        {"event": "start", "step": 20, "resumed_from": 20, "pid": 1},
        {"event": "step", "step": 21},
        {"event": "save", "step": 21, "stall_s": 0.5, "reason": "preemption"},
        {"event": "durable", "step": 21, "after_s": 0.75},
        {"event": "preempted", "step": 21, "signal": "SIGTERM", "wait_s": 0.25},
        {"event": "something new", "step": 99},
    ]:
        log.handle(ev)
    assert (log.start_step, log.resumed_from, log.last_step, log.steps_run) == (20, 20, 21, 1)
    assert [(s.step, s.stall_s, s.reason, s.durable_s) for s in log.saves] == [
        (21, 0.5, "preemption", 0.75)]
    assert (log.preempted_step, log.preempt_wait_s, log.fingerprint) == (21, 0.25, None)
