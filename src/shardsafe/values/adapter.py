"""The two seams every kind of tensor value plugs into: what a save asks of a leaf, and
what a load asks of a stored tensor's kind.

A ``ValueAdapter`` answers for the leaves of one kind (torch tensors, numpy arrays,
``jax.Array``, DTensors): whether a leaf is its own, what the checkpoint stores of it
(``describe``), where the memory this process holds sits in the whole
(``local_region``), and its bytes. A ``StoredKind`` builds the values a load returns for
the tensors saved under its name (the index's ``kind``: ``torch``, ``numpy``, ``jax``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, NamedTuple, Protocol

import numpy as np

from ..format.dtypes import DType
from ..format.tree import KeyPath

Region = tuple[Any, tuple[int, ...], tuple[int, ...]]
"""``(memory, offsets, shape)``: what a process holds of a tensor, and where it sits."""


class TensorRow(NamedTuple):
    """What a save stores of one leaf (its tensor-table row), as its adapter describes it.

    Attributes:
        kind: The stored kind a load builds it back as (``torch``, ``numpy``, ``jax``).
        dtype: The format dtype name.
        shape: The global shape.
        nbytes: Bytes of the value as this process holds it.
        alias: What makes two leaves one saved tensor (tied weights); None: never shared.
    """

    kind: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    alias: Hashable | None


class ValueAdapter(Protocol):
    """One kind of tensor value a state may hold (see the module docstring)."""

    name: str
    """The adapter's own name (``torch``, ``numpy``, ``jax``, ``dtensor``)."""

    def owns(self, x: Any) -> bool:
        """Whether ``x`` is a value of this kind (never imports a framework)."""
        ...

    def describe(self, x: Any, path: KeyPath) -> TensorRow:
        """What a save stores of ``x``, the leaf at ``path``.

        Raises:
            TypeError: ``x`` cannot be saved (the message names ``path``).
        """
        ...

    def dtype_name(self, x: Any) -> str:
        """The format dtype name of ``x``.

        Raises:
            TypeError, ValueError: the format has no such dtype.
        """
        ...

    def shape(self, x: Any) -> tuple[int, ...]:
        """The global shape of ``x``."""
        ...

    def local_region(self, x: Any) -> Region | None:
        """The memory this process holds of a sharded value and where it sits in the
        whole (a DTensor: its local tensor and box); None for a value held whole."""
        ...

    def host_bytes(self, x: Any) -> np.ndarray:
        """A flat uint8 view of ``x``'s bytes in row-major order, on the host (copies only
        what must be copied: a device tensor, a non-contiguous one)."""
        ...

    def writable_bytes(self, x: Any) -> np.ndarray | None:
        """A flat uint8 view of ``x``'s own memory that a load may write in place; None
        when there is none (device memory, strided, read-only, immutable)."""
        ...


class StoredKind(Protocol):
    """What a load builds for a tensor stored under one kind name."""

    name: str
    """The index's ``kind`` of the tensors it builds."""

    def host_dtype(self, d: DType) -> np.dtype | None:
        """The numpy dtype of a loaded array of ``d`` (None: numpy cannot hold it)."""
        ...

    def wraps(self, d: DType) -> bool:
        """Whether a value of ``d`` can be built over memory the caller provides."""
        ...

    def empty(self, dtype: str, shape: tuple[int, ...]) -> tuple[Any, np.ndarray]:
        """A new host value and a writable flat uint8 view of its bytes."""
        ...

    def from_bytes(self, dtype: str, shape: tuple[int, ...], flat: np.ndarray) -> Any:
        """The bytes ``flat`` (uint8, exactly the value's) as a host value, without a copy."""
        ...
