"""Partial chunks say in their safetensors header which part of which tensor they hold."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardsafe.format.datafile import parse_header
from shardsafe.plan.flatten import TensorItem
from shardsafe.plan.layout import PARTS_KEY, part_name, plan_file


def _item(i: int, path: tuple, local: np.ndarray, shape: tuple, offsets: tuple) -> TensorItem:
    return TensorItem(id=i, path=path, value=local, kind="numpy", dtype=str(local.dtype), shape=shape,
                      offsets=offsets, replicated=local.shape == shape)


@pytest.mark.parametrize(("offsets", "shape", "name"), [
    ((0, 0), (512, 1024), "model.w/part[0:512,0:1024]"),
    ((512,), (3,), "model.w/part[512:515]"),
    ((0, 7, 0), (1, 0, 2), "model.w/part[0:1,7:7,0:2]"),
])
def test_part_name_scheme(offsets: tuple, shape: tuple, name: str) -> None:
    assert part_name("model.w", offsets, shape) == name


def _write(tmp_path, items: list[TensorItem]) -> str:
    plan = plan_file("f.safetensors", items)
    data = bytearray(plan.layout.size)
    data[: plan.layout.data_start] = plan.layout.header
    for it, off in zip(plan.items, plan.layout.offsets):
        raw = np.ascontiguousarray(it.value).tobytes()
        data[off : off + len(raw)] = raw
    path = str(tmp_path / "f.safetensors")
    with open(path, "wb") as f:
        f.write(bytes(data))
    return path


def test_a_shard_at_offset_zero_is_not_taken_for_the_tensor(tmp_path) -> None:
    safetensors = pytest.importorskip("safetensors")
    w = np.arange(24, dtype=np.float32).reshape(4, 6)
    items = [_item(0, ("model", "w"), w[:2], (4, 6), (0, 0)),  # first half: offsets all zero
             _item(1, ("model", "b"), np.ones(6, np.float32), (6,), (0,)),  # whole (replicated)
             _item(2, ("model", "v"), w[1:3, 2:4], (4, 6), (1, 2))]
    path = _write(tmp_path, items)
    with safetensors.safe_open(path, framework="numpy") as f:
        assert sorted(f.keys()) == ["model.b", "model.v/part[1:3,2:4]", "model.w/part[0:2,0:6]"]
        assert np.array_equal(f.get_tensor("model.w/part[0:2,0:6]"), w[:2])
        assert np.array_equal(f.get_tensor("model.v/part[1:3,2:4]"), w[1:3, 2:4])
        parts = json.loads(f.metadata()[PARTS_KEY])
    assert parts == {
        "model.w/part[0:2,0:6]": {"tensor": "model.w", "offsets": [0, 0], "shape": [2, 6], "global_shape": [4, 6]},
        "model.v/part[1:3,2:4]": {"tensor": "model.v", "offsets": [1, 2], "shape": [2, 2], "global_shape": [4, 6]},
    }


def test_whole_tensors_add_no_metadata() -> None:
    plan = plan_file("f", [_item(0, ("w",), np.zeros(3, np.float32), (3,), (0,))])
    _, entries = parse_header(plan.layout.header)
    assert entries["__metadata__"] == {"format": "pt", "writer": "shardsafe"} and "w" in entries
