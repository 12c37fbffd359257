"""What a value of a state is: one adapter per kind of tensor (torch, numpy, JAX, DTensor).

A save's walk (``plan.flatten``) asks ``adapter_for`` once per leaf: a leaf some adapter
owns is a tensor item, described by that adapter (``ValueAdapter.describe``); any other
leaf goes to the value path (plain values, containers, Stateful objects). A load asks
the same adapters about its targets (dtype, shape, where a DTensor's box sits, memory it
may write) and builds new values through the stored kind of each tensor
(``stored_kind``: ``torch``, ``numpy``, ``jax``, the index's ``kind``).

Nothing here imports a framework: torch is imported when a torch value is built, and
JAX, DTensors and torch tensors are recognised only once their modules are imported (no
value of theirs exists before). The on-disk dtype table is the format's
(``format.dtypes``). A new kind of value is a module here with an adapter, registered in
``ADAPTERS`` (and, if a load builds it back, in ``_STORED``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import numpy as np

from ..format import dtypes
from . import dtensor, jax, numpy, torch as torch_values
from .adapter import Region as _Region, StoredKind, TensorRow, ValueAdapter

_DTENSOR, _TORCH = dtensor.DTensorAdapter(), torch_values.TorchAdapter()
_NUMPY, _JAX = numpy.NumpyAdapter(), jax.JaxAdapter()

ADAPTERS: tuple[ValueAdapter, ...] = (_DTENSOR, _TORCH, _NUMPY, _JAX)
"""Asked in this order (a DTensor is a torch tensor too)."""

_STORED: dict[str, StoredKind] = {"torch": _TORCH, "numpy": _NUMPY, "jax": _JAX}
_BY_TYPE: dict[type, ValueAdapter] = {}  # a leaf's type -> its adapter, once asked
_NOT_TENSORS = frozenset({dict, list, tuple, str, int, float, bool, bytes, type(None)})


def adapter_for(x: Any) -> ValueAdapter | None:
    """The adapter of ``x``'s kind, or None for anything that is not a tensor of a kind
    shardsafe knows (a plain value, a container, a Stateful object, a JAX pytree node).

    Which adapter owns a value depends on its type alone, so the answer is kept per type:
    the adapters are asked about each type of tensor once, however many tensors a state
    holds; builtin containers and plain values are answered without asking them.
    """
    t = type(x)
    adapter = _BY_TYPE.get(t)
    if adapter is not None or t in _NOT_TENSORS:
        return adapter
    for adapter in ADAPTERS:
        if adapter.owns(x):
            _BY_TYPE[t] = adapter
            return adapter
    return None


def stored_kind(kind: str) -> StoredKind:
    """What builds the values of the tensors stored under ``kind`` (the index's)."""
    return _STORED[kind]


def is_tensor(x: Any) -> bool:
    """True for torch tensors and numpy arrays (numpy scalars are plain values; a
    ``jax.Array`` is a leaf of its own, not a tensor a load writes into)."""
    return isinstance(x, np.ndarray) or torch_values.is_torch_tensor(x)


def shape_of(x: Any) -> tuple[int, ...]:
    """The shape of a tensor or array (a DTensor's: the global one)."""
    if torch_values.is_plain(x) or isinstance(x, np.ndarray):  # 20,000 small tensors: milliseconds
        return tuple(x.shape)
    return tuple(int(s) for s in x.shape)


def nbytes_of(x: Any) -> int:
    """Bytes of a tensor or array (a DTensor's: of the global tensor)."""
    if torch_values.is_plain(x) or isinstance(x, np.ndarray):
        return int(x.nbytes)
    return math.prod(shape_of(x)) * dtypes.lookup(_adapter(x).dtype_name(x)).itemsize


def _adapter(x: Any) -> ValueAdapter:
    adapter = adapter_for(x)
    if adapter is None:
        raise TypeError(f"{type(x).__module__}.{type(x).__qualname__} is not a tensor")
    return adapter


def alias_key(x: Any) -> Hashable | None:
    """What makes two tensors the same saved tensor: one memory, one geometry, one dtype.

    Tied weights (``lm_head.weight`` and ``embed.weight``) and the separate objects a
    module's ``state_dict()`` hands out for one parameter share all of it. None for
    values never stored once for two paths: DTensors and other subclasses, empty
    tensors, and tensors without real memory.
    """
    if isinstance(x, np.ndarray):
        return numpy.alias_key(x)
    return torch_values.alias_key(x)


def host_bytes(x: Any) -> np.ndarray:
    """A flat uint8 view of a value's bytes in row-major order, on the host (copies only
    when needed: device tensors, non-contiguous tensors, a ``jax.Array``'s shards)."""
    return _adapter(x).host_bytes(x)


def writable_bytes(x: Any) -> np.ndarray | None:
    """A flat uint8 view of a tensor's own memory that a load may write in place; None
    when there is none (the caller then reads into a temporary buffer and copies)."""
    adapter = adapter_for(x)
    return adapter.writable_bytes(x) if adapter is not None else None


def target_region(x: Any) -> _Region:
    """Where a load target's memory sits in the global tensor: ``(tensor, offsets, shape)``.

    For a DTensor: its local tensor and box (so a rank reads only its own region); for
    anything else: the tensor itself, covering the whole.
    """
    region = local_region(x)
    if region is not None:
        return region
    shape = tuple(int(s) for s in x.shape)
    return x, (0,) * len(shape), shape


def local_region(x: Any) -> _Region | None:
    """A sharded target's local memory and box (a DTensor's); None for a whole one."""
    adapter = adapter_for(x)
    return adapter.local_region(x) if adapter is not None else None


def copy_into(target: Any, source: Any) -> None:
    """Copies ``source`` (a host tensor/array of the same shape) into ``target``, converting
    a floating-point dtype that differs (``load(..., cast=True)``)."""
    if isinstance(target, np.ndarray):
        np.copyto(target, source if isinstance(source, np.ndarray) else torch_values.as_numpy(source))
        return
    torch_values.copy_into(target, source)


__all__ = ["ADAPTERS", "StoredKind", "TensorRow", "ValueAdapter", "adapter_for", "alias_key", "copy_into",
           "host_bytes", "is_tensor", "local_region", "nbytes_of", "shape_of", "stored_kind", "target_region",
           "writable_bytes"]
