"""dcp.load through shardsafe.dcp.Reader on checkpoints that shardsafe.save and a
CheckpointManager wrote; checksums verified through DCP; dtype casts; clear errors."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from helpers import flip_byte
from torch.distributed.checkpoint.api import CheckpointException

import shardsafe
from shardsafe.dcp import Reader


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))


def test_dcp_load_of_a_shardsafe_save(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    model = _model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    shardsafe.save({"model": model, "optim": opt, "step": 9, "cfg": {"lr": 0.5, "tags": ("a", 1)},
                    "hist": [1.5, 2.5], "blob": b"\x00\x01"}, path)
    model2 = _model(1)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    model2(torch.randn(2, 4)).sum().backward()
    opt2.step()  # a momentum buffer to load into
    state = {"model": model2.state_dict(), "optim": opt2.state_dict(), "step": 0,
             "cfg": {"lr": 0.0, "tags": ()}, "hist": [], "blob": b""}
    dcp.load(state, storage_reader=Reader(path))
    assert state["step"] == 9 and state["cfg"] == {"lr": 0.5, "tags": ("a", 1)}
    assert state["hist"] == [1.5, 2.5] and state["blob"] == b"\x00\x01"
    assert all(torch.equal(state["model"][k], v) for k, v in model.state_dict().items())
    want = opt.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(state["optim"]["state"][0]["momentum_buffer"], want)
    assert state["optim"]["param_groups"][0]["lr"] == 0.5


def test_dcp_load_of_a_manager_step_with_a_cast(tmp_path) -> None:  # noqa: ANN001
    w = torch.randn(64, 32)
    with shardsafe.CheckpointManager(tmp_path / "run", async_save=False) as mgr:
        mgr.save(5, {"w": w, "step": 5})
    target = {"w": torch.zeros(64, 32, dtype=torch.bfloat16), "step": 0}
    dcp.load(target, storage_reader=Reader(tmp_path / "run" / "step_00000005"))
    assert target["step"] == 5 and torch.equal(target["w"], w.to(torch.bfloat16))  # DCP casts too


def test_damage_and_absence_raise_through_dcp(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    shardsafe.save({"w": torch.randn(1000)}, path)
    data_file = os.path.join(path, "data-r00000-000.safetensors")
    flip_byte(data_file, -3)  # a byte of the tensor's data
    with pytest.raises(CheckpointException) as info:
        dcp.load({"w": torch.zeros(1000)}, storage_reader=Reader(path))
    (exc, _), = info.value.failures.values()
    assert isinstance(exc, shardsafe.CorruptCheckpointError) and "data-r00000-000.safetensors" in str(exc)
    with pytest.raises(CheckpointException, match="absent' does not exist"):
        dcp.load({"w": torch.zeros(1000)}, storage_reader=Reader(tmp_path / "absent"))


def test_a_value_dcp_cannot_take_is_refused_by_name(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    shardsafe.save({"pair": (torch.ones(2), 3)}, path)  # DCP takes a tuple as one serialised value
    with pytest.raises(CheckpointException, match="'pair' is a tuple holding tensors"):
        dcp.load({"pair": (torch.zeros(2), 0)}, storage_reader=Reader(path))
