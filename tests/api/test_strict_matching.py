"""strict=True names every offending key path and changes nothing; strict=False loads the rest."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_same

import shardsafe


class Recorder:
    def __init__(self, n: int = 0) -> None:
        self.n = n
        self.calls = 0

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n, "w": torch.full((2,), float(self.n))}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.calls += 1
        self.n = sd["n"]


def _saved(tmp_path) -> str:
    path = os.path.join(tmp_path, "ckpt")
    torch.manual_seed(0)
    shardsafe.save({
        "a": torch.ones(2, 3), "b": torch.arange(4), "c": {"d": 1, "e": torch.ones(2)},
        "f": [torch.ones(1), torch.ones(1)], "g": torch.nn.Linear(3, 2), "h": torch.ones(3),
        "i": {"j": 5}, "k": np.ones(3, np.float32), "r": Recorder(7), "same": torch.full((2,), 9.0),
    }, path)
    return path


def _target() -> dict[str, Any]:
    torch.manual_seed(1)
    return {
        "a": torch.zeros(3, 2),                   # shape differs
        "x": torch.zeros(1),                      # not in the checkpoint (b is missing here)
        "c": {"d": 0, "e": torch.zeros(2, dtype=torch.float64)},  # dtype differs
        "f": [torch.zeros(1), torch.zeros(1), torch.zeros(1)],     # length differs, holds tensors
        "g": torch.nn.Linear(3, 3),               # module with other shapes
        "h": {"not": "a tensor"},                 # container where the checkpoint has a tensor
        "i": torch.zeros(1),                      # tensor where the checkpoint has a dict
        "k": np.zeros(3, np.float64),             # numpy dtype differs
        "r": Recorder(0),                         # matches
        "same": torch.zeros(2),                   # matches
    }


EXPECTED = {
    "missing in checkpoint: x",
    "unexpected in checkpoint (absent from target): b",
    "mismatch: a: target float32[3, 2], checkpoint float32[2, 3]",
    "mismatch: c.e: target float64[2], checkpoint float32[2]"
    " (pass cast=True to convert floating-point values to the target's dtype)",
    "mismatch: f: target has 3 items, checkpoint 2",
    "mismatch: g.weight: target float32[3, 3], checkpoint float32[2, 3]",
    "mismatch: g.bias: target float32[3], checkpoint float32[2]",
    "mismatch: h: target is dict, checkpoint holds tensor",
    "mismatch: i: target is a tensor, checkpoint holds dict",
    "mismatch: k: target float64[3], checkpoint float32[3]"
    " (pass cast=True to convert floating-point values to the target's dtype)",
}


def _snapshot(state: dict) -> dict:
    out = {}
    for k, v in state.items():
        if isinstance(v, torch.nn.Module):
            out[k] = {n: p.clone() for n, p in v.state_dict().items()}
        elif isinstance(v, torch.Tensor):
            out[k] = v.clone()
        elif isinstance(v, np.ndarray):
            out[k] = v.copy()
        elif isinstance(v, Recorder):
            out[k] = (v.n, v.calls)
        elif isinstance(v, dict):
            out[k] = {kk: (vv.clone() if isinstance(vv, torch.Tensor) else vv) for kk, vv in v.items()}
        elif isinstance(v, list):
            out[k] = [t.clone() for t in v]
    return out


def test_strict_lists_every_problem_and_touches_nothing(tmp_path) -> None:
    path = _saved(tmp_path)
    target = _target()
    objects = {k: v for k, v in target.items()}
    before = _snapshot(target)
    with pytest.raises(shardsafe.StateMismatchError) as info:
        shardsafe.load(path, target)
    assert set(info.value.problems) == EXPECTED
    assert len(info.value.problems) == len(EXPECTED)
    for line in EXPECTED:
        assert line in str(info.value)
    assert target.keys() == objects.keys() and all(target[k] is objects[k] for k in target)
    assert_same(_snapshot(target), before)
    assert target["r"].calls == 0  # no load_state_dict ran, not even for matching Statefuls


def test_non_strict_loads_the_intersection(tmp_path, caplog) -> None:
    path = _saved(tmp_path)
    target = _target()
    before = _snapshot(target)
    with caplog.at_level(logging.WARNING, logger="shardsafe"):
        result = shardsafe.load(path, target, strict=False)
    assert isinstance(result, shardsafe.LoadResult)
    assert result.missing == ["x"]
    assert result.unexpected == ["b"]
    assert set(result.mismatched) == {"a", "c.e", "f", "g.weight", "g.bias", "h", "i", "k"}
    assert "skipped 10 key path(s)" in caplog.text and "c.e" in caplog.text
    # what matched is loaded
    assert torch.equal(target["same"], torch.full((2,), 9.0))
    assert target["r"].n == 7 and target["r"].calls == 1
    assert target["c"]["d"] == 1
    # what did not is left alone
    for k in ("a", "x", "f", "g", "h", "i", "k"):
        assert_same(_snapshot({k: target[k]})[k], before[k], k)
    assert_same(target["c"]["e"], before["c"]["e"])


def test_strict_success_returns_an_empty_result(tmp_path) -> None:
    path = os.path.join(tmp_path, "c")
    shardsafe.save({"a": torch.ones(2)}, path)
    assert shardsafe.load(path, {"a": torch.zeros(2)}) == shardsafe.LoadResult([], [], [])


def test_stateful_where_checkpoint_has_a_plain_value(tmp_path) -> None:
    path = os.path.join(tmp_path, "c")
    shardsafe.save({"r": 3}, path)
    with pytest.raises(shardsafe.StateMismatchError, match="r: target is a Stateful Recorder, checkpoint holds plain value"):
        shardsafe.load(path, {"r": Recorder()})


def test_module_rejects_extra_checkpoint_keys(tmp_path) -> None:
    path = os.path.join(tmp_path, "c")
    big = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    shardsafe.save({"m": big}, path)
    small = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(shardsafe.StateMismatchError) as info:
        shardsafe.load(path, {"m": small})
    assert sorted(info.value.problems) == ["unexpected in checkpoint (absent from target): m.1.bias",
                                           "unexpected in checkpoint (absent from target): m.1.weight"]


def test_many_problems_are_all_listed(tmp_path) -> None:
    path = os.path.join(tmp_path, "c")
    shardsafe.save({f"k{i}": torch.ones(1) for i in range(300)}, path)
    with pytest.raises(shardsafe.StateMismatchError) as info:
        shardsafe.load(path, {f"k{i}": torch.ones(2) for i in range(300)})
    assert len(info.value.problems) == 300
    assert "300 key path(s)" in str(info.value) and "and 100 more" in str(info.value)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_targets_of_unsupported_dtypes_are_mismatches(tmp_path) -> None:
    path = os.path.join(tmp_path, "c")
    shardsafe.save({"q": torch.ones(2), "s": np.zeros(2), "d": torch.ones(1)}, path)
    target = {"q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8),
              "s": np.array(["a", "b"]), "d": torch.ones(1)}
    with pytest.raises(shardsafe.StateMismatchError) as info:
        shardsafe.load(path, target)
    assert [p.split(":")[1].strip() for p in info.value.problems] == ["q", "s"]
    result = shardsafe.load(path, target, strict=False)
    assert result.mismatched == ["q", "s"]
