"""CheckpointManager(..., compression=...): saves compressed, restores, refuses bad values."""

from __future__ import annotations

import os

import pytest
import torch

import shardsafe
from shardsafe.plan.layout import block_file_name

BLOCKS = block_file_name(0)


def test_manager_saves_compressed_and_restores(tmp_path) -> None:
    state = {"w": (torch.randn(300, 200) * 0.02).to(torch.bfloat16), "step": 0}
    with shardsafe.CheckpointManager(tmp_path / "run", compression="auto") as mgr:
        mgr.save(1, state)
        mgr.wait_until_finished()
        assert os.path.exists(tmp_path / "run" / "step_00000001" / BLOCKS)
        target = {"w": torch.zeros(300, 200, dtype=torch.bfloat16), "step": -1}
        assert mgr.restore(target) == 1
    assert torch.equal(target["w"], state["w"]) and target["step"] == 0
    with pytest.raises(ValueError, match="compression"):
        shardsafe.CheckpointManager(tmp_path / "run2", compression="lz4")
