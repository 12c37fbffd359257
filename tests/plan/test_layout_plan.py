"""plan_file: slot names and offsets of a data file."""

from __future__ import annotations

import numpy as np

from shardsafe.format.datafile import parse_header
from shardsafe.plan.flatten import TensorItem, flatten
from shardsafe.plan.layout import block_file_name, data_file_name, is_data_file_name, plan_file


def test_data_file_name() -> None:
    assert data_file_name(0) == "data-r00000-000.safetensors"
    assert data_file_name(12345, 7) == "data-r12345-007.safetensors"


def test_data_and_block_file_names_are_recognised() -> None:
    assert is_data_file_name(data_file_name(3, 1)) and is_data_file_name(block_file_name(3, 1))
    for other in ("index.json", "data-r00000-000.safetensors.tmp", "xdata-r00000-000.blocks",
                  "data-r00000-000.pt", "data-rx-000.safetensors"):
        assert not is_data_file_name(other), other


def test_colliding_and_reserved_names_get_suffixes() -> None:
    _, items = flatten({"a.b": np.zeros(1), "a": {"b": np.zeros(2)}, "__metadata__": np.zeros(3),
                        "x": {1: np.zeros(1)}, "x.1": np.zeros(1)})
    plan = plan_file("f", items)
    _, entries = parse_header(plan.layout.header)
    names = [k for k in entries if k != "__metadata__"]
    assert sorted(names) == sorted(["a.b", "a.b#1", "__metadata__#1", "x.1", "x.1#1"])
    assert entries["__metadata__"] == {"format": "pt", "writer": "shardsafe"}


def test_sharded_items_name_their_offsets() -> None:
    it = TensorItem(id=0, path=("w",), value=np.zeros((2, 3), np.float32), kind="numpy",
                    dtype="float32", shape=(4, 3), offsets=(2, 0), replicated=False)
    plan = plan_file("f", [it])
    _, entries = parse_header(plan.layout.header)
    assert "w/part[2:4,0:3]" in entries
    assert entries["w/part[2:4,0:3]"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
    assert plan.layout.offsets == (4096,) and plan.layout.size == 4096 + 24


def test_offsets_match_the_header_and_the_data_follows_it() -> None:
    _, items = flatten({"i8": np.zeros(3, np.int8), "f64": np.zeros(2), "empty": np.zeros((0, 5)),
                        "scalar": np.array(1, np.float32)})
    plan = plan_file("f", items)
    size, entries = parse_header(plan.layout.header)
    assert [it.nbytes for it in plan.items] == [3, 16, 0, 4]
    assert [size + entries[it.path[0]]["data_offsets"][0] for it in plan.items] == list(plan.layout.offsets)
    assert plan.layout.size == 4096 + 23
