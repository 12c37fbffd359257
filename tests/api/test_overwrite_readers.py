"""Readers during an overwrite: a load whose checkpoint is replaced
between reading the index and reading the data sees the old or the new checkpoint,
never a CorruptCheckpointError on a healthy one.

Deterministic: the target holds a stateful object whose ``state_dict()`` (which an
in-place load calls after it has read the index, to find the tensors to fill) overwrites
the checkpoint once, so the swap always falls between the index and the data.
"""

from __future__ import annotations

import os

import pytest
import torch

import shardsafe


class OverwritesOnce:
    """A stateful object; the first ``state_dict()`` call overwrites ``path``."""

    def __init__(self, path: str, new_state: dict) -> None:
        self.path, self.new_state, self.fired = path, new_state, False
        self.w = torch.full((50_000,), -1.0)

    def state_dict(self) -> dict:
        if not self.fired:
            self.fired = True
            shardsafe.save(self.new_state, self.path, overwrite=True)
        return {"w": self.w}

    def load_state_dict(self, sd: dict) -> None:
        self.w.copy_(sd["w"])


def _state(value: float) -> dict:
    return {"m": {"w": torch.full((50_000,), value)}, "step": int(value)}


@pytest.mark.parametrize("rounds", [5])
def test_overwrite_between_index_and_data_loads_old_or_new(tmp_path, rounds: int) -> None:
    """The checkpoint is replaced after its index was read: the load must not check the
    new checkpoint's data against the old index (a CorruptCheckpointError on a healthy
    checkpoint)."""
    path = str(tmp_path / "ckpt")
    shardsafe.save(_state(1.0), path)
    for r in range(rounds):
        new = float(r + 2)
        target = {"m": OverwritesOnce(path, _state(new)), "step": 0}
        shardsafe.load(path, target)
        assert target["m"].fired
        got = target["m"].w
        assert (target["step"], float(got[0])) in ((int(new) - 1, new - 1), (int(new), new))
        assert bool((got == got[0]).all())  # one checkpoint, never a mix
    assert os.listdir(tmp_path) == ["ckpt"]


def test_new_load_after_the_overwrite_reads_the_new_checkpoint(tmp_path) -> None:
    path = str(tmp_path / "ckpt")
    shardsafe.save(_state(1.0), path)
    target = {"m": OverwritesOnce(path, _state(9.0)), "step": 0}
    shardsafe.load(path, target)
    assert shardsafe.load(path)["step"] == 9
