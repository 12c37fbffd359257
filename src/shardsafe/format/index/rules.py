"""What every index version's decoder checks: limits, strict JSON, file rows, tensor
headers, the tree (docs/FORMAT.md section 9).

Every decoder (``v1``, ``v2``, ``v3``) treats its input as untrusted and applies these
rules, so a rule changed here changes for every version.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from itertools import repeat
from operator import eq
from typing import Any

from ...errors import CorruptCheckpointError
from .. import INDEX_NAME, tree
from ..dtypes import DType, lookup
from .rows import FileEntry, valid_file_name

MAX_INDEX_BYTES = 1 << 30  # engine.commit reads at most this much
MAX_TREE_DEPTH = 128  # nesting of the state tree (real states: tens)
MAX_TREE_NODES = 1 << 23
MAX_MEAN_DEPTH = 32  # validation walks each leaf's path: sum of depths <= 32 * nodes
MAX_NDIM = 64
MAX_DIM = 1 << 62
# Bound on prod(max(dim, 1)) * itemsize: a zero-size tensor must not smuggle in dimensions
# that overflow numpy's size arithmetic or look absurd to any reader.
MAX_EXTENT_BYTES = 1 << 62
TENSOR_KINDS = ("torch", "numpy", "jax")
# What a compressed JSON may describe (docs/FORMAT.md 9.8): a JSON of ``n`` stored bytes
# holds at most JSON_VALUES_FLOOR + JSON_VALUES_PER_BYTE * n values (a raw JSON always
# does: every value takes at least two bytes), so parsing it costs memory linear in the
# bytes stored, not in what they inflate to.
JSON_VALUES_FLOOR = 1 << 20
JSON_VALUES_PER_BYTE = 4
MAX_METADATA_BYTES = 1 << 22  # user metadata, as the encoders write it (JSON, UTF-8)


def bad(msg: str) -> CorruptCheckpointError:
    """The error for a malformed index (names the index file)."""
    return CorruptCheckpointError(f"malformed index: {msg}", file=INDEX_NAME)


def check_int(v: Any, what: str, lo: int = 0, hi: int = MAX_DIM) -> int:
    """``v`` if it is an integer (not a bool) in ``[lo, hi]``, else a malformed-index error."""
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise bad(f"{what} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` that refuses duplicate member names (parsers disagree on which wins)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate member name in a JSON object")
    return out


def reject_constant(name: str) -> Any:
    """``parse_constant`` hook: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not JSON (the encoder never writes it)")


def finite_float(text: str) -> float:
    """``parse_float`` hook: "1e400" would otherwise become inf, which no encoder writes."""
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {text} is out of range")
    return v


def encode_files(files: Sequence[FileEntry]) -> list[dict[str, Any]]:
    """The ``files`` rows of an index (every version writes them alike)."""
    return [{"name": f.name, "size": f.size, "data_start": f.data_start, "rank": f.rank} for f in files]


def decode_files(raw: Any) -> tuple[FileEntry, ...]:
    """The ``files`` rows: plain, unique, unreserved names; sizes and data starts in range."""
    if not isinstance(raw, list):
        raise bad("files must be a list")
    out, names = [], set()
    for f in raw:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not valid_file_name(f["name"]):
            raise bad(f"bad data file entry {f!r}: names are plain file names (no paths), or <step directory>/"
                      f"<file name> for a reference")
        if f["name"] in names or f["name"] == INDEX_NAME:
            raise bad(f"duplicate or reserved data file name {f['name']!r}")
        names.add(f["name"])
        size = check_int(f.get("size"), "file size")
        start = check_int(f.get("data_start"), "file data_start", 8, size)
        out.append(FileEntry(f["name"], size, start, check_int(f.get("rank", 0), "file rank", 0, 1 << 31)))
    return tuple(out)


def tensor_key(t: Any) -> tree.KeyPath:
    """The key path of a JSON tensor row (versions 1 and 2): strings and integers bare, every
    other key as its node (section 6), decoded as ``tree.walk`` yields it, so that it
    can be compared with the tree's paths."""
    if not isinstance(t, dict) or not isinstance(t.get("key"), list):
        raise bad("tensor entry needs a key list")
    try:
        return tree.decode_key_path(t["key"])
    except (tree.TreeError, RecursionError) as e:
        raise bad(f"tensor key {t['key']!r}: {e}") from None


def tensor_header(t: dict[str, Any], name: str) -> tuple[str, DType, tuple[int, ...]]:
    """Kind, dtype and global shape of a JSON tensor row (versions 1 and 2), checked."""
    if t.get("kind") not in TENSOR_KINDS:
        raise bad(f"tensor {name}: unknown kind {t.get('kind')!r}")
    try:
        dt = lookup(t.get("dtype"))  # type: ignore[arg-type]
    except (ValueError, TypeError):
        raise bad(f"tensor {name}: unknown dtype {t.get('dtype')!r}") from None
    if t["kind"] == "numpy" and dt.numpy is None:
        raise bad(f"tensor {name}: numpy cannot hold dtype {dt.name}")
    shape = t.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise bad(f"shape of {name} must be a list of at most {MAX_NDIM} integers")
    if all(type(s) is int and 0 <= s <= MAX_DIM for s in shape):  # noqa: E721 - not bool
        shape_t = tuple(shape)
    else:  # the failing dimension names itself
        shape_t = tuple(check_int(s, f"shape of {name}") for s in shape)
    if math.prod(max(s, 1) for s in shape_t) * dt.itemsize > MAX_EXTENT_BYTES:
        raise bad(f"tensor {name}: absurd shape {list(shape_t)}")
    return t["kind"], dt, shape_t


def dumps(value: Any) -> str:
    """JSON text as every index writes it (compact, UTF-8 as is, no NaN)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def json_values(text: bytes) -> int:
    """An upper bound on the number of values (and member names) in JSON ``text``: one
    more than its commas, colons and opening brackets (C-speed scans, no parse)."""
    return 1 + text.count(b",") + text.count(b":") + text.count(b"[") + text.count(b"{")


def check_json_size(text: bytes, stored: int, what: str) -> None:
    """Refuses, before it is parsed, a JSON that holds more values than its ``stored``
    bytes may describe (``JSON_VALUES_FLOOR + JSON_VALUES_PER_BYTE * stored``): a
    compressed JSON of constant values would otherwise parse into far more memory than
    the index occupies."""
    n, limit = json_values(text), JSON_VALUES_FLOOR + JSON_VALUES_PER_BYTE * stored
    if n > limit:
        raise bad(f"{what}: its JSON holds up to {n} values, more than its {stored} stored bytes may "
                  f"describe ({limit})")


def metadata_size_problem(metadata: Any) -> str | None:
    """Why ``metadata`` is too large to be written into (or read from) an index, or None."""
    size = len(dumps(metadata).encode("utf-8"))
    if size > MAX_METADATA_BYTES:
        return (f"metadata takes {size} bytes as JSON, more than the {MAX_METADATA_BYTES} allowed "
                "(store large values in the state itself)")
    return None


def header_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """``metadata``, ``created``, ``world_size`` and ``library`` of an index, checked."""
    metadata = raw.get("metadata", {})
    if not isinstance(metadata, dict):
        raise bad("metadata must be an object")
    problem = metadata_size_problem(metadata)
    if problem is not None:
        raise bad(problem)
    created = raw.get("created", 0.0)
    # compared, not converted: float(10**400) would raise OverflowError
    if not isinstance(created, (int, float)) or isinstance(created, bool) or not -1e300 < created < 1e300:
        raise bad("created must be a finite number")
    return {"metadata": metadata, "created": float(created),
            "world_size": check_int(raw.get("world_size", 1), "world_size", 1, 1 << 31),
            "library": str(raw.get("library", ""))}


def _check_tree_size(root: dict[str, Any]) -> None:
    """Depth, node count and total path length within limits (iterative: no recursion).

    Validation walks every leaf's key path, so its work is the sum of the node depths;
    a tree of millions of leaves hundreds of levels deep is refused here, in O(nodes).
    Nodes and their depths are kept in two lists, not as a tuple per node: pushing
    millions of new tuples would run the garbage collector over the whole parsed index
    again and again (most of the walk's time).
    """
    stack: list[Any] = [root]
    depths: list[int] = [0]
    nodes = total_depth = 0
    while stack:
        node, depth = stack.pop(), depths.pop()
        nodes += 1
        total_depth += depth
        if depth > MAX_TREE_DEPTH:
            raise bad(f"tree is deeper than {MAX_TREE_DEPTH} levels")
        if nodes > MAX_TREE_NODES:
            raise bad(f"tree has more than {MAX_TREE_NODES} nodes")
        if total_depth > MAX_MEAN_DEPTH * nodes + (1 << 16):
            raise bad(f"tree leaves lie more than {MAX_MEAN_DEPTH} levels deep on average")
        v = node.get("v") if isinstance(node, dict) else None
        if isinstance(v, list):
            children = [c for c in v if isinstance(c, dict)]
            stack += children
            depths += repeat(depth + 1, len(children))


def check_tree(node: Any, keys: Sequence[tree.KeyPath]) -> None:
    """The tree is well formed and places tensor ``i`` (key path ``keys[i]``) exactly once, at its key."""
    ids, paths = _tensor_leaves(node, len(keys))
    if not all(map(eq, map(keys.__getitem__, ids), paths)):
        i, path = next((i, p) for i, p in zip(ids, paths) if keys[i] != p)
        raise bad(f"tensor {i} is keyed {keys[i]!r} but sits at {path!r}")


def tree_keys(node: Any, count: int) -> list[tree.KeyPath]:
    """The key path of each of ``count`` tensors: where the well-formed tree places tensor
    ``i``, exactly once (index version 3 keys its tensors by the tree alone)."""
    ids, paths = _tensor_leaves(node, count)
    keys: list[Any] = [None] * count
    for i, p in zip(ids, paths):
        keys[i] = p
    return keys


def _tensor_leaves(node: Any, count: int) -> tuple[list[int], list[tree.KeyPath]]:
    """The ids and key paths of the tree's tensor nodes, checked: the tree is well formed,
    its tensor nodes name each of ``count`` tensors once, its alias nodes existing ones."""
    if not isinstance(node, dict) or node.get("t") != "dict":
        raise bad("tree root must be a dict node (a state is a mapping)")
    fast = _common_tree(node)
    if fast is not None:
        ids, paths, aliases = fast
    else:  # anything unusual: the full walk checks it (and names what is wrong)
        _check_tree_size(node)
        try:
            leaves = list(tree.walk(node))
        except (tree.TreeError, RecursionError) as e:
            raise bad(f"tree: {e}") from None
        tensor_leaves = [(n["id"], path) for path, n in leaves if n["t"] == "tensor"]
        ids, paths = [i for i, _ in tensor_leaves], [p for _, p in tensor_leaves]
        aliases = [n["id"] for _, n in leaves if n["t"] == "alias"]
    if sorted(ids) != list(range(count)):
        raise bad("tree must reference every tensor entry exactly once")
    if aliases and not 0 <= min(aliases) <= max(aliases) < count:
        raise bad("an alias node references no tensor entry")
    return ids, paths


_CONTAINERS = ("dict", "namespace", "list", "tuple")


def _common_tree(root: dict[str, Any]) -> tuple[list[int], list[tree.KeyPath], list[int]] | None:
    """``check_tree``'s walk for the trees writers produce, a container at a time: the
    tensor leaves' ids and key paths and the alias ids, checked as ``tree.walk`` and
    ``_check_tree_size`` would. None when anything is unusual (keys other than strings and
    integers, non-ASCII keys, plain values holding nodes, more than ``MAX_MEAN_DEPTH``
    levels, malformed nodes): the caller then runs the full walk, which names the problem.
    """
    ids: list[int] = []
    paths: list[tree.KeyPath] = []
    aliases: list[int] = []
    nodes = 1
    stack: list[tuple[dict[str, Any], tree.KeyPath]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        t = node.get("t")
        vals = node.get("v")
        if type(vals) is not list or len(path) >= MAX_MEAN_DEPTH:
            return None
        if t in ("dict", "namespace"):
            keys = node.get("k")
            if type(keys) is not list or len(keys) != len(vals) or node.get("ordered", True) is not True:
                return None
            kt = set(map(type, keys))
            if not (kt <= {str} if t == "namespace" else kt <= {str, int}) or len(set(keys)) != len(keys):
                return None
            if str in kt and not "".join(k for k in keys if type(k) is str).isascii():
                return None  # (non-ASCII text: the full walk checks it is valid unicode)
            subpaths = [path + (k,) for k in keys]
        elif t in ("list", "tuple"):
            subpaths = [path + (i,) for i in range(len(vals))]
        else:
            return None
        nodes += len(vals)
        for child, sub in zip(vals, subpaths):
            if type(child) is not dict:
                return None
            ct = child.get("t")
            if ct == "tensor" or ct == "alias":
                i = child.get("id")
                if type(i) is not int:
                    return None
                if ct == "tensor":
                    ids.append(i)
                    paths.append(sub)
                else:
                    aliases.append(i)
            elif ct in _CONTAINERS:
                stack.append((child, sub))
            elif isinstance(child.get("v"), list):
                return None  # a set or other value holding nodes: counted by the full walk
            else:
                try:
                    tree.decode_plain(child, validate_only=True)
                except (tree.TreeError, RecursionError):
                    return None
    return (ids, paths, aliases) if nodes <= MAX_TREE_NODES else None
