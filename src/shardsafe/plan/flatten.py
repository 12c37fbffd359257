"""Flatten a training state into a structure tree plus a list of tensor items.

Stateful objects (anything with ``state_dict()`` and ``load_state_dict()``) are replaced
by their state dict; containers become tree nodes; tensors become items. Anything that
cannot be saved safely raises ``TypeError`` naming its key path: nothing is ever pickled.
"""

from __future__ import annotations

import argparse
import math
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any, Protocol

import numpy as np

from .. import jax_values, tensors
from ..format.dtypes import DTYPES
from ..format.tree import MAX_DEPTH, KeyPath, Node, encode_key, encode_plain, render_path


class Stateful(Protocol):
    """What a Stateful object provides (modules, optimizers, schedulers, data loaders, ...)."""

    def state_dict(self) -> Mapping[Any, Any]: ...

    def load_state_dict(self, state_dict: Mapping[Any, Any], /) -> Any: ...


def is_stateful(x: Any) -> bool:
    """True for objects following the ``state_dict()`` / ``load_state_dict()`` protocol."""
    # a class has the two methods too (unbound); only instances carry state
    return (not isinstance(x, (Mapping, list, tuple, type)) and not tensors.is_tensor(x)
            and callable(getattr(x, "state_dict", None))
            and callable(getattr(x, "load_state_dict", None)))


class TensorItem:
    """A tensor of the state as this process holds it.

    Attributes:
        id: Position in the index's tensor table (and the ``id`` of its tree node).
        path: Key path in the state.
        value: The local tensor/array (for a sharded tensor: this rank's shard).
        kind: ``torch`` or ``numpy``.
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
            self._local_shape = tensors.shape_of(self._value)
        return self._local_shape

    @property
    def nbytes(self) -> int:
        if self._nbytes is None:
            self._nbytes = tensors.nbytes_of(self._value)
        return self._nbytes

    def __repr__(self) -> str:
        return (f"TensorItem(id={self.id}, path={self.path!r}, kind={self.kind!r}, dtype={self.dtype!r}, "
                f"shape={self.shape!r}, offsets={self.offsets!r}, replicated={self.replicated})")


def alias_key(x: Any) -> Hashable | None:
    """What makes two tensors the same saved tensor: one memory, one geometry, one dtype.

    Tied weights (``lm_head.weight`` and ``embed.weight``) and the separate objects a
    module's ``state_dict()`` hands out for one parameter share all of it. None for
    values never stored once for two paths: DTensors and other subclasses, empty
    tensors, and tensors without real memory.
    """
    if isinstance(x, np.ndarray):
        if x.size == 0 or type(x) is not np.ndarray:
            return None
        return ("numpy", x.__array_interface__["data"][0], x.shape, x.strides, x.dtype.str)
    if type(x) not in tensors.PLAIN_TENSOR_TYPES or x.numel() == 0 or x.is_meta:
        return None
    ptr = x.data_ptr()  # the first element's address: storage and offset in one number
    if ptr == 0:
        return None
    # a conj/neg view shares memory and geometry with its base but not its values
    device = "cpu" if x.is_cpu else str(x.device)
    return (device, ptr, x.shape, x.stride(), x.dtype, x.is_conj(), x.is_neg())


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
        self._aliases: dict[Hashable, tuple[int, Any]] = {}  # alias_key -> (item id, tensor kept alive)
        self._plain = tensors.PLAIN_TENSOR_TYPES
        self._cpu_dtypes = tensors.cpu_dtype_table()

    def node(self, x: Any, path: KeyPath) -> Node:
        if type(x) in self._plain:
            return self._torch(x, path)
        if tensors.is_tensor(x):
            return self._tensor(x, path)
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
        if jax_values.is_array(x):
            return self._jax(x, path)
        node_of = jax_values.children(x)  # a dataclass or other node registered with jax.tree_util
        if node_of is not None:
            keys, vals, _ = node_of
            return {"t": "dict", "k": [encode_key(k, path) for k in keys],
                    "v": [self.node(v, path + (k,)) for k, v in zip(keys, vals)]}
        raise TypeError(f"cannot save value of type {type(x).__module__}.{type(x).__qualname__} at "
                        f"key path {render_path(path)!r}: only tensors, arrays, containers, plain "
                        f"values and Stateful objects are saved (never pickled)")

    def _torch(self, x: Any, path: KeyPath) -> Node:
        """A plain torch tensor: the common case, decided with a handful of attribute reads.

        Dense CPU tensors of a supported dtype take this path; anything else (devices,
        nested, sparse, unsupported dtypes, meta) goes through ``_tensor``, which checks
        it fully and names the problem.
        """
        dt = self._cpu_dtypes.get(x.dtype)
        if dt is None or not x.is_cpu or x.is_nested or x.layout is not tensors.STRIDED:
            return self._tensor(x, path)
        shape = tuple(x.shape)
        n = x.numel()
        ptr = x.data_ptr() if n else 0
        key = ("cpu", ptr, x.shape, x.stride(), x.dtype, x.is_conj(), x.is_neg()) if ptr else None
        if key is not None:
            seen = self._aliases.get(key)
            if seen is not None:
                return {"t": "alias", "id": seen[0]}
            self._aliases[key] = (len(self.items), x)
        i = len(self.items)
        self.items.append(TensorItem(i, path, x, "torch", dt[0], shape, _zeros(len(shape)), True,
                                     shape, n * dt[1]))
        return {"t": "tensor", "id": i}

    def _jax(self, x: Any, path: KeyPath) -> Node:
        """A ``jax.Array``: one item of its global shape; ``plan.jax_shards`` turns it into
        the shards this process writes (the same array twice is stored once)."""
        key = ("jax", id(x))
        seen = self._aliases.get(key)
        if seen is not None:
            return {"t": "alias", "id": seen[0]}
        what = f"jax.Array at key path {render_path(path)!r}"
        dtype = jax_values.dtype_name(x.dtype, what)
        shape = tuple(x.shape)
        i = len(self.items)
        self._aliases[key] = (i, x)
        self.items.append(TensorItem(i, path, x, "jax", dtype, shape, _zeros(len(shape)), True, shape,
                                     math.prod(shape) * DTYPES[dtype].itemsize))
        return {"t": "tensor", "id": i}

    def _tensor(self, x: Any, path: KeyPath) -> Node:
        try:
            tensors.check_supported(x)
        except TypeError as e:
            raise TypeError(f"cannot save tensor at key path {render_path(path)!r}: {e}") from None
        key = alias_key(x)
        if key is not None and key in self._aliases:
            return {"t": "alias", "id": self._aliases[key][0]}
        shape = tensors.shape_of(x)
        if key is not None:
            self._aliases[key] = (len(self.items), x)
        item = TensorItem(id=len(self.items), path=path, value=x, kind=tensors.kind_of(x),
                          dtype=tensors.dtype_of(x).name, shape=shape, offsets=_zeros(len(shape)))
        self.items.append(item)
        return {"t": "tensor", "id": item.id}


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
