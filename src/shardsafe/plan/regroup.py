"""Regroup a checkpoint's tree to a load target's nesting when only the nesting differs.

A JAX pytree nests its names (``{"params": {"dense": {"kernel": x}}}``) where a
PyTorch ``state_dict`` keeps them flat (``{"dense.kernel": t}`` inside ``params``);
both name the array ``params.dense.kernel``. Where a target mapping has a key the
checkpoint's mapping lacks, ``regroup`` compares the two subtrees by these dotted names
(list positions count as names too): if they hold exactly the same names, the
checkpoint's subtree is rebuilt in the target's shape, its leaves unchanged (tensor
nodes keep their ids). Otherwise it is left as it is, and the load reports the missing
and unexpected keys as usual. Pure: only nodes are built; the target is only read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..values import jax as jax_values
from ..format.tree import Node, dict_items, encode_key
from .flatten import is_stateful


def _children(target: Any) -> tuple[str, list[Any], list[Any]] | None:
    """``(node type, keys, children)`` of a target container; None for a leaf."""
    if is_stateful(target):
        target = target.state_dict()
    if isinstance(target, Mapping):
        return "dict", list(target.keys()), list(target.values())
    if isinstance(target, (list, tuple)):
        return ("tuple" if isinstance(target, tuple) else "list"), list(range(len(target))), list(target)
    if jax_values.is_array(target) or jax_values.is_abstract(target):
        return None
    node_of = jax_values.children(target)
    if node_of is not None:
        return "dict", node_of[0], node_of[1]
    return None


def _node_children(node: Node) -> list[tuple[Any, Node]] | None:
    t = node.get("t")
    if t == "dict":
        return list(dict_items(node))
    if t in ("list", "tuple"):
        return list(enumerate(node["v"]))
    return None


def _names(node: Node, prefix: str, out: dict[str, Node]) -> None:
    """Every leaf of ``node`` by dotted name."""
    kids = _node_children(node)
    if kids is None or not kids:
        out[prefix] = node
        return
    for k, child in kids:
        _names(child, f"{prefix}.{k}" if prefix else str(k), out)


def _target_names(target: Any, prefix: str, out: set[str]) -> None:
    kids = _children(target)
    if kids is None or not kids[1]:
        out.add(prefix)
        return
    for k, child in zip(kids[1], kids[2]):
        _target_names(child, f"{prefix}.{k}" if prefix else str(k), out)


def _shaped(target: Any, names: dict[str, Node], prefix: str) -> Node:
    """A node of ``target``'s shape whose leaves are ``names[dotted name]``."""
    kids = _children(target)
    if kids is None or not kids[1]:
        return names[prefix]
    t, keys, vals = kids
    sub = [_shaped(v, names, f"{prefix}.{k}" if prefix else str(k)) for k, v in zip(keys, vals)]
    if t != "dict":
        return {"t": t, "v": sub}
    return {"t": t, "k": [k if type(k) in (str, int) else encode_key(k, ()) for k in keys], "v": sub}


def regroup(node: Node, target: Any) -> Node:
    """``node`` with every subtree that differs from ``target`` only in nesting rebuilt in
    ``target``'s shape (``node`` itself when nothing needs it)."""
    kids = _children(target)
    if kids is None or node.get("t") != "dict" or kids[0] != "dict":
        return _sequence(node, target, kids)
    ckpt = dict(dict_items(node))
    if all(k in ckpt for k in kids[1]):
        new = {k: regroup(ckpt[k], v) for k, v in zip(kids[1], kids[2])}
        if all(new[k] is ckpt[k] for k in new):
            return node
        return {**node, "v": [new.get(k, c) for k, c in ckpt.items()]}
    have: dict[str, Node] = {}
    _names(node, "", have)
    want: set[str] = set()
    _target_names(target, "", want)
    if set(have) != want:
        return node
    return _shaped(target, have, "")


def _sequence(node: Node, target: Any, kids: tuple[str, list[Any], list[Any]] | None) -> Node:
    if kids is None or kids[0] == "dict" or node.get("t") not in ("list", "tuple") \
            or len(node["v"]) != len(kids[2]):
        return node
    new = [regroup(c, v) for c, v in zip(node["v"], kids[2])]
    if all(a is b for a, b in zip(new, node["v"])):
        return node
    return {**node, "v": new}
