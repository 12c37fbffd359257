"""Fuzzing the index decoder: whatever the bytes, only CorruptCheckpointError comes out.

``decode_index`` reads untrusted bytes. Three kinds of input: arbitrary bytes (with and
without a correct trailer checksum), structural JSON mutations of real indexes re-sealed
with a correct checksum (so the validation, not the CRC, must reject them), and byte-level
damage (flips, truncations, insertions) with and without a re-sealed checksum. A decode
that succeeds must describe an index that encodes and decodes to itself.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import tempfile
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardsafe
from shardsafe.errors import CorruptCheckpointError
from shardsafe.format.checksum import crc32c
from shardsafe.format.index.objects import Index, TensorEntry
from shardsafe.format.index.rows import ChunkEntry, FileEntry
from shardsafe.format.index.versions import decode_index, encode_index

from forge_index import deep_copy, dumps, seal

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TRAILER = b',"index_checksum":"crc32c:%08x"}\n'


@functools.lru_cache(maxsize=None)
def saved_index() -> bytes:
    """The index.json of a real checkpoint with many value kinds (saved once per session),
    in the v1 JSON form that these tests mutate (saves write v3: test_index_v2_property)."""
    state = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "empty": np.zeros((0, 5), dtype=np.int8),
        "scalar": np.array(7, dtype=np.int64),
        "nested": {"l": [1, 2.5, "s", None, b"\x00\xff", (True, np.float16(1.5))], 3: np.ones(4, np.uint8)},
        "nan": float("nan"), "big": 2 ** 70,
    }
    with tempfile.TemporaryDirectory() as d:
        shardsafe.save(state, os.path.join(d, "ckpt"))
        with open(os.path.join(d, "ckpt", "index.json"), "rb") as f:
            return encode_index(decode_index(f.read()), version=1)


@functools.lru_cache(maxsize=None)
def sharded_index() -> bytes:
    """An index whose one tensor is split into two chunks in two files (as ranks write)."""
    chunks = tuple(ChunkEntry(f"data-r{r:05d}-000.safetensors", 64, 24, (r * 2, 0), (2, 3), (r + 1,))
                   for r in range(2))
    files = tuple(FileEntry(c.file, 64 + 24, 64, rank=r) for r, c in enumerate(chunks))
    tree = {"t": "dict", "k": ["t", "step"], "v": [{"t": "tensor", "id": 0}, {"t": "int", "v": 5}]}
    index = Index(tree=tree, tensors=(TensorEntry(("t",), "torch", "float32", (4, 3), chunks),),
                  files=files, block_size=1 << 20, world_size=2, created=1.5, metadata={"m": [1, {"x": None}]},
                  library="shardsafe test")
    return encode_index(index)


BASES = st.sampled_from(["saved", "sharded"]).map(lambda n: saved_index() if n == "saved" else sharded_index())


def body_of(sealed: bytes) -> dict[str, Any]:
    raw = json.loads(sealed)
    raw.pop("index_checksum")
    return raw


def reseal_bytes(body: bytes) -> bytes:
    """``body`` followed by a trailer whose checksum is right for it."""
    return body + TRAILER % crc32c(body)


def decode_or_reject(data: bytes) -> Index | None:
    """Decodes ``data``; any exception other than CorruptCheckpointError fails the test."""
    try:
        index = decode_index(data)
    except CorruptCheckpointError:
        return None
    again = decode_index(encode_index(index))  # what was accepted must survive a round trip
    assert again == index
    return index


def test_the_bases_decode() -> None:
    for data in (saved_index(), sharded_index()):
        index = decode_or_reject(data)
        assert index is not None and index.tensors


# ----------------------------------------------------------------------------- arbitrary input


@FUZZ
@given(st.binary(max_size=512))
def test_arbitrary_bytes(data: bytes) -> None:
    decode_or_reject(data)


@FUZZ
@given(st.binary(max_size=512))
def test_arbitrary_bytes_with_a_valid_trailer(body: bytes) -> None:
    decode_or_reject(reseal_bytes(body))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@FUZZ
@given(JSON)
def test_arbitrary_json_sealed(value: Any) -> None:
    decode_or_reject(seal(value))


@settings(FUZZ, max_examples=40)
@given(st.dictionaries(st.sampled_from(["format_version", "checksum", "block_size", "files", "tensors", "tree",
                                        "metadata", "created", "world_size", "library"]), JSON))
def test_arbitrary_members_over_a_valid_header(members: dict[str, Any]) -> None:
    raw = {"format_version": 1, "checksum": "crc32c", "block_size": 4096, "files": [], "tensors": [],
           "tree": {"t": "dict", "k": [], "v": []}}
    raw.update(members)
    decode_or_reject(seal(raw))


# ----------------------------------------------------------------------------- structural mutations

REPLACEMENTS = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 2 ** 31, 2 ** 62, 2 ** 63, 2 ** 64, -(2 ** 63), 10 ** 30, 0.5, -0.0,
                     1e300, -1e300, 4096.0, "", "x", "crc32c", "torch", "float32", "dict", "tensor", [], {}, [0],
                     ["x"], {"t": "int", "v": 1}, {"t": "tensor", "id": 0}, {"t": "dict", "k": [], "v": []}]),
    JSON,
).map(deep_copy)  # sampled lists and objects must not be shared between examples


def _containers(node: Any, path: tuple = ()) -> list[tuple]:
    """Paths of the lists and objects in ``node`` (the root included), 40 levels deep at most."""
    out = []
    if isinstance(node, (dict, list)) and len(path) <= 40:
        out.append(path)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            out.extend(_containers(v, path + (k,)))
    return out


def _at(node: Any, path: tuple) -> Any:
    for p in path:
        node = node[p]
    return node


def _nested(depth: int, leaf: Any, as_list: bool) -> Any:
    for _ in range(depth):
        leaf = [leaf] if as_list else {"t": "list", "v": [leaf]}
    return leaf


def _number_variant(v: Any, how: str) -> Any:
    if how == "huge":
        return v * 10 ** 20 + 2 ** 64
    if how == "negative":
        return -v - 1
    if how == "float":
        return v + 0.5
    return float(v)  # "same value as a float": 4096 -> 4096.0


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    raw = deep_copy(body_of(draw(BASES)))
    for _ in range(draw(st.integers(1, 3))):
        paths = _containers(raw)
        target = _at(raw, draw(st.sampled_from(paths)))
        keys = list(target) if isinstance(target, dict) else list(range(len(target)))
        op = draw(st.sampled_from(["delete", "duplicate", "retype", "number", "nest", "add"]))
        if op == "add" or not keys:
            if isinstance(target, dict):
                target[draw(st.text(max_size=6))] = draw(REPLACEMENTS)
            else:
                target.insert(draw(st.integers(0, len(target))), draw(REPLACEMENTS))
            continue
        key = draw(st.sampled_from(keys))
        if op == "delete":
            del target[key]
        elif op == "duplicate":
            if isinstance(target, list):
                target.insert(key, deep_copy(target[key]))  # may be 800 levels deep (op "nest")
            else:
                target[key + "_"] = deep_copy(target[key])
        elif op == "retype":
            target[key] = draw(REPLACEMENTS)
        elif op == "number" and isinstance(target[key], int) and not isinstance(target[key], bool):
            target[key] = _number_variant(target[key], draw(st.sampled_from(["huge", "negative", "float", "same"])))
        elif op == "nest":
            target[key] = _nested(draw(st.sampled_from([2, 50, 199, 201, 400])), target[key], draw(st.booleans()))
    return seal(raw)


@FUZZ
@given(mutated())
def test_structural_mutations_resealed(data: bytes) -> None:
    decode_or_reject(data)


@pytest.mark.parametrize("as_list", [True, False])
def test_the_deepest_mutations_can_be_built(as_list: bool) -> None:
    """What ``mutated`` may build at worst (two "nest" ops of 400 stacked, then a
    "duplicate" of the result: 1,600 levels) is copied and sealed without a RecursionError."""
    raw = deep_copy(body_of(saved_index()))
    raw["tree"] = _nested(400, _nested(400, raw["tree"], as_list), as_list)
    raw["tree_"] = deep_copy(raw["tree"])
    assert dumps(raw["tree_"]) == dumps(raw["tree"]) and raw["tree_"] is not raw["tree"]
    assert decode_or_reject(seal(raw)) is None


def _slots(node: Any, path: tuple = ()) -> list[tuple]:
    """Paths of every member and element of ``node``."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    out = []
    for k, v in items:
        out.append(path + (k,))
        out.extend(_slots(v, path + (k,)))
    return out


_DELETE = object()
EVERY_TYPE = [None, True, -1, 2 ** 64, 0.5, "x", [], {}, [["x"]], {"t": "x"}]


def test_every_member_deleted_or_retyped() -> None:
    """Exhaustive single edits: each member or element of both bases removed, or given each type."""
    for base in (saved_index(), sharded_index()):
        raw = body_of(base)
        for path in _slots(raw):
            for value in [_DELETE, *EVERY_TYPE]:
                edited = copy.deepcopy(raw)
                parent = _at(edited, path[:-1])
                if value is _DELETE:
                    del parent[path[-1]]
                else:
                    parent[path[-1]] = copy.deepcopy(value)
                decode_or_reject(seal(edited))


@FUZZ
@given(BASES, st.sampled_from(["format_version", "block_size", "files", "tensors", "tree", "checksum"]))
def test_duplicate_member_resealed(base: bytes, name: str) -> None:
    """A member given twice (which json.dumps cannot write) is ambiguous: rejected."""
    raw = body_of(base)
    text = json.dumps(raw, separators=(",", ":"))
    member = f'"{name}":' + json.dumps(raw[name], separators=(",", ":"))
    body = ("{" + member + "," + text[1:-1]).encode()
    assert decode_or_reject(reseal_bytes(body)) is None


@settings(max_examples=40, deadline=None)
@given(BASES, st.sampled_from([b'"metadata":{', b'"tree":{', b'"tensors":[', b'"files":[', b'"v":[', b'"chunks":[']),
       st.sampled_from([b"[", b'{"a":', b'{"t":"list","v":[']), st.sampled_from([3, 150, 1100, 100_000]))
def test_deep_nesting_resealed(base: bytes, where: bytes, opener: bytes, depth: int) -> None:
    """A nested value inserted as the first member or element of a container, up to nesting
    far beyond Python's recursion limit (which must not escape as RecursionError)."""
    closer = {b"[": b"]", b'{"a":': b"}", b'{"t":"list","v":[': b"]}"}[opener]
    if where not in base:
        return
    body = base[: base.rindex(b',"index_checksum"')]
    at = body.index(where) + len(where)
    name = b'"deep":' if where.endswith(b"{") else b""
    sep = b"" if body[at:at + 1] in (b"]", b"}") else b","
    body = body[:at] + name + opener * depth + b"0" + closer * depth + sep + body[at:]
    index = decode_or_reject(reseal_bytes(body))
    if depth > 10_000 or where not in (b'"metadata":{', b'"tree":{'):  # the tree may gain a member it ignores
        assert index is None
    elif where == b'"metadata":{' and depth < 1000:  # metadata is any JSON; from ~1,000 levels on,
        assert index is not None and "deep" in index.metadata  # acceptance depends on the recursion limit


# ----------------------------------------------------------------------------- byte-level damage


@st.composite
def damaged(draw: st.DrawFn) -> tuple[bytes, bool]:
    data = bytearray(draw(BASES))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[at:at + draw(st.integers(1, 16))]
    return bytes(data), draw(st.booleans())


@FUZZ
@given(damaged())
def test_byte_damage(case: tuple[bytes, bool]) -> None:
    data, reseal = case
    if reseal:  # recompute the checksum over what precedes the (possibly damaged) trailer
        cut = data.rfind(b',"index_checksum"')
        data = reseal_bytes(data[:cut] if cut >= 0 else data)
    decode_or_reject(data)


def test_byte_damage_without_reseal_is_always_caught() -> None:
    """Without a re-sealed checksum, a single bit flip anywhere is rejected."""
    base = saved_index()
    for at in range(0, len(base) - 1, max(1, len(base) // 97)):
        for bit in (0, 5):
            data = bytearray(base)
            data[at] ^= 1 << bit
            assert decode_or_reject(bytes(data)) is None, (at, bit)
