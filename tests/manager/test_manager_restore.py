"""restore(): the newest step that verifies, with a warning for each damaged newer step."""

from __future__ import annotations

import logging
import os

import numpy as np
import helpers
import pytest
import torch

from shardsafe import CheckpointManager, CorruptCheckpointError
from shardsafe.api.load import read_checkpoint_index


def make_state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"model": {f"layer{i}": torch.randn(256, 64, generator=g) for i in range(6)},
            "opt": {"exp_avg": np.full((128,), step, dtype=np.float64)}, "step": step}


def assert_state(state: dict, step: int) -> None:
    want = make_state(step)
    for k, v in want["model"].items():
        assert torch.equal(state["model"][k], v), k
    assert np.array_equal(state["opt"]["exp_avg"], want["opt"]["exp_avg"])
    assert state["step"] == step


def flip_byte(step_dir: str, key: tuple = ("model", "layer3"), at: int = 100) -> None:
    index = read_checkpoint_index(step_dir)
    chunk = next(t.chunks[0] for t in index.tensors if t.key == key)
    helpers.flip_byte(os.path.join(step_dir, chunk.file), chunk.offset + at, 0x01)


@pytest.fixture
def two_steps(tmp_path) -> str:
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, make_state(1))
        mgr.save(2, make_state(2))
    return str(tmp_path)


def test_flipped_byte_falls_back_with_warning(two_steps, caplog) -> None:
    flip_byte(os.path.join(two_steps, "step_00000002"))
    state = make_state(7)
    with caplog.at_level(logging.WARNING, logger="shardsafe"):
        with CheckpointManager(two_steps) as mgr:
            assert mgr.restore(state) == 1
            # every tensor equals step 1, also those read from step 2 before the bad chunk
            assert_state(state, 1)
            # the damaged step is set aside, so training continues saving after step 1
            assert mgr.all_steps() == [1]
            assert mgr.save(2, make_state(2))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("step 2" in w and "checksum mismatch" in w and "model.layer3" in w for w in warnings)
    assert any("corrupt step 2" in w and "step_00000002.corrupt" in w for w in warnings)
    assert sorted(os.listdir(two_steps)) == ["step_00000001", "step_00000002", "step_00000002.corrupt"]


def test_fallback_off_raises_and_leaves_partial_state(two_steps) -> None:
    flip_byte(os.path.join(two_steps, "step_00000002"))
    state = make_state(7)
    with CheckpointManager(two_steps, restore_fallback=False) as mgr:
        with pytest.raises(CorruptCheckpointError, match="checksum mismatch") as info:
            mgr.restore(state)
        assert any("step 2" in n for n in getattr(info.value, "__notes__", []))
        assert mgr.all_steps() == [1, 2]  # nothing moved aside
    # the in-place load did write the intact tensors of step 2 before failing: this is what
    # a fallback must overwrite completely (see the test above)
    want = make_state(2)["model"]
    assert any(torch.equal(state["model"][k], want[k]) for k in want if k != "layer3")


@pytest.mark.parametrize("damage", ["missing", "truncated", "index"])
def test_other_damage_falls_back(two_steps, damage, caplog) -> None:
    d = os.path.join(two_steps, "step_00000002")
    data = os.path.join(d, read_checkpoint_index(d).files[0].name)
    if damage == "missing":
        os.remove(data)
    elif damage == "truncated":
        os.truncate(data, os.path.getsize(data) - 10)
    else:
        helpers.flip_byte(os.path.join(d, "index.json"), 20)
    state = make_state(7)
    with caplog.at_level(logging.WARNING, logger="shardsafe"):
        with CheckpointManager(two_steps, read_only=True) as ro:
            assert ro.restore(state) == 1
            assert ro.all_steps() == [1, 2]  # a reader never moves anything
    assert_state(state, 1)
    assert "step 2" in caplog.text and "falling back" in caplog.text


def test_all_steps_corrupt_raises(two_steps) -> None:
    for s in (1, 2):
        flip_byte(os.path.join(two_steps, f"step_0000000{s}"))
    with CheckpointManager(two_steps) as mgr:
        with pytest.raises(CorruptCheckpointError, match="no committed step.*step 2.*step 1"):
            mgr.restore(make_state(0))
        assert mgr.all_steps() == [1, 2]


def test_explicit_step_does_not_fall_back(two_steps) -> None:
    flip_byte(os.path.join(two_steps, "step_00000002"))
    with CheckpointManager(two_steps) as mgr:
        with pytest.raises(CorruptCheckpointError):
            mgr.restore(make_state(0), step=2)
        state = make_state(0)
        assert mgr.restore(state, step=1) == 1
        assert_state(state, 1)
