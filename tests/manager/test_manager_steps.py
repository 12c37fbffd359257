"""Step directories: which directory stands for a step when two names parse to it."""

from __future__ import annotations

import os

import torch

import shardsafe
from shardsafe import CheckpointManager
from shardsafe.manager.steps import StepDirectory, step_name
from shardsafe.storage import LocalStorage


def test_canonical_name_wins_over_a_name_listed_before_it(tmp_path) -> None:
    # "step_000000005" sorts before "step_00000005" and both parse to step 5: only the
    # preference for the canonical name makes the manager use its own save of step 5
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        assert mgr.save(5, {"w": torch.ones(3)}, metrics={"loss": 0.5})
        shardsafe.save({"w": torch.zeros(3)}, str(tmp_path / "step_000000005"))  # a stray copy
        names = sorted(n for n in os.listdir(tmp_path) if n.startswith("step_"))
        assert names == ["step_000000005", step_name(5)]  # the stray copy is listed first
        assert StepDirectory(LocalStorage(), str(tmp_path)).committed() == {5: step_name(5)}
        assert mgr.all_steps() == [5] and mgr.metrics(5) == {"loss": 0.5}
        state = {"w": torch.full((3,), 7.0)}
        assert mgr.restore(state) == 5 and torch.equal(state["w"], torch.ones(3))
        state = {"w": torch.full((3,), 7.0)}
        assert mgr.restore(state, step=5) == 5 and torch.equal(state["w"], torch.ones(3))


def test_other_name_counts_when_the_canonical_one_is_not_committed(tmp_path) -> None:
    shardsafe.save({"w": torch.zeros(3)}, str(tmp_path / "step_5"))
    os.makedirs(tmp_path / step_name(5))  # no index: not committed
    assert StepDirectory(LocalStorage(), str(tmp_path)).committed() == {5: "step_5"}
