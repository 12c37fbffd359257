"""Tree nodes for the richer values of a state: dtypes, devices, paths, dates, sets, keys.

Each value becomes a JSON object tagged with ``t`` (docs/FORMAT.md section 6.1). The
encoders raise ``TypeError`` naming the key path; the decoders treat the node as
untrusted and raise ``TreeError`` for anything a writer would not have produced
(non-canonical text, unknown classes, duplicate set members). torch is never imported
at module level: ``torch.dtype`` / ``torch.device`` are stored as their names and rebuilt
only when a tree holding them is built, with torch importable.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import pathlib
import re
from collections.abc import Callable
from typing import Any

KeyPath = tuple[Any, ...]
Node = dict[str, Any]


class TreeError(ValueError):
    """A node of the tree is malformed (raised while decoding an untrusted index)."""


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise TreeError(msg)


def render_path(path: KeyPath) -> str:
    """Human-readable dotted form of a key path (``model.layers.0.weight``)."""
    return ".".join(map(str, path)) if path else "<root>"


# ----------------------------------------------------------------------------- torch names

_DTYPE_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
_DEVICE = re.compile(r"[a-z][a-z0-9_]{0,31}(:[0-9]{1,9})?")


def _torch() -> Any:
    return importlib.import_module("torch")


def _is_torch(x: Any, attr: str) -> bool:
    mod = type(x).__module__
    return mod == "torch" and type(x).__name__ == attr


def _decode_dtype(name: Any) -> Any:
    check(isinstance(name, str) and _DTYPE_NAME.fullmatch(name) is not None, f"bad dtype name {name!r}")
    torch = _torch()
    d = getattr(torch, name, None)
    check(isinstance(d, torch.dtype) and str(d) == f"torch.{name}", f"torch has no dtype {name!r}")
    return d


def _decode_device(text: Any) -> Any:
    check(isinstance(text, str) and _DEVICE.fullmatch(text) is not None, f"bad device {text!r}")
    torch = _torch()
    try:
        d = torch.device(text)
    except RuntimeError as e:
        raise TreeError(f"bad device {text!r}: {e}") from None
    check(str(d) == text, f"device {text!r} is not in canonical form")
    return d


# ----------------------------------------------------------------------------- paths

_PATH_CLASSES: dict[str, type] = {c.__name__: c for c in (
    pathlib.PurePosixPath, pathlib.PureWindowsPath, pathlib.PosixPath, pathlib.WindowsPath)}
# a concrete path of the other OS cannot be instantiated here: its pure twin stands in
_PURE_TWIN = {"PosixPath": pathlib.PurePosixPath, "WindowsPath": pathlib.PureWindowsPath}


def _decode_path(node: Node) -> Any:
    cls, v = node.get("cls"), node.get("v")
    check(isinstance(cls, str) and cls in _PATH_CLASSES and isinstance(v, str), f"bad path node {node!r}")
    try:
        p = _PATH_CLASSES[cls](v)
    except NotImplementedError:  # WindowsPath on POSIX and vice versa
        p = _PURE_TWIN[cls](v)
    check(str(p) == v, f"path {v!r} is not in canonical form")
    return p


# ----------------------------------------------------------------------------- dates and times


def _tz_node(tz: Any, path: KeyPath) -> Node | None:
    if tz is None:
        return None
    if type(tz) is not dt.timezone:
        raise TypeError(f"cannot save tzinfo {type(tz).__name__} at key path {render_path(path)!r}: "
                        f"only fixed offsets (datetime.timezone) are saved")
    off = tz.utcoffset(None)
    node: Node = {"offset_us": (off.days * 86400 + off.seconds) * 1_000_000 + off.microseconds}
    if tz.tzname(None) != dt.timezone(off).tzname(None):
        node["name"] = tz.tzname(None)
    return node


def _decode_tz(node: Any) -> Any:
    if node is None:
        return None
    check(isinstance(node, dict) and set(node) <= {"offset_us", "name"}, f"bad tz {node!r}")
    us, name = node.get("offset_us"), node.get("name")
    check(isinstance(us, int) and not isinstance(us, bool) and abs(us) < 86_400_000_000,
          f"bad tz offset {us!r}")
    try:
        off = dt.timedelta(microseconds=us)
        return dt.timezone(off) if name is None else dt.timezone(off, name)
    except (TypeError, ValueError) as e:
        raise TreeError(f"bad tz {node!r}: {e}") from None


def _encode_datelike(x: Any, path: KeyPath) -> Node | None:
    t = type(x)
    if t is dt.timedelta:
        return {"t": "timedelta", "v": [x.days, x.seconds, x.microseconds]}
    if t is dt.date:
        return {"t": "date", "v": x.isoformat()}
    if t not in (dt.datetime, dt.time):
        return None
    node: Node = {"t": "datetime" if t is dt.datetime else "time",
                  "v": x.replace(tzinfo=None).isoformat()}
    tz = _tz_node(x.tzinfo, path)
    if tz is not None:
        node["tz"] = tz
    if x.fold:
        node["fold"] = 1
    return node


def _decode_datelike(node: Node) -> Any:
    t, v = node["t"], node.get("v")
    if t == "timedelta":
        check(isinstance(v, list) and len(v) == 3
              and all(isinstance(i, int) and not isinstance(i, bool) for i in v)
              and 0 <= v[1] < 86400 and 0 <= v[2] < 1_000_000, f"bad timedelta {v!r}")
        try:
            return dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2])
        except OverflowError:
            raise TreeError(f"timedelta {v!r} is out of range") from None
    cls = {"date": dt.date, "datetime": dt.datetime, "time": dt.time}[t]
    check(isinstance(v, str) and len(v) <= 32, f"bad {t} {v!r}")
    try:
        x = cls.fromisoformat(v)
    except ValueError:
        raise TreeError(f"bad {t} {v!r}") from None
    check(x.isoformat() == v and getattr(x, "tzinfo", None) is None, f"{t} {v!r} is not in canonical form")
    if t == "date":
        return x
    fold = node.get("fold", 0)
    check(fold in (0, 1) and not isinstance(fold, bool), f"bad fold {fold!r}")
    return x.replace(tzinfo=_decode_tz(node.get("tz")), fold=fold)


# ----------------------------------------------------------------------------- dispatch

DATELIKE = ("date", "datetime", "time", "timedelta")
EXTRA_TYPES = ("dtype", "device", "size", "path", *DATELIKE)
TORCH_TYPES = ("dtype", "device", "size")  # nodes whose value needs torch to be built

SIZE_MAX_DIMS = 64  # more dimensions than any tensor has; a forged size node is refused
_INT64 = 1 << 63


def encode_extra(x: Any, path: KeyPath) -> Node | None:
    """Encodes a dtype, device, ``torch.Size``, path or date-like value; None if ``x`` is
    none of those."""
    if _is_torch(x, "dtype"):
        return {"t": "dtype", "v": str(x).removeprefix("torch.")}
    if _is_torch(x, "device"):
        return {"t": "device", "v": str(x)}
    if _is_torch(x, "Size"):
        if len(x) > SIZE_MAX_DIMS:
            raise TypeError(f"torch.Size at key path {render_path(path)!r} has more than "
                            f"{SIZE_MAX_DIMS} dimensions")
        return {"t": "size", "v": [int(d) for d in x]}
    if type(x).__name__ in _PATH_CLASSES and _PATH_CLASSES[type(x).__name__] is type(x):
        return {"t": "path", "cls": type(x).__name__, "v": str(x)}
    return _encode_datelike(x, path)


def decode_extra(node: Node) -> Any:
    """Decodes a node of one of EXTRA_TYPES (TreeError if malformed)."""
    t = node["t"]
    if t == "dtype":
        return _decode_dtype(node.get("v"))
    if t == "device":
        return _decode_device(node.get("v"))
    if t == "size":
        return _torch().Size(_size_dims(node.get("v")))
    if t == "path":
        return _decode_path(node)
    return _decode_datelike(node)


def validate_extra(node: Node) -> None:
    """Checks a node of EXTRA_TYPES without importing torch (walk validates this way)."""
    t = node["t"]
    if t == "dtype":
        v = node.get("v")
        check(isinstance(v, str) and _DTYPE_NAME.fullmatch(v) is not None, f"bad dtype name {v!r}")
    elif t == "device":
        v = node.get("v")
        check(isinstance(v, str) and _DEVICE.fullmatch(v) is not None, f"bad device {v!r}")
    elif t == "size":
        _size_dims(node.get("v"))
    else:
        decode_extra(node)


def _size_dims(v: Any) -> tuple[int, ...]:
    """The dimensions of a ``size`` node: at most SIZE_MAX_DIMS int64 integers."""
    check(isinstance(v, list) and len(v) <= SIZE_MAX_DIMS, f"bad size node value {v!r:.80}")
    for d in v:
        check(type(d) is int and -_INT64 <= d < _INT64, f"bad size dimension {d!r:.40}")
    return tuple(v)


# ----------------------------------------------------------------------------- hashable values


def encode_hashable(x: Any, path: KeyPath, plain: Callable[[Any, KeyPath], Node | None],
                    depth: int, max_depth: int) -> Node:
    """Encodes a set member or dict key: a plain value, tuple or frozenset of such values."""
    if depth > max_depth:
        raise TypeError(f"value nested deeper than {max_depth} levels at key path {render_path(path)!r}")
    if type(x) is tuple:
        return {"t": "tuple", "v": [encode_hashable(v, path, plain, depth + 1, max_depth) for v in x]}
    if type(x) is frozenset:
        return encode_set(x, path, plain, depth, max_depth)
    node = plain(x, path)
    if node is None or node["t"] in ("set", "frozenset"):
        raise TypeError(f"cannot save {type(x).__module__}.{type(x).__qualname__} as a set member or "
                        f"dict key at key path {render_path(path)!r}")
    return node


def _sort_key(node: Node) -> str:
    return json.dumps(node, sort_keys=True, ensure_ascii=True)


def encode_set(x: set | frozenset, path: KeyPath, plain: Callable[[Any, KeyPath], Node | None],
               depth: int, max_depth: int) -> Node:
    """A set or frozenset: its members encoded, sorted by their JSON text (deterministic bytes)."""
    members = [encode_hashable(v, path, plain, depth + 1, max_depth) for v in x]
    return {"t": "frozenset" if type(x) is frozenset else "set", "v": sorted(members, key=_sort_key)}


def decode_hashable(node: Any, decode_plain: Callable[[Node], Any], depth: int, max_depth: int) -> Any:
    """Decodes a set member or dict key node (TreeError if malformed or unhashable)."""
    check(isinstance(node, dict), f"key or set member {node!r} is not an object")
    check(depth <= max_depth, f"key or set member nested deeper than {max_depth}")
    t = node.get("t")
    if t == "tuple":
        vals = node.get("v")
        check(isinstance(vals, list), "tuple node needs a v list")
        return tuple(decode_hashable(v, decode_plain, depth + 1, max_depth) for v in vals)
    if t == "frozenset":
        return decode_set(node, decode_plain, depth, max_depth)
    check(t not in ("set", "dict", "list", "tensor", "alias", "namespace"),
          f"a {t} node cannot be a set member or dict key")
    return decode_plain(node)


def decode_set(node: Node, decode_plain: Callable[[Node], Any], depth: int, max_depth: int) -> Any:
    vals = node.get("v")
    check(isinstance(vals, list), f"{node.get('t')} node needs a v list")
    members = [decode_hashable(v, decode_plain, depth + 1, max_depth) for v in vals]
    out = frozenset(members) if node["t"] == "frozenset" else set(members)
    check(len(out) == len(members), f"{node['t']} node holds equal members twice")
    return out
