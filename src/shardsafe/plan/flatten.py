"""Flatten a training state into a structure tree plus a list of tensor items.

Stateful objects (anything with ``state_dict()`` and ``load_state_dict()``) are replaced
by their state dict; containers become tree nodes; tensors become items. Each leaf is
asked once which kind of tensor it is (``values.adapter_for``): that adapter describes
it (dtype, shape, what makes two leaves one tensor); a leaf of no kind is a plain value
or a container. Anything that cannot be saved safely raises ``TypeError`` naming its
key path: nothing is ever pickled.
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any, Protocol

from .. import values
from ..format.tree import MAX_DEPTH, KeyPath, Node, encode_key, encode_plain, render_path
from ..values import jax as jax_values
from ..values.adapter import ValueAdapter


class Stateful(Protocol):
    """What a Stateful object provides (modules, optimizers, schedulers, data loaders, ...)."""

    def state_dict(self) -> Mapping[Any, Any]: ...

    def load_state_dict(self, state_dict: Mapping[Any, Any], /) -> Any: ...


def is_stateful(x: Any) -> bool:
    """True for objects following the ``state_dict()`` / ``load_state_dict()`` protocol."""
    # a class has the two methods too (unbound); only instances carry state
    return (not isinstance(x, (Mapping, list, tuple, type)) and not values.is_tensor(x)
            and callable(getattr(x, "state_dict", None))
            and callable(getattr(x, "load_state_dict", None)))


class TensorItem:
    """A tensor of the state as this process holds it.

    Attributes:
        id: Position in the index's tensor table (and the ``id`` of its tree node).
        path: Key path in the state.
        value: The local tensor/array (for a sharded tensor: this rank's shard).
        kind: The stored kind (``torch``, ``numpy`` or ``jax``).
        dtype: Format dtype name.
        shape: Global shape.
        offsets: Position of ``value`` in the global tensor (zeros when not sharded).
        replicated: True when every rank holds the same value (written once overall).

    ``local_shape`` and ``nbytes`` describe ``value``; they are computed once (the
    planner, the writers and the index builder each ask, per tensor) and recomputed
    when ``value`` is replaced (a DTensor by its local shard).
    """

    __slots__ = ("id", "path", "_value", "kind", "dtype", "shape", "offsets", "replicated",
                 "_local_shape", "_nbytes")

    def __init__(self, id: int, path: KeyPath, value: Any, kind: str, dtype: str,  # noqa: A002
                 shape: tuple[int, ...], offsets: tuple[int, ...], replicated: bool = True,
                 local_shape: tuple[int, ...] | None = None, nbytes: int | None = None) -> None:
        self.id = id
        self.path = path
        self._value = value
        self.kind = kind
        self.dtype = dtype
        self.shape = shape
        self.offsets = offsets
        self.replicated = replicated
        self._local_shape = local_shape
        self._nbytes = nbytes

    @property
    def value(self) -> Any:
        return self._value

    @value.setter
    def value(self, v: Any) -> None:
        self._value = v
        self._local_shape = self._nbytes = None

    @property
    def local_shape(self) -> tuple[int, ...]:
        if self._local_shape is None:
            self._local_shape = values.shape_of(self._value)
        return self._local_shape

    @property
    def nbytes(self) -> int:
        if self._nbytes is None:
            self._nbytes = values.nbytes_of(self._value)
        return self._nbytes

    def __repr__(self) -> str:
        return (f"TensorItem(id={self.id}, path={self.path!r}, kind={self.kind!r}, dtype={self.dtype!r}, "
                f"shape={self.shape!r}, offsets={self.offsets!r}, replicated={self.replicated})")


def _zeros(ndim: int, _cache: dict[int, tuple[int, ...]] = {}) -> tuple[int, ...]:  # noqa: B006
    """``(0,) * ndim``, one shared tuple per rank (every unsharded item's offsets)."""
    z = _cache.get(ndim)
    if z is None:
        z = _cache[ndim] = (0,) * ndim
    return z


class _Flattener:
    def __init__(self) -> None:
        self.items: list[TensorItem] = []
        self._active: set[int] = set()  # containers on the current path (cycle detection)
        self._aliases: dict[Hashable, tuple[int, Any]] = {}  # alias key -> (item id, tensor kept alive)

    def node(self, x: Any, path: KeyPath) -> Node:
        adapter = values.adapter_for(x)
        if adapter is not None:
            return self._leaf(adapter, x, path)
        plain = encode_plain(x, path)
        if plain is not None:
            return plain
        if len(path) >= MAX_DEPTH:  # decode refuses deeper trees: never write one it can't read
            raise TypeError(f"state is nested deeper than {MAX_DEPTH} levels at key path "
                            f"{render_path(path)!r}")
        if id(x) in self._active:
            raise TypeError(f"cycle in state at key path {render_path(path)!r}")
        self._active.add(id(x))
        try:
            return self._container(x, path)
        finally:
            self._active.discard(id(x))

    def _container(self, x: Any, path: KeyPath) -> Node:
        if isinstance(x, Mapping):
            keys, vals = [], []
            node_of = self.node
            for k, v in x.items():
                keys.append(k if type(k) is str and k.isascii() else encode_key(k, path))
                vals.append(node_of(v, path + (k,)))
            node: Node = {"t": "dict", "k": keys, "v": vals}
            if isinstance(x, OrderedDict):
                node["ordered"] = True
            return node
        if type(x) is argparse.Namespace:
            names = list(vars(x))
            return {"t": "namespace", "k": [encode_key(k, path) for k in names],
                    "v": [self.node(getattr(x, k), path + (k,)) for k in names]}
        if isinstance(x, (list, tuple)):
            return {"t": "tuple" if isinstance(x, tuple) else "list",
                    "v": [self.node(v, path + (i,)) for i, v in enumerate(x)]}
        if is_stateful(x):
            sd = x.state_dict()
            if not isinstance(sd, Mapping):
                raise TypeError(f"{type(x).__name__}.state_dict() at key path {render_path(path)!r} "
                                f"returned {type(sd).__name__}, not a mapping")
            node = self._container(sd, path)
            node["cls"] = f"{type(x).__module__}.{type(x).__qualname__}"
            return node
        node_of = jax_values.children(x)  # a dataclass or other node registered with jax.tree_util
        if node_of is not None:
            keys, vals, _ = node_of
            return {"t": "dict", "k": [encode_key(k, path) for k in keys],
                    "v": [self.node(v, path + (k,)) for k, v in zip(keys, vals)]}
        raise TypeError(f"cannot save value of type {type(x).__module__}.{type(x).__qualname__} at "
                        f"key path {render_path(path)!r}: only tensors, arrays, containers, plain "
                        f"values and Stateful objects are saved (never pickled)")

    def _leaf(self, adapter: ValueAdapter, x: Any, path: KeyPath) -> Node:
        """A tensor item of what ``adapter`` says of ``x``, or an alias of the item of the
        very same tensor met earlier (stored once)."""
        leaf = adapter.describe(x, path)
        key = leaf.alias
        i = len(self.items)
        if key is not None:
            seen = self._aliases.get(key)
            if seen is not None:
                return {"t": "alias", "id": seen[0]}
            self._aliases[key] = (i, x)
        shape = leaf.shape
        self.items.append(TensorItem(i, path, x, leaf.kind, leaf.dtype, shape, _zeros(len(shape)), True,
                                     shape, leaf.nbytes))
        return {"t": "tensor", "id": i}


def flatten(state: Mapping[str, Any] | Stateful) -> tuple[Node, list[TensorItem]]:
    """Returns the structure tree of ``state`` and its tensor items (in tree order).

    A single Stateful object is saved as its state dict, exactly as it would be inside
    a mapping, so its checkpoint's root holds the state dict's keys.

    Raises:
        TypeError: ``state`` is neither a mapping nor a Stateful object whose
            ``state_dict()`` is a mapping, or holds a value that cannot be saved safely
            (the message names the key path).
    """
    if not isinstance(state, Mapping) and not is_stateful(state):
        raise TypeError(f"state must be a mapping (dict) or a Stateful object (with state_dict() "
                        f"and load_state_dict()), got {type(state).__name__}")
    f = _Flattener()
    root = f.node(state, ())
    return root, f.items
