"""A single Stateful object is a state: save(model, path), load(path, model), async_save,
Checkpointer — saved as its state dict (the checkpoint's root holds its keys) and loaded
in place through ``load_state_dict``, as it would be inside a mapping."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from helpers import assert_same

import shardsafe
from shardsafe.model_state import ModelOptimizerState


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))


def _stepped(model: torch.nn.Module) -> torch.optim.Optimizer:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return opt


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert_same(dict(a), dict(b))  # a state dict's mapping type aside


def test_a_module_saves_as_its_state_dict_and_loads_in_place(tmp_path) -> None:
    src, dst = _net(0), _net(1)
    path = os.path.join(tmp_path, "m")
    shardsafe.save(src, path)
    got = shardsafe.load(path)
    assert isinstance(got, dict)
    _same(got, src.state_dict())  # the root is the state dict
    weight = dst[0].weight
    result = shardsafe.load(path, dst)
    assert isinstance(result, shardsafe.LoadResult) and result == shardsafe.LoadResult()
    assert dst[0].weight is weight  # in place: the same parameter object
    _same(dst.state_dict(), src.state_dict())  # buffers (BatchNorm) included


def test_an_optimizer_root_restores_into_a_fresh_optimizer(tmp_path) -> None:
    model = _net(0)
    opt = _stepped(model)
    path = os.path.join(tmp_path, "o")
    shardsafe.async_save(opt, path).result()
    fresh = torch.optim.AdamW(_net(0).parameters(), lr=1.0)
    shardsafe.load(path, fresh)  # never stepped: the state the checkpoint has is created
    want, got = opt.state_dict(), fresh.state_dict()
    assert got["param_groups"][0]["lr"] == 1e-2
    for i, st in want["state"].items():
        assert all(torch.equal(st[k], got["state"][i][k]) for k in st)


def test_model_optimizer_state_and_checkpointer(tmp_path) -> None:
    model = _net(0)
    opt = _stepped(model)
    path = os.path.join(tmp_path, "mo")
    with shardsafe.Checkpointer() as ckpt:
        ckpt.save(ModelOptimizerState(model, opt), path)
    model2 = _net(1)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    shardsafe.load(path, ModelOptimizerState(model2, opt2))
    _same(model2.state_dict(), model.state_dict())
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_strict_mismatch_changes_nothing(tmp_path) -> None:
    path = os.path.join(tmp_path, "m")
    shardsafe.save(_net(0), path)
    other = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(shardsafe.StateMismatchError, match="2.weight"):
        shardsafe.load(path, other)
    _same(other.state_dict(), before)
    result = shardsafe.load(path, other, strict=False)
    assert result.mismatched and not result.missing and not result.unexpected
    assert torch.equal(other[0].weight, _net(0)[0].weight)  # the matching part was loaded


class _Odd:
    def state_dict(self) -> list[int]:
        return [1, 2]

    def load_state_dict(self, sd: Any) -> None:  # pragma: no cover - never reached
        raise AssertionError


def test_what_is_neither_a_mapping_nor_a_stateful_is_refused(tmp_path) -> None:
    path = os.path.join(tmp_path, "x")
    with pytest.raises(TypeError, match="mapping .dict. or a Stateful object"):
        shardsafe.save([torch.ones(1)], path)
    with pytest.raises(TypeError, match=r"_Odd.state_dict\(\) at key path '<root>' returned list, not a mapping"):
        shardsafe.save(_Odd(), path)
    assert not os.path.exists(path)
    shardsafe.save({"w": torch.ones(1)}, path)
    with pytest.raises(TypeError, match="mutable mapping .dict. or a Stateful object"):
        shardsafe.load(path, [torch.ones(1)])  # type: ignore[arg-type]
