"""The structure tree: plain-value nodes round-trip with their types; malformed nodes are refused."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from shardsafe.format.tree import MAX_DEPTH, TreeError, build, decode_plain, encode_plain, render_path, walk

PLAIN = [
    (None, {"t": "none"}),
    (True, {"t": "bool", "v": True}),
    (False, {"t": "bool", "v": False}),
    (0, {"t": "int", "v": 0}),
    (-(2**70), {"t": "int", "v": -(2**70)}),
    (1.5, {"t": "float", "v": 1.5}),
    (-0.0, {"t": "float", "v": -0.0}),
    (float("inf"), {"t": "float", "v": "inf"}),
    (float("-inf"), {"t": "float", "v": "-inf"}),
    ("", {"t": "str", "v": ""}),
    ("nan", {"t": "str", "v": "nan"}),
    (b"\x00\xff", {"t": "bytes", "v": "AP8="}),
    (np.float32(1.0), {"t": "npscalar", "dtype": "float32", "v": "AACAPw=="}),
    (np.bool_(True), {"t": "npscalar", "dtype": "bool", "v": "AQ=="}),
    (np.int64(-1), {"t": "npscalar", "dtype": "int64", "v": "//////////8="}),
]


@pytest.mark.parametrize(("value", "node"), PLAIN, ids=[repr(v) for v, _ in PLAIN])
def test_plain_golden_nodes(value: Any, node: dict) -> None:
    assert encode_plain(value, ()) == node
    back = decode_plain(node)
    assert type(back) is type(value)
    assert back == value
    if isinstance(value, float):
        assert math.copysign(1, back) == math.copysign(1, value)


def test_nan_round_trips() -> None:
    node = encode_plain(float("nan"), ())
    assert node == {"t": "float", "v": "nan"}
    assert math.isnan(decode_plain(node))


@pytest.mark.parametrize("value", [object(), [1], (1,), {"a": 1}, 1j, np.arange(3)])
def test_non_plain_values_are_not_encoded(value: Any) -> None:
    assert encode_plain(value, ()) is None


@pytest.mark.parametrize("value", [np.str_("x"), np.bytes_(b"x"), np.datetime64("2020-01-01"),
                                   np.void(b"ab"), np.longdouble(1)],
                         ids=["str_", "bytes_", "datetime64", "void", "longdouble"])
def test_unsupported_numpy_scalars_name_the_key_path(value: Any) -> None:
    with pytest.raises(TypeError, match="a.b"):
        encode_plain(value, ("a", "b"))


@pytest.mark.parametrize("node", [
    {"t": "bool", "v": 1},
    {"t": "int", "v": True},
    {"t": "int", "v": 1.0},
    {"t": "float", "v": True},
    {"t": "float", "v": "NaN"},
    {"t": "float", "v": None},
    {"t": "str", "v": 3},
    {"t": "bytes", "v": "###"},
    {"t": "bytes", "v": 5},
    {"t": "npscalar", "dtype": "nope", "v": "AA=="},
    {"t": "npscalar", "dtype": "float32", "v": "AA=="},
    {"t": "npscalar", "dtype": "float8_e4m3fn", "v": "AA=="},
    {"t": "npscalar", "dtype": ["x"], "v": "AA=="},
    {"t": "object", "v": "x"},
    {},
])
def test_malformed_plain_nodes(node: dict) -> None:
    with pytest.raises(TreeError):
        decode_plain(node)


def _nest(depth: int) -> dict:
    node: dict = {"t": "none"}
    for _ in range(depth):
        node = {"t": "list", "v": [node]}
    return node


def test_depth_limit() -> None:
    assert len(list(walk(_nest(MAX_DEPTH)))) == 1
    with pytest.raises(TreeError, match="deeper"):
        list(walk(_nest(MAX_DEPTH + 1)))


@pytest.mark.parametrize("node", [
    {"t": "dict", "k": ["a"], "v": []},
    {"t": "dict", "k": "a", "v": [{"t": "none"}]},
    {"t": "dict", "k": [1.0], "v": [{"t": "none"}]},
    {"t": "dict", "k": [None], "v": [{"t": "none"}]},
    {"t": "dict", "k": [1, 1], "v": [{"t": "none"}, {"t": "none"}]},
    {"t": "list", "v": {"t": "none"}},
    {"t": "tuple"},
    {"t": "tensor", "id": "0"},
    {"t": "tensor"},
    {"t": "list", "v": [[]]},
])
def test_malformed_containers(node: dict) -> None:
    with pytest.raises(TreeError):
        list(walk(node))


def test_walk_paths_and_build() -> None:
    node = {"t": "dict", "k": ["a", 7], "v": [
        {"t": "tuple", "v": [{"t": "int", "v": 1}, {"t": "tensor", "id": 0}]},
        {"t": "list", "v": [{"t": "dict", "k": [], "v": []}]},
    ]}
    assert [p for p, _ in walk(node)] == [("a", 0), ("a", 1)]  # an empty dict has no leaves
    out = build(node, lambda path, n: ("T", path, n["id"]))
    assert out == {"a": (1, ("T", ("a", 1), 0)), 7: [{}]}
    assert type(out["a"]) is tuple and type(out[7]) is list


@pytest.mark.parametrize(("path", "text"), [((), "<root>"), (("a",), "a"), (("a", 0, "b"), "a.0.b")])
def test_render_path(path: tuple, text: str) -> None:
    assert render_path(path) == text
