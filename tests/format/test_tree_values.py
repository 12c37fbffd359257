"""The richer value nodes (format.values): golden nodes, round-trips with exact types, keys, forgeries."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib
import subprocess
import sys
from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
import torch

from shardsafe.errors import CorruptCheckpointError
from shardsafe.format.checksum import crc32c
from shardsafe.format.index.versions import decode_index
from shardsafe.format.tree import TreeError, build, decode_key, decode_plain, encode_key, encode_plain, walk
from shardsafe.plan.flatten import flatten

from forge_index import seal

UTC = dt.timezone.utc
PLUS_0530 = dt.timezone(dt.timedelta(hours=5, minutes=30))
NAMED = dt.timezone(dt.timedelta(hours=-3), "BRT")
ODD = dt.timezone(dt.timedelta(seconds=3601, microseconds=5))

# (value, golden node): every encoding of FORMAT.md section 6.1
VALUES = [
    (torch.float32, {"t": "dtype", "v": "float32"}),
    (torch.bfloat16, {"t": "dtype", "v": "bfloat16"}),
    (torch.qint8, {"t": "dtype", "v": "qint8"}),  # a dtype value need not be a saveable tensor dtype
    (torch.device("cpu"), {"t": "device", "v": "cpu"}),
    (torch.device("cuda", 3), {"t": "device", "v": "cuda:3"}),
    ({3, 1, 2}, {"t": "set", "v": [{"t": "int", "v": 1}, {"t": "int", "v": 2}, {"t": "int", "v": 3}]}),
    (set(), {"t": "set", "v": []}),
    (frozenset({"b", ("a", 1)}), {"t": "frozenset", "v": [
        {"t": "str", "v": "b"}, {"t": "tuple", "v": [{"t": "str", "v": "a"}, {"t": "int", "v": 1}]}]}),
    (frozenset({frozenset({None})}), {"t": "frozenset", "v": [{"t": "frozenset", "v": [{"t": "none"}]}]}),
    (pathlib.PurePosixPath("/data/run 1"), {"t": "path", "cls": "PurePosixPath", "v": "/data/run 1"}),
    (pathlib.PureWindowsPath("C:/x/y"), {"t": "path", "cls": "PureWindowsPath", "v": "C:\\x\\y"}),
    (pathlib.PosixPath("rel/ckpt"), {"t": "path", "cls": "PosixPath", "v": "rel/ckpt"}),
    (pathlib.Path("."), {"t": "path", "cls": "PosixPath", "v": "."}),
    (dt.date(2024, 2, 29), {"t": "date", "v": "2024-02-29"}),
    (dt.datetime(2024, 1, 2, 3, 4, 5), {"t": "datetime", "v": "2024-01-02T03:04:05"}),
    (dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
     {"t": "datetime", "v": "2024-01-02T03:04:05.000006", "tz": {"offset_us": 0}}),
    (dt.datetime(1, 1, 1, tzinfo=PLUS_0530),
     {"t": "datetime", "v": "0001-01-01T00:00:00", "tz": {"offset_us": 19_800_000_000}}),
    (dt.datetime(2024, 11, 3, 1, 30, fold=1), {"t": "datetime", "v": "2024-11-03T01:30:00", "fold": 1}),
    (dt.datetime(2024, 1, 1, tzinfo=NAMED),
     {"t": "datetime", "v": "2024-01-01T00:00:00", "tz": {"offset_us": -10_800_000_000, "name": "BRT"}}),
    (dt.time(23, 59, 59, 999999), {"t": "time", "v": "23:59:59.999999"}),
    (dt.time(1, tzinfo=ODD), {"t": "time", "v": "01:00:00", "tz": {"offset_us": 3_601_000_005}}),
    (dt.timedelta(days=-1, seconds=5, microseconds=7), {"t": "timedelta", "v": [-1, 5, 7]}),
    (dt.timedelta.max, {"t": "timedelta", "v": [999999999, 86399, 999999]}),
]


def _same(a: Any, b: Any) -> None:
    assert type(a) is type(b), (a, b)
    assert a == b
    if isinstance(a, (dt.datetime, dt.time)):
        assert a.fold == b.fold and type(a.tzinfo) is type(b.tzinfo)
        if a.tzinfo is not None:
            assert a.tzinfo.tzname(None) == b.tzinfo.tzname(None)


def _id(v: object) -> str:
    """A test id that does not depend on the hash seed (a set's order does; the ids must
    be equal in every worker process of a parallel run)."""
    if isinstance(v, (set, frozenset)):
        return f"{type(v).__name__}({sorted(_id(x) for x in v)})"
    return repr(v)


@pytest.mark.parametrize(("value", "node"), VALUES, ids=[_id(v) for v, _ in VALUES])
def test_golden_nodes_round_trip_with_exact_types(value: Any, node: dict) -> None:
    assert encode_plain(value, ()) == node
    _same(decode_plain(json.loads(json.dumps(node))), value)


HASHABLE = [v for v, _ in VALUES if not isinstance(v, set)] + [
    None, True, False, 1.5, -0.0, float("inf"), (1, ("x", None)), (), b"\x00", np.int64(3)]


@pytest.mark.parametrize("key", HASHABLE, ids=[_id(k) for k in HASHABLE])
def test_every_hashable_value_is_a_dict_key(key: Any) -> None:
    state = {"d": {key: "v", "plain": 1}}
    tree, _ = flatten(state)
    raw = json.loads(json.dumps(tree))
    list(walk(raw))  # validates
    got = build(raw, lambda p, n: None)
    (k, v), (k2, _) = got["d"].items()
    _same(k, key)
    assert v == "v" and k2 == "plain"


def test_strings_and_ints_stay_bare_keys() -> None:
    assert encode_key("a", ()) == "a" and encode_key(7, ()) == 7
    assert encode_key(True, ()) == {"t": "bool", "v": True}
    with pytest.raises(TreeError, match="bare"):
        decode_key({"t": "int", "v": 7})


def test_containers_nested_in_each_other_keep_their_types() -> None:
    state = {"ns": argparse.Namespace(lr=0.1, sched=OrderedDict([("z", {1, 2}), ("a", None)]),
                                      out=pathlib.PurePosixPath("/o"), dtype=torch.float16),
             "od": OrderedDict([(("layer", 0), dt.timedelta(1)), (None, [frozenset()])]),
             "times": [dt.date(2020, 1, 1), (torch.device("cpu"), {2.5: dt.time(1)})]}
    tree, _ = flatten(state)
    raw = json.loads(json.dumps(tree))
    list(walk(raw))
    got = build(raw, lambda p, n: None)
    assert type(got["ns"]) is argparse.Namespace and vars(got["ns"]).keys() == vars(state["ns"]).keys()
    assert type(got["ns"].sched) is OrderedDict and list(got["ns"].sched) == ["z", "a"]
    assert got["ns"].sched["z"] == {1, 2} and got["ns"].dtype is torch.float16
    assert type(got["od"]) is OrderedDict and list(got["od"]) == [("layer", 0), None]
    assert got == {**state, "ns": got["ns"]} and vars(got["ns"]) == vars(state["ns"])


def test_set_members_are_sorted_so_the_bytes_do_not_depend_on_hashing() -> None:
    code = ("import json; from shardsafe.format.tree import encode_plain;"
            "print(json.dumps(encode_plain({'a', 'b', 'c', 'd', ('e', 1), b'f'}, ())))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(seed), "PATH": ""} | _pythonpath()).stdout
            for seed in range(2)}
    assert len(outs) == 1


def _pythonpath() -> dict[str, str]:
    import os

    return {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}


def test_torch_values_are_validated_without_importing_torch() -> None:
    # torch made unimportable: validation passes, only building the value needs torch
    code = ("import sys; sys.modules['torch'] = None\n"
            "from shardsafe.format.tree import build, walk\n"
            "tree = {'t': 'dict', 'k': [{'t': 'dtype', 'v': 'float32'}], 'v': ["
            "{'t': 'set', 'v': [{'t': 'device', 'v': 'cuda:0'}, {'t': 'dtype', 'v': 'int8'}]}]}\n"
            "list(walk(tree))\n"
            "try:\n    build(tree, None)\nexcept ImportError:\n    print('needs torch')\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={"PATH": ""} | _pythonpath())
    assert out.stdout.strip() == "needs torch", out.stderr


def _index_with(node: Any, key: Any = "x") -> bytes:
    raw = {"format_version": 1, "library": "t", "created": 0.0, "world_size": 1, "checksum": "crc32c",
           "block_size": 16777216, "metadata": {}, "files": [], "tensors": [],
           "tree": {"t": "dict", "k": [key], "v": [node]}}
    # ASCII escapes, so that a lone surrogate can be written as the JSON text \\ud800
    prefix = json.dumps(raw, separators=(",", ":"), ensure_ascii=True)[:-1].encode("ascii")
    return prefix + b',"index_checksum":"crc32c:%08x"}\n' % crc32c(prefix)


FORGED_VALUES = [
    {"t": "dtype", "v": "Float32"},
    {"t": "dtype", "v": "float32; import os"},
    {"t": "dtype", "v": 5},
    {"t": "device", "v": "cuda:-1"},
    {"t": "device", "v": "cuda:0:1"},
    {"t": "device", "v": ""},
    {"t": "set", "v": [{"t": "int", "v": 1}, {"t": "int", "v": 1}]},
    {"t": "set", "v": [{"t": "int", "v": 1}, {"t": "bool", "v": True}]},  # equal in Python
    {"t": "set", "v": [{"t": "list", "v": []}]},
    {"t": "set", "v": [{"t": "tensor", "id": 0}]},
    {"t": "set", "v": [{"t": "set", "v": []}]},
    {"t": "frozenset", "v": {"t": "int", "v": 1}},
    {"t": "path", "cls": "Path", "v": "x"},
    {"t": "path", "cls": "os.system", "v": "x"},
    {"t": "path", "cls": "PurePosixPath", "v": "a//b"},
    {"t": "path", "cls": "PurePosixPath", "v": 1},
    {"t": "date", "v": "20240102"},
    {"t": "date", "v": "2024-02-30"},
    {"t": "datetime", "v": "2024-01-02T03:04:05+01:00"},  # offset belongs in tz
    {"t": "datetime", "v": "2024-01-02 03:04:05"},
    {"t": "datetime", "v": "2024-01-02T03:04:05", "tz": {"offset_us": 86_400_000_000}},
    {"t": "datetime", "v": "2024-01-02T03:04:05", "tz": {"offset_us": 0, "zone": "x"}},
    {"t": "datetime", "v": "2024-01-02T03:04:05", "tz": {"offset_us": True}},
    {"t": "datetime", "v": "2024-01-02T03:04:05", "fold": 2},
    {"t": "datetime", "v": "2024-01-02T03:04:05", "fold": True},
    {"t": "time", "v": "25:00:00"},
    {"t": "timedelta", "v": [0, 86400, 0]},
    {"t": "timedelta", "v": [1_000_000_000, 0, 0]},
    {"t": "timedelta", "v": [0, 0]},
    {"t": "namespace", "k": [1], "v": [{"t": "none"}]},
    {"t": "dict", "k": [], "v": [], "ordered": 1},
    {"t": "dict", "k": [{"t": "list", "v": []}], "v": [{"t": "none"}]},
    {"t": "dict", "k": [{"t": "str", "v": "a"}], "v": [{"t": "none"}]},
    {"t": "dict", "k": [True], "v": [{"t": "none"}]},
    {"t": "dict", "k": [1, {"t": "float", "v": 1.0}], "v": [{"t": "none"}, {"t": "none"}]},
    {"t": "dict", "k": [{"t": "tuple", "v": [{"t": "dict", "k": [], "v": []}]}], "v": [{"t": "none"}]},
    {"t": "str", "v": "a\ud800"},
    {"t": "dict", "k": ["\udc00"], "v": [{"t": "none"}]},
    {"t": "path", "cls": "PurePosixPath", "v": "\udcff"},
]


@pytest.mark.parametrize("node", FORGED_VALUES, ids=[json.dumps(n, ensure_ascii=True)[:60] for n in FORGED_VALUES])
def test_forged_value_nodes_are_corrupt_checkpoints(node: dict) -> None:
    with pytest.raises(CorruptCheckpointError):
        decode_index(_index_with(node))


def test_forged_keys_of_the_tensor_table_are_refused() -> None:
    raw = json.loads(_index_with({"t": "none"}).rsplit(b',"index_checksum"', 1)[0] + b"}")
    raw["tensors"] = [{"key": [{"t": "tuple", "v": [{"t": "list", "v": []}]}], "kind": "torch",
                       "dtype": "float32", "shape": [0], "chunks": []}]
    with pytest.raises(CorruptCheckpointError, match="tensor key"):
        decode_index(seal(raw))


@pytest.mark.parametrize(("value", "node"), VALUES, ids=[_id(v) for v, _ in VALUES])
def test_an_index_holding_each_value_decodes_to_that_value(value: Any, node: dict) -> None:
    index = decode_index(_index_with(node))  # the generated nodes are accepted by the decoder
    state = build(index.tree, lambda path, n: pytest.fail(f"no tensor in this tree, found one at {path}"))
    assert list(state) == ["x"]
    _same(state["x"], value)
