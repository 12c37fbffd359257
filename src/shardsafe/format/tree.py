"""The structure tree of a checkpoint: typed JSON nodes for containers and plain values.

Tensors are not stored in the tree; a ``{"t": "tensor", "id": N}`` node points at
entry N of the index's tensor table. Everything here is pure and never executes code
from the checkpoint: decoding only builds dicts, lists, tuples and plain values.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .dtypes import from_numpy, lookup

KeyPath = tuple["str | int", ...]
Node = dict[str, Any]

MAX_INT_BITS = 12_000  # ~3,600 decimal digits: inside the 4,300 Python converts to text by default
MAX_DEPTH = 200  # deeper trees are rejected on decode (a forged index could recurse forever)


def render_path(path: KeyPath) -> str:
    """Human-readable dotted form of a key path (``model.layers.0.weight``)."""
    return ".".join(str(p) for p in path) if path else "<root>"


def check_key_text(text: str, path: KeyPath) -> None:
    """Raises TypeError unless ``text`` can be written as UTF-8 (lone surrogates cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise TypeError(f"string at key path {render_path(path)!r} is not valid unicode "
                        f"(lone surrogate); it cannot be stored as UTF-8 JSON") from None


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
    return None


class TreeError(ValueError):
    """A node of the tree is malformed (raised while decoding an untrusted index)."""


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


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise TreeError(msg)


def decode_plain(node: Node) -> Any:
    """Decodes a plain-value node; raises TreeError if malformed."""
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
        _check(isinstance(v, str), "str node must hold a string")
        return v
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
    raise TreeError(f"unknown node type {t!r}")


def walk(node: Node, path: KeyPath = (), depth: int = 0) -> Iterator[tuple[KeyPath, Node]]:
    """Yields ``(key_path, node)`` for every leaf (tensor or plain value), validating shape."""
    _check(isinstance(node, dict), f"node at {render_path(path)} is not an object")
    _check(depth <= MAX_DEPTH, f"tree deeper than {MAX_DEPTH} at {render_path(path)}")
    t = node.get("t")
    if t == "dict":
        keys, vals = node.get("k"), node.get("v")
        _check(isinstance(keys, list) and isinstance(vals, list) and len(keys) == len(vals),
               f"dict node at {render_path(path)} needs equal-length k and v lists")
        seen: set[Any] = set()
        for k, v in zip(keys, vals):
            _check((isinstance(k, str) or (isinstance(k, int) and not isinstance(k, bool))),
                   f"dict key {k!r} at {render_path(path)} is neither str nor int")
            _check(k not in seen, f"duplicate key {k!r} at {render_path(path)}")
            seen.add(k)
            yield from walk(v, path + (k,), depth + 1)
    elif t in ("list", "tuple"):
        vals = node.get("v")
        _check(isinstance(vals, list), f"{t} node at {render_path(path)} needs a v list")
        for i, v in enumerate(vals):
            yield from walk(v, path + (i,), depth + 1)
    elif t == "tensor":
        _check(isinstance(node.get("id"), int) and not isinstance(node.get("id"), bool),
               f"tensor node at {render_path(path)} needs an integer id")
        yield path, node
    else:
        decode_plain(node)  # validates
        yield path, node


def build(node: Node, leaf: Callable[[KeyPath, Node], Any], path: KeyPath = ()) -> Any:
    """Rebuilds Python containers from a (validated) tree, calling ``leaf`` for tensor nodes."""
    t = node["t"]
    if t == "dict":
        return {k: build(v, leaf, path + (k,)) for k, v in zip(node["k"], node["v"])}
    if t == "list":
        return [build(v, leaf, path + (i,)) for i, v in enumerate(node["v"])]
    if t == "tuple":
        return tuple(build(v, leaf, path + (i,)) for i, v in enumerate(node["v"]))
    if t == "tensor":
        return leaf(path, node)
    return decode_plain(node)
