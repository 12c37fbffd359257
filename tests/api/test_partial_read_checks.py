"""A load that reads only part of a version 4 index checks what it reads as strictly as a
whole read: forged layouts that a whole load refuses are refused by a load in place and
by the manager's restore too, before any target is written (docs/FORMAT.md 15.5)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

import shardsafe
from shardsafe import CheckpointManager, CorruptCheckpointError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "format"))
from v4_forge import halve_twice, seal_v4, split_v4  # noqa: E402


def _state() -> dict:
    return {"w": torch.tensor([1.0, 2.0, 3.0, 4.0]), "b": torch.ones(3), "step": 3}


def _target() -> dict:
    return {"w": torch.full((4,), -7.0), "b": torch.zeros(3), "step": 0}


def test_duplicate_boxes_are_refused_by_a_load_in_place(tmp_path) -> None:
    path = str(tmp_path / "ck")
    shardsafe.save(_state(), path)
    halve_twice(path, "w")
    target = _target()
    with pytest.raises(CorruptCheckpointError, match=r"tensor w: chunks overlap"):
        shardsafe.load(path, target)
    assert torch.equal(target["w"], torch.full((4,), -7.0))  # refused while planning: nothing written
    assert torch.equal(target["b"], torch.zeros(3)) and target["step"] == 0
    with pytest.raises(CorruptCheckpointError, match=r"tensor w: chunks overlap"):
        shardsafe.load(path)  # the whole read agrees


def test_duplicate_boxes_are_refused_by_the_manager(tmp_path) -> None:
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, _state())
        mgr.save(2, {**_state(), "w": torch.tensor([5.0, 6.0, 7.0, 8.0])})
    halve_twice(str(tmp_path / "step_00000002"), "w")
    target = _target()
    with CheckpointManager(tmp_path, restore_fallback=False) as mgr:
        with pytest.raises(CorruptCheckpointError, match=r"tensor w: chunks overlap"):
            mgr.restore(target, step=2)
    assert torch.equal(target["w"], torch.full((4,), -7.0))
    with CheckpointManager(tmp_path) as mgr:  # with fallback: the intact older step
        assert mgr.restore(target) == 1
    assert torch.equal(target["w"], torch.tensor([1.0, 2.0, 3.0, 4.0]))


def test_whole_files_must_list_the_file_of_every_one_chunk_tensor(tmp_path) -> None:
    path = str(tmp_path / "ck")
    shardsafe.save(_state(), path)
    index = os.path.join(path, "index.json")
    with open(index, "rb") as f:
        forged = split_v4(f.read())
    forged.js["whole_files"] = []
    with open(index, "wb") as f:
        f.write(seal_v4(forged))
    target = _target()
    for load in (lambda: shardsafe.load(path, target), lambda: shardsafe.load(path)):  # both readers agree
        with pytest.raises(CorruptCheckpointError, match=r"tensor \w+: its one chunk lies in data file 0, "
                                                         r"which whole_files does not list"):
            load()
    assert torch.equal(target["w"], torch.full((4,), -7.0))
