"""flatten: state -> (tree, tensor items); unsupported values raise TypeError naming the key path."""

from __future__ import annotations

import datetime as dt
import pathlib
from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
import torch

from shardsafe.format.tree import MAX_DEPTH, walk
from shardsafe.plan.flatten import flatten, is_stateful


class Counter:
    """A minimal Stateful."""

    def __init__(self, n: int = 0) -> None:
        self.n = n

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n, "t": torch.full((2,), float(self.n))}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.n = sd["n"]


def test_items_in_tree_order_with_ids() -> None:
    w = torch.ones(2, 3)
    a = np.zeros(4, np.int8)
    tree, items = flatten({"m": {"w": w, "k": 1}, "a": a, "l": [torch.zeros(())], "c": Counter(3)})
    assert [it.path for it in items] == [("m", "w"), ("a",), ("l", 0), ("c", "t")]
    assert [it.id for it in items] == [0, 1, 2, 3]
    assert items[0].value is w and items[1].value is a
    assert [(it.kind, it.dtype, it.shape) for it in items] == [
        ("torch", "float32", (2, 3)), ("numpy", "int8", (4,)), ("torch", "float32", ()),
        ("torch", "float32", (2,))]
    assert all(it.offsets == (0,) * len(it.shape) for it in items)
    assert [it.nbytes for it in items] == [24, 4, 4, 8]
    ids = [n["id"] for _, n in walk(tree) if n["t"] == "tensor"]
    assert ids == [0, 1, 2, 3]
    assert tree["v"][3]["cls"].endswith("Counter")


def test_key_types_and_container_kinds() -> None:
    tree, _ = flatten({"d": OrderedDict([(2, "x"), ("2", "y"), (-1, None)]), "t": (1,), "l": [], "e": {}})
    d, t, l, e = tree["v"]
    assert d == {"t": "dict", "k": [2, "2", -1], "v": [{"t": "str", "v": "x"}, {"t": "str", "v": "y"},
                                                         {"t": "none"}], "ordered": True}
    assert t["t"] == "tuple" and l == {"t": "list", "v": []} and e == {"t": "dict", "k": [], "v": []}


def _cycle_dict() -> dict:
    d: dict = {}
    d["self"] = d
    return {"a": d}


def _cycle_list() -> dict:
    x: list = [1]
    x.append(x)
    return {"a": {"b": x}}


class SelfStateful:
    def state_dict(self) -> dict:
        return {"me": self}

    def load_state_dict(self, sd: dict) -> None:
        pass


class BadStateful:
    def state_dict(self) -> list:
        return [1]

    def load_state_dict(self, sd: Any) -> None:
        pass


def _zoned() -> dt.datetime:
    class Zone(dt.tzinfo):  # not a fixed offset: its rules cannot be stored as data
        def utcoffset(self, when: Any) -> dt.timedelta:
            return dt.timedelta(hours=1)

    return dt.datetime(2020, 1, 1, tzinfo=Zone())


class _PathSub(pathlib.PurePosixPath):
    pass


class _DateSub(dt.datetime):
    pass


def _deep(n: int) -> dict:
    x: Any = 1
    for _ in range(n):
        x = {"d": x}
    return {"root": x}


UNSUPPORTED = [
    ("object", {"a": {"b": object()}}, "a.b"),
    ("tensor in a set", {"a": [1, {torch.ones(1)}]}, "a.1"),
    ("object in a frozenset", {"a": frozenset({object()})}, "a"),
    ("tz-aware time of a zone", {"a": {"t": _zoned()}}, "a.t"),
    ("path subclass", {"p": _PathSub("x")}, "p"),
    ("datetime subclass", {"p": _DateSub(2020, 1, 1)}, "p"),
    ("lambda", {"f": lambda: 0}, "f"),
    ("complex", {"c": 1j}, "c"),
    ("object key", {"d": {object(): 1}}, "d"),
    ("NaN key", {"d": {float("nan"): 1}}, "d"),
    ("tuple key holding an object", {"d": {(1, object()): 1}}, "d"),
    ("lone surrogate in a tuple key", {"d": {("\udc00",): 1}}, "d"),
    ("lone surrogate in a path", {"d": pathlib.PurePosixPath("a\udcff")}, "d"),
    ("sparse tensor", {"s": {"t": torch.eye(3).to_sparse()}}, "s.t"),
    ("sparse csr", {"s": torch.eye(3).to_sparse_csr()}, "s"),
    ("meta tensor", {"m": torch.empty(3, device="meta")}, "m"),
    ("quantized", {"q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)}, "q"),
    ("nested tensor", {"n": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])}, "n"),
    ("uint4 tensor", {"u": torch.zeros(4, dtype=torch.uint8).view(torch.uint4)
     if hasattr(torch, "uint4") else object()}, "u"),
    ("object array", {"o": np.array([1, "x"], dtype=object)}, "o"),
    ("string array", {"o": np.array(["x"])}, "o"),
    ("big-endian array", {"o": np.zeros(2, ">f4")}, "o"),
    ("datetime array", {"o": np.zeros(2, "M8[s]")}, "o"),
    ("structured array", {"o": np.zeros(2, [("a", "f4")])}, "o"),
    ("numpy str scalar", {"o": np.str_("x")}, "o"),
    ("masked array", {"o": {"m": np.ma.masked_array([1, 2], mask=[0, 1])}}, "o.m"),
    ("matrix", {"o": np.matrix([[1, 2]])}, "o"),
    ("lone surrogate", {"s": "a\ud800"}, "s"),
    ("lone surrogate key", {"s": {"\udc00": 1}}, "s"),
    ("huge int", {"i": 10**5000}, "i"),
    ("cycle dict", _cycle_dict(), "a.self"),
    ("cycle list", _cycle_list(), "a.b.1"),
    ("stateful containing itself", {"s": SelfStateful()}, "s.me"),
    ("state_dict not a mapping", {"s": BadStateful()}, "s"),
    ("memoryview", {"m": memoryview(b"x")}, "m"),
    ("module class", {"m": torch.nn.Linear}, "m"),
    ("too deep", _deep(MAX_DEPTH + 5), "root" + ".d" * (MAX_DEPTH - 1)),
]


@pytest.mark.parametrize(("state", "path"), [(s, p) for _, s, p in UNSUPPORTED],
                         ids=[n for n, _, _ in UNSUPPORTED])
def test_unsupported_values_name_their_key_path(state: dict, path: str) -> None:
    with pytest.raises(TypeError) as info:
        flatten(state)
    assert repr(path) in str(info.value) or f"'{path}" in str(info.value), str(info.value)


@pytest.mark.parametrize("state", [[1], (1,), torch.ones(2), None, "x"])
def test_state_must_be_a_mapping(state: Any) -> None:
    with pytest.raises(TypeError, match="mapping"):
        flatten(state)  # type: ignore[arg-type]


def test_memmap_is_a_plain_array(tmp_path) -> None:
    m = np.memmap(tmp_path / "m", dtype=np.float32, mode="w+", shape=(3,))
    _, items = flatten({"m": m})
    assert items[0].kind == "numpy" and items[0].shape == (3,)


def test_deepest_allowed_nesting_flattens() -> None:
    tree, _ = flatten(_deep(MAX_DEPTH - 1))
    assert len(list(walk(tree))) == 1


def test_shared_containers_are_not_cycles() -> None:
    shared = {"x": 1}
    tree, _ = flatten({"a": shared, "b": shared, "c": [shared, shared]})
    assert len(list(walk(tree))) == 4


@pytest.mark.parametrize(("obj", "want"), [
    (torch.nn.Linear(1, 1), True), (torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1), True),
    (Counter(), True), ({"state_dict": 1}, False), (torch.ones(1), False), (np.ones(1), False),
    ([], False), (Counter, False),
])
def test_is_stateful(obj: Any, want: bool) -> None:
    # a class has state_dict/load_state_dict as unbound functions; it is not an instance to save
    assert is_stateful(obj) is want
