"""``jax.Array`` leaves, JAX pytree nodes, and the arrays a load builds for JAX's kind.

Every function here first asks whether JAX is imported at all (``sys.modules``): a
process that never imported JAX can hold no JAX value, so the torch and numpy paths pay
one dictionary lookup and ``import shardsafe`` never imports JAX.

A ``jax.Array`` is one tensor of its global shape; a save writes, per process, the
shards it addresses whose ``replica_id`` is 0 (``written_shards``: one per distinct box,
a replicated box once), as chunks of the tensor. The kind ``jax`` loads back as numpy
arrays of ml_dtypes' types (bfloat16, float8, int4...) where ml_dtypes is installed.

Key paths: a JAX pytree path maps one to one onto a shardsafe key path, and so onto
a PyTorch ``state_dict`` name (the dotted key path):

* ``DictKey(k)`` (dicts, ``FrozenDict``) -> ``k``;
* ``SequenceKey(i)`` (lists, tuples) and a NamedTuple's field -> its position ``i``
  (a NamedTuple is a tuple, saved as one, whatever framework holds it);
* ``GetAttrKey(name)`` of any other registered node (``register_dataclass``, flax
  ``struct`` dataclasses) -> ``name``;
* ``FlattenedIndexKey(i)`` (nodes registered without keys) -> ``i``.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from ..format.dtypes import DTYPES
from ..format.tree import KeyPath, render_path
from .adapter import Region, TensorRow
from .numpy import HostArrays, dtype_name


def imported() -> Any:
    """The ``jax`` module if this process has imported it, else None (never imports it)."""
    return sys.modules.get("jax")


def is_array(x: Any) -> bool:
    """True for a ``jax.Array`` (a concrete array, sharded or not)."""
    jax = imported()
    return jax is not None and isinstance(x, jax.Array)


def is_abstract(x: Any) -> bool:
    """True for a ``jax.ShapeDtypeStruct`` (Orbax's "restore into this layout")."""
    jax = imported()
    return jax is not None and isinstance(x, jax.ShapeDtypeStruct)


def key_of(entry: Any, parent: Any) -> Any:
    """The shardsafe key of one JAX key-path entry (see the module docstring)."""
    jtu = imported().tree_util
    if isinstance(entry, jtu.DictKey):
        return entry.key
    if isinstance(entry, jtu.SequenceKey):
        return entry.idx
    if isinstance(entry, jtu.GetAttrKey):
        if isinstance(parent, tuple):  # a NamedTuple field: its position
            return type(parent)._fields.index(entry.name)
        return entry.name
    if isinstance(entry, jtu.FlattenedIndexKey):
        return entry.key
    raise TypeError(f"unknown JAX key-path entry {entry!r}")


def children(x: Any) -> tuple[list[Any], list[Any], Any] | None:
    """``(keys, children, treedef)`` of a registered JAX pytree node that shardsafe does not
    already walk as a mapping, list or tuple (a dataclass, a flax struct...); None for
    anything else (JAX not imported, or ``x`` is a leaf)."""
    jax = imported()
    if jax is None or x is None:
        return None
    pairs, treedef = jax.tree_util.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
    if len(pairs) == 1 and pairs[0][0] == ():  # x itself is a leaf: not a registered node
        return None
    return [key_of(p[0], x) for p, _ in pairs], [v for _, v in pairs], treedef


def check_addressable(x: Any, what: str) -> None:
    """Raises TypeError unless this process addresses every shard of ``x``.

    An array of a multi-process ``jax.distributed`` job spans processes: it is saved by
    every process of the job together (each writes the shards it addresses), never by
    one process alone.
    """
    if not x.is_fully_addressable:
        raise TypeError(f"{what}: a jax.Array spanning several processes (jax.distributed) is saved "
                        f"by every process of the job together; this save runs in one process only")


def spans_processes(x: Any) -> bool:
    """True for a ``jax.Array`` whose shards live on devices of several processes."""
    return is_array(x) and not x.is_fully_addressable


def writes_a_shard(x: Any) -> bool:
    """Whether this process writes a shard of ``x`` (it addresses one whose ``replica_id`` is 0)."""
    return any(s.replica_id == 0 for s in x.addressable_shards)


def job_position() -> tuple[int, int]:
    """``(process index, process count)`` of this process in its JAX job."""
    jax = imported()
    return int(jax.process_index()), int(jax.process_count())


def box(index: tuple[Any, ...], shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(offsets, extent)`` of a shard's ``index`` (slices, as JAX gives them) in ``shape``."""
    starts, extents = [], []
    for sl, n in zip(index, shape):
        a, b, _ = sl.indices(n)
        starts.append(a)
        extents.append(b - a)
    return tuple(starts), tuple(extents)


def written_shards(arrays: list[Any]) -> list[list[tuple[tuple[int, ...], np.ndarray]]]:
    """Per array: ``(offsets, host array)`` of each shard this process writes, the
    addressable shards whose ``replica_id`` is 0 (one per distinct box: a replicated box
    is written once).

    The host arrays are the device-to-host copies, all started before the first is
    waited for. On the CPU backend they are views of the device buffers themselves (no
    copy): JAX arrays are immutable, and JAX does not donate a buffer that a view still
    refers to, so a view stays valid for as long as the save holds it.
    """
    shards = [[s for s in x.addressable_shards if s.replica_id == 0] for x in arrays]
    for s in (s for per in shards for s in per):
        s.data.copy_to_host_async()
    return [[(box(s.index, tuple(x.shape))[0], np.asarray(s.data)) for s in per]
            for x, per in zip(arrays, shards)]


class JaxAdapter(HostArrays):
    """``jax.Array`` leaves, and the stored kind ``jax`` (numpy arrays of ml_dtypes' types)."""

    name = "jax"

    def owns(self, x: Any) -> bool:
        return is_array(x)

    def describe(self, x: Any, path: KeyPath) -> TensorRow:
        """One item of the array's global shape (the same array twice is stored once)."""
        dtype = dtype_name(x.dtype, f"jax.Array at key path {render_path(path)!r}")
        shape = tuple(x.shape)
        return TensorRow("jax", dtype, shape, math.prod(shape) * DTYPES[dtype].itemsize, ("jax", id(x)))

    def dtype_name(self, x: Any) -> str:
        return dtype_name(x.dtype, "jax.Array")

    def shape(self, x: Any) -> tuple[int, ...]:
        return tuple(x.shape)

    def local_region(self, x: Any) -> Region | None:
        return None

    def host_bytes(self, x: Any) -> np.ndarray:
        """The whole array on the host (gathered from its shards)."""
        return np.ascontiguousarray(np.asarray(x)).reshape(-1).view(np.uint8)

    def writable_bytes(self, x: Any) -> np.ndarray | None:
        return None  # JAX arrays are immutable
