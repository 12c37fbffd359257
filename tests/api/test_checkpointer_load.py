"""``Checkpointer.load``: a load among the Checkpointer's ranks, after its save in flight."""

from __future__ import annotations

import pytest
import torch

import shardsafe
from shardsafe.errors import CheckpointError, StateMismatchError


def test_load_waits_for_the_save_in_flight_and_takes_the_same_options(tmp_path) -> None:
    path = str(tmp_path / "c")
    state = {"w": torch.arange(12.0).reshape(3, 4), "step": 3}
    with shardsafe.Checkpointer() as ckpt:
        ckpt.async_save(state, path)  # blocking staging: the state may change from here on
        state["w"].zero_()
        target = {"w": torch.empty(3, 4), "step": 0}
        assert ckpt.load(path, target) == shardsafe.LoadResult()  # no wait needed by the caller
        assert torch.equal(target["w"], torch.arange(12.0).reshape(3, 4)) and target["step"] == 3
        assert ckpt.load(path)["step"] == 3
        assert ckpt.load(path, {"w": torch.empty(3, 4, dtype=torch.float64), "step": 0}, cast=True).problems == []
        with pytest.raises(StateMismatchError):
            ckpt.load(path, {"w": torch.empty(4, 3), "step": 0})


def test_load_raises_the_uncollected_error_of_the_save_in_flight(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    shardsafe.save({"w": torch.ones(3)}, str(tmp_path / "good"))
    ckpt = shardsafe.Checkpointer()
    ckpt.async_save({"w": torch.ones(3)}, str(blocker / "c"))  # fails in the background
    with pytest.raises(CheckpointError, match="previous async save .*file.* failed"):
        ckpt.load(str(tmp_path / "good"))
    assert ckpt.load(str(tmp_path / "good"))["w"].tolist() == [1.0, 1.0, 1.0]  # collected: loads go on
    ckpt.close()
