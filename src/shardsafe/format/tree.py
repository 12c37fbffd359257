"""The structure tree of a checkpoint: typed JSON nodes for containers and plain values.

Tensors are not stored in the tree; a ``{"t": "tensor", "id": N}`` node points at
entry N of the index's tensor table, and an ``{"t": "alias", "id": N}`` node stands
for the same tensor again (tied weights, stored once). Everything here is pure and
never executes code from the checkpoint: decoding only builds containers and the
value types of docs/FORMAT.md section 6 (format.values holds the richer ones).
"""

from __future__ import annotations

import argparse
import base64
import math
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import values
from .dtypes import from_numpy, lookup
from .values import TreeError, check as _check, render_path

KeyPath = tuple[Any, ...]  # dict keys (str, int, or any hashable value of section 6) and positions
Node = dict[str, Any]

MAX_INT_BITS = 12_000  # ~3,600 decimal digits: inside the 4,300 Python converts to text by default
MAX_DEPTH = 200  # deeper trees are rejected on decode (a forged index could recurse forever)


def is_valid_text(text: str) -> bool:
    """True unless ``text`` holds a lone surrogate (which UTF-8 cannot carry)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_key_text(text: str, path: KeyPath) -> None:
    """Raises TypeError unless ``text`` can be written as UTF-8 (lone surrogates cannot).

    The decoder refuses the same strings (``_text``), so what loads can be saved again.
    """
    if not is_valid_text(text):
        raise TypeError(f"string at key path {render_path(path)!r} is not valid unicode "
                        f"(lone surrogate); it cannot be stored as UTF-8 JSON")


# A JSON escape of a UTF-16 surrogate, or an escaped backslash (consumed in pairs so that
# the text \\ud800 -- a backslash, then "ud800" -- is not mistaken for an escape).
_SURROGATE_ESCAPE = re.compile(rb"\\(?:\\|u[dD][89abAB][0-9a-fA-F]{2}(?:\\u[dD][c-fC-F][0-9a-fA-F]{2})?"
                               rb"|u[dD][c-fC-F][0-9a-fA-F]{2})")


def find_lone_surrogate(json_bytes: bytes) -> int:
    """Offset of the first ``\\uD800``-style escape of a lone surrogate in JSON text, or -1.

    Such a string parses, but cannot be written back as UTF-8: the writer refuses it
    (``check_key_text``), so the reader refuses it too, anywhere in the index.
    """
    if b"\\u" not in json_bytes:
        return -1
    for m in _SURROGATE_ESCAPE.finditer(json_bytes):
        esc = m.group()
        if esc != b"\\\\" and len(esc) != 12:  # a pair is 12 bytes long
            return m.start()
    return -1


def _text(v: Any, what: str) -> str:
    _check(isinstance(v, str), f"{what} must hold a string")
    _check(is_valid_text(v), f"{what} holds a lone surrogate (not valid unicode)")
    return v


def encode_plain(value: Any, path: KeyPath) -> Node | None:
    """Encodes a plain (non-container, non-tensor) value, or returns None if it is not one."""
    if value is None:
        return {"t": "none"}
    if isinstance(value, np.generic):  # before float/int: np.float64 subclasses float
        try:
            dt = from_numpy(value.dtype)
        except TypeError as e:
            raise TypeError(f"cannot save numpy scalar at key path {render_path(path)!r}: {e}") from None
        return {"t": "npscalar", "dtype": dt.name,
                "v": base64.b64encode(np.asarray(value).tobytes()).decode("ascii")}
    if isinstance(value, bool):
        return {"t": "bool", "v": value}
    if isinstance(value, int):
        if abs(value).bit_length() > MAX_INT_BITS:  # JSON text of it would exceed Python's digit limit
            raise TypeError(f"int at key path {render_path(path)!r} has more than {MAX_INT_BITS} bits")
        return {"t": "int", "v": int(value)}
    if isinstance(value, float):
        f = float(value)
        if math.isnan(f):
            return {"t": "float", "v": "nan"}
        if math.isinf(f):
            return {"t": "float", "v": "inf" if f > 0 else "-inf"}
        return {"t": "float", "v": f}
    if isinstance(value, str):
        check_key_text(value, path)
        return {"t": "str", "v": value}
    if isinstance(value, (bytes, bytearray)):
        return {"t": "bytes", "v": base64.b64encode(bytes(value)).decode("ascii")}
    if type(value) in (set, frozenset):
        return values.encode_set(value, path, encode_plain, 0, MAX_DEPTH)
    extra = values.encode_extra(value, path)
    if extra is not None:
        for text in (extra.get("v"), extra.get("tz", {}).get("name")):
            if isinstance(text, str):
                check_key_text(text, path)
    return extra


def encode_key(key: Any, path: KeyPath) -> Any:
    """A dict key as stored in a dict node's ``k`` (and in tensor-table key paths).

    Strings and integers are stored bare, as JSON strings and numbers; any other
    hashable value of section 6 (None, bool, float, tuple, frozenset, ...) as its node.
    Raises TypeError naming the key path for keys that cannot be saved.
    """
    if isinstance(key, str) and type(key) is not str:  # str subclasses (StrEnum) stay as text
        key = str(key)
    if type(key) is str:
        check_key_text(key, path + (key,))
        return key
    if isinstance(key, int) and not isinstance(key, bool) and not isinstance(key, np.generic):
        encode_plain(int(key), path + (key,))  # the size limit
        return int(key)
    if isinstance(key, float) and math.isnan(key):
        raise TypeError(f"dict key NaN at key path {render_path(path)!r} cannot be looked up again")
    try:
        return values.encode_hashable(key, path + (key,), encode_plain, 0, MAX_DEPTH)
    except TypeError as e:
        raise TypeError(f"dict key {key!r} ({type(key).__name__}) at key path {render_path(path)!r} "
                        f"cannot be saved ({e}): keys are str, int, float, bool, None, tuples or the "
                        f"other hashable values of docs/FORMAT.md section 6") from None


def decode_key(k: Any) -> Any:
    """Inverse of encode_key for untrusted input (TreeError if malformed)."""
    if isinstance(k, str):
        return _text(k, "dict key")
    if isinstance(k, int) and not isinstance(k, bool):
        return k
    _check(isinstance(k, dict), f"dict key {k!r} is neither a string, an integer nor a key node")
    _check(k.get("t") not in ("str", "int"), f"dict key {k!r}: strings and integers are stored bare")
    return values.decode_hashable(k, decode_plain, 0, MAX_DEPTH)


def _validate_key(k: Any) -> Any:
    """decode_key without building torch values (a stand-in for dtype/device keys)."""
    if isinstance(k, (str, int)) and not isinstance(k, bool):
        return decode_key(k)
    _check(isinstance(k, dict), f"dict key {k!r} is neither a string, an integer nor a key node")
    _check(k.get("t") not in ("str", "int"), f"dict key {k!r}: strings and integers are stored bare")
    return values.decode_hashable(k, lambda n: decode_plain(n, True), 0, MAX_DEPTH)


def encode_key_path(path: KeyPath) -> list[Any]:
    """A key path as JSON (tensor-table ``key``): bare strings and integers, other keys as nodes."""
    return [encode_key(p, path[:i]) for i, p in enumerate(path)]


def decode_key_path(raw: Any) -> KeyPath:
    """Inverse of encode_key_path for untrusted input (TreeError if malformed).

    Keys come back as ``walk`` yields them: a dtype or device inside a key stays a
    ``("dtype", name)`` stand-in, so no torch import is needed to validate an index.
    """
    _check(isinstance(raw, list) and len(raw) <= MAX_DEPTH + 1, "key path must be a list")
    return tuple(_validate_key(k) for k in raw)


def _float(v: Any) -> float:
    if isinstance(v, bool):
        raise TreeError("float node holds a bool")
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:  # a foreign writer's 10**400: not a float
            raise TreeError(f"float value {v} is out of range") from None
    if v in ("nan", "inf", "-inf"):
        return float(v)
    raise TreeError(f"bad float value {v!r}")


def decode_plain(node: Node, validate_only: bool = False) -> Any:
    """Decodes a plain-value node; raises TreeError if malformed.

    ``validate_only`` checks dtype and device nodes without importing torch (they decode
    to a stand-in tuple then); ``walk`` validates an index this way.
    """
    t = node.get("t")
    v = node.get("v")
    if t == "none":
        return None
    if t == "bool":
        _check(isinstance(v, bool), "bool node must hold true/false")
        return v
    if t == "int":
        _check(isinstance(v, int) and not isinstance(v, bool), "int node must hold an integer")
        return v
    if t == "float":
        return _float(v)
    if t == "str":
        return _text(v, "str node")
    if t == "bytes":
        _check(isinstance(v, str), "bytes node must hold base64 text")
        try:
            return base64.b64decode(v, validate=True)
        except ValueError as e:
            raise TreeError(f"bytes node is not valid base64: {e}") from None
    if t == "npscalar":
        try:
            d = lookup(node.get("dtype"))  # type: ignore[arg-type]
            raw = base64.b64decode(v, validate=True) if isinstance(v, str) else b""
        except (ValueError, TypeError):
            raise TreeError(f"bad npscalar node {node!r}") from None
        _check(d.numpy is not None and len(raw) == d.itemsize, f"bad npscalar node {node!r}")
        return np.frombuffer(raw, dtype=d.numpy)[0]
    if t in ("set", "frozenset"):
        return values.decode_set(node, lambda n: decode_plain(n, validate_only), 0, MAX_DEPTH)
    if validate_only and t in values.TORCH_TYPES:
        values.validate_extra(node)
        return (t, tuple(v) if isinstance(v, list) else v)
    if t in values.EXTRA_TYPES:
        for text in (v, node["tz"].get("name") if isinstance(node.get("tz"), dict) else None):
            if isinstance(text, str):
                _text(text, f"{t} node")
        return values.decode_extra(node)
    raise TreeError(f"unknown node type {t!r}")


def dict_items(node: Node) -> Iterator[tuple[Any, Node]]:
    """``(key, child node)`` of a validated dict or namespace node, keys decoded."""
    for k, v in zip(node["k"], node["v"]):
        yield (k if isinstance(k, (str, int)) else decode_key(k)), v


def walk(node: Node, path: KeyPath = (), depth: int = 0) -> Iterator[tuple[KeyPath, Node]]:
    """Yields ``(key_path, node)`` for every leaf (tensor or plain value), validating shape."""
    # (messages are built only on failure: this runs once per node of every index read)
    if not isinstance(node, dict):
        raise TreeError(f"node at {render_path(path)} is not an object")
    if depth > MAX_DEPTH:
        raise TreeError(f"tree deeper than {MAX_DEPTH} at {render_path(path)}")
    t = node.get("t")
    if t in ("dict", "namespace"):
        keys, vals = node.get("k"), node.get("v")
        if not (isinstance(keys, list) and isinstance(vals, list) and len(keys) == len(vals)):
            raise TreeError(f"{t} node at {render_path(path)} needs equal-length k and v lists")
        if node.get("ordered", True) is not True:
            raise TreeError(f"dict node at {render_path(path)}: ordered must be true")
        seen: set[Any] = set()
        for k, v in zip(keys, vals):
            try:
                key = _validate_key(k)
            except TreeError as e:
                raise TreeError(f"at {render_path(path)}: {e}") from None
            if t != "dict" and not isinstance(k, str):
                raise TreeError(f"namespace attribute {k!r} is not a string")
            if key in seen:
                raise TreeError(f"duplicate key {k!r} at {render_path(path)}")
            seen.add(key)
            yield from walk(v, path + (key,), depth + 1)
    elif t in ("list", "tuple"):
        vals = node.get("v")
        if not isinstance(vals, list):
            raise TreeError(f"{t} node at {render_path(path)} needs a v list")
        for i, v in enumerate(vals):
            yield from walk(v, path + (i,), depth + 1)
    elif t in ("tensor", "alias"):
        if type(node.get("id")) is not int:  # noqa: E721 - a bool is not an id
            raise TreeError(f"{t} node at {render_path(path)} needs an integer id")
        yield path, node
    else:
        decode_plain(node, validate_only=True)
        yield path, node


def build(node: Node, leaf: Callable[[KeyPath, Node], Any], path: KeyPath = (),
          memo: dict[int, Any] | None = None) -> Any:
    """Rebuilds Python values from a (validated) tree, calling ``leaf`` for tensor nodes.

    ``leaf`` runs once per tensor id: an ``alias`` node (and any later node with the
    same id) gets the very object the first one got, so tied tensors come back tied.
    Pass one ``memo`` to several calls to share tensors between them.
    """
    memo = {} if memo is None else memo
    t = node["t"]
    if t in ("dict", "namespace"):
        items = {}
        for k, v in zip(node["k"], node["v"]):
            if not isinstance(k, (str, int)):
                k = decode_key(k)
            vt = v["t"]
            if vt == "tensor" or vt == "alias":  # inline: most leaves of a state are tensors
                i = v["id"]
                x = memo.get(i, memo)
                if x is memo:
                    x = memo[i] = leaf(path + (k,), v)
                items[k] = x
            else:
                items[k] = build(v, leaf, path + (k,), memo)
        if t == "namespace":
            return argparse.Namespace(**items)
        return OrderedDict(items) if node.get("ordered") else items
    if t == "list":
        return [build(v, leaf, path + (i,), memo) for i, v in enumerate(node["v"])]
    if t == "tuple":
        return tuple(build(v, leaf, path + (i,), memo) for i, v in enumerate(node["v"]))
    if t in ("tensor", "alias"):
        if node["id"] not in memo:
            memo[node["id"]] = leaf(path, node)
        return memo[node["id"]]
    return decode_plain(node)
