"""Young/Daly interval: the formula (a table) and the measuring decision (a fake clock)."""

from __future__ import annotations

import math
import time

import pytest
import torch

from shardsafe import CheckpointManager
from shardsafe.manager.interval import AutoInterval, young_daly_steps


@pytest.mark.parametrize("cost, step, mtbf, want", [
    (2.0, 1.0, 3600.0, 120),      # sqrt(2*2*3600) = 120 s of 1 s steps
    (0.5, 0.1, 3600.0, 600),      # sqrt(3600) = 60 s / 0.1 s
    (0.001, 10.0, 60.0, 1),       # cheaper than a step: every step
    (0.0, 1.0, 3600.0, 1),
    (8.0, 2.0, 86400.0, round(math.sqrt(2 * 8 * 86400) / 2)),
])
def test_young_daly_steps(cost: float, step: float, mtbf: float, want: int) -> None:
    assert young_daly_steps(cost, step, mtbf) == want


def test_young_daly_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        young_daly_steps(1.0, 0.0, 100.0)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_auto_interval_measures_cost_and_step_time() -> None:
    clock, agreed = Clock(), []
    auto = AutoInterval(3600.0, agree=lambda v: agreed.append(v) or v, clock=clock)
    assert auto.due(0)              # the first save measures the cost
    clock.t += 2.0                  # the save blocks 2 s
    auto.saved(0, 2.0)
    for s in range(1, 200):
        clock.t += 1.0              # 1 s steps
        due = auto.due(s)
        if s < 120:
            assert not due, s
        else:
            assert due and s == 120
            break
    assert agreed == [120] and auto.interval == 120
    assert auto.step_s == pytest.approx(1.0) and auto.cost_s == pytest.approx(2.0)


def test_manager_auto_interval(tmp_path) -> None:
    state = {"w": torch.zeros(1024)}
    with CheckpointManager(tmp_path, save_interval_steps="auto", expected_mtbf_seconds=1e-6,
                           async_save=False) as mgr:
        assert mgr.current_interval_steps is None
        for s in range(4):
            time.sleep(0.01)  # a training step
            mgr.save(s, state)
        assert mgr.current_interval_steps == 1  # a tiny MTBF: save every step
        assert mgr.all_steps() == [0, 1, 2, 3]
    with CheckpointManager(tmp_path / "b", save_interval_steps="auto", expected_mtbf_seconds=1e9) as mgr:
        for s in range(5):
            time.sleep(0.01)
            mgr.save(s, state)
        mgr.wait_until_finished()
        assert mgr.current_interval_steps > 5 and mgr.all_steps() == [0]
