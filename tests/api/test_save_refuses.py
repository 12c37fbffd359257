"""save() refuses values it cannot store safely: TypeError naming the key path, nothing written."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch

import shardsafe

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Stateful:
    def __init__(self, payload: Any) -> None:
        self.payload = payload

    def state_dict(self) -> dict[str, Any]:
        return {"ok": torch.ones(1), "payload": self.payload}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        pass


def _cycle() -> dict:
    d: dict = {"t": torch.ones(2)}
    d["me"] = d
    return d


CASES = [
    ("object", lambda: {"w": torch.ones(2), "o": {"x": object()}}, "o.x"),
    ("tensor in a set", lambda: {"s": {1, torch.ones(1)}}, "s"),
    ("lambda", lambda: {"cfg": {"fn": lambda x: x}}, "cfg.fn"),
    ("sparse", lambda: {"m": {"w": torch.eye(2).to_sparse()}}, "m.w"),
    ("object key", lambda: {"d": {object(): 1}}, "d"),
    ("cycle", lambda: {"c": _cycle()}, "c.me"),
    ("inside stateful", lambda: {"s": Stateful(object())}, "s.payload"),
    ("object array", lambda: {"a": np.array([None])}, "a"),
    ("after big tensors", lambda: {"big": torch.ones(1 << 20), "z": [1, 2, {"q": {object()}}]}, "z.2.q"),
]


@pytest.mark.parametrize(("make", "path"), [(m, p) for _, m, p in CASES], ids=[n for n, _, _ in CASES])
def test_type_error_names_key_path_and_nothing_is_left(tmp_path, make, path: str) -> None:
    target = str(tmp_path / "ckpt")
    with pytest.raises(TypeError) as info:
        shardsafe.save(make(), target)
    assert path in str(info.value)
    assert os.listdir(tmp_path) == []  # no checkpoint, no hidden .ckpt.shardsafe-tmp-* directory


def test_failed_overwrite_keeps_the_old_checkpoint(tmp_path) -> None:
    target = str(tmp_path / "ckpt")
    shardsafe.save({"w": torch.ones(3)}, target)
    before = sorted(os.listdir(target))
    with pytest.raises(TypeError, match="'w2'"):
        shardsafe.save({"w": torch.zeros(3), "w2": {1, object()}}, target, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"] and sorted(os.listdir(target)) == before
    assert torch.equal(shardsafe.load(target)["w"], torch.ones(3))


def test_bad_metadata_is_refused_before_writing(tmp_path) -> None:
    target = str(tmp_path / "ckpt")
    with pytest.raises((TypeError, ValueError)):
        shardsafe.save({"w": torch.ones(1)}, target, metadata={"x": object()})
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("state", [[torch.ones(1)], torch.ones(1), "x"])
def test_state_must_be_a_mapping(tmp_path, state: Any) -> None:
    with pytest.raises(TypeError, match="mapping"):
        shardsafe.save(state, str(tmp_path / "ckpt"))  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []
