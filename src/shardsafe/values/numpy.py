"""numpy arrays: what a save stores of one, and the arrays a load builds.

An array of one of ml_dtypes' types (bfloat16, float8, int4..., numpy "void" kinds with
names of their own: JAX's dtypes) is stored under the kind ``jax`` and loads back as
one where ml_dtypes is installed (``values.jax``); every other array under ``numpy``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from ..format.dtypes import DType, from_numpy, lookup
from ..format.tree import KeyPath, render_path
from .adapter import Region, TensorRow


def dtype_name(dtype: Any, what: str) -> str:
    """The format name of a numpy (or JAX, ml_dtypes) dtype (``bfloat16``, ``float8_e4m3fn``,
    ``int4``...).

    Raises:
        TypeError: the format has no such dtype (``what`` names the value).
    """
    name = np.dtype(dtype).name
    try:
        lookup(name)
    except ValueError:
        raise TypeError(f"{what}: dtype {name} is not supported by the checkpoint format") from None
    return name


def numpy_dtype(name: str) -> np.dtype | None:
    """The numpy dtype of format dtype ``name``, with ml_dtypes' extension types (bfloat16,
    float8, int4, ...) where ml_dtypes is installed (JAX depends on it); None if neither has it."""
    d = lookup(name)
    if d.numpy is not None:
        return np.dtype(d.numpy)
    try:
        import ml_dtypes
    except ImportError:
        return None
    t = getattr(ml_dtypes, name, None)
    return np.dtype(t) if t is not None else None


def host_dtype(kind: str, d: DType) -> np.dtype | None:
    """The numpy dtype of a loaded ``kind`` array of ``d`` (None: numpy cannot hold it).
    Arrays saved from JAX get ml_dtypes' types (bfloat16, float8, int4...) where installed."""
    if kind == "jax":
        return numpy_dtype(d.name)
    return np.dtype(d.numpy) if d.numpy else None


def host_dtype_of(kind: str, d: DType) -> np.dtype:
    """``host_dtype``, for an array that must be built.

    Raises:
        TypeError: numpy cannot represent ``d`` (the message says what could).
    """
    nd = host_dtype(kind, d)
    if nd is None:
        raise TypeError(f"dtype {d.name} needs {'ml_dtypes' if kind == 'jax' else 'torch'} to be loaded "
                        f"(numpy cannot represent it)")
    return nd


def dtype_of(x: np.ndarray) -> DType:
    """The format DType of array ``x``; TypeError if the format has none."""
    if x.dtype.kind == "V":  # ml_dtypes' types are numpy "void" kinds with their own names
        return lookup(dtype_name(x.dtype, "numpy array"))
    return from_numpy(x.dtype)


def check_supported(x: np.ndarray) -> None:
    """Raises TypeError (without a key path; the caller adds it) for an unsavable array."""
    if type(x) is not np.ndarray and not isinstance(x, np.memmap):
        # a masked array would lose its mask, a matrix its type: never silently
        raise TypeError(f"numpy array subclass {type(x).__name__} cannot be saved as is; "
                        f"pass np.asarray(x) (and the mask separately) if that is what you want")
    if x.dtype.hasobject:
        raise TypeError("numpy object arrays cannot be saved safely")
    try:
        dtype_of(x)
    except TypeError as e:
        raise TypeError(str(e)) from None


def alias_key(x: np.ndarray) -> Hashable | None:
    """One memory, one geometry, one dtype; None for empty arrays and subclasses."""
    if x.size == 0 or type(x) is not np.ndarray:
        return None
    return ("numpy", x.__array_interface__["data"][0], x.shape, x.strides, x.dtype.str)


class HostArrays:
    """The values a load builds as numpy arrays, for the tensors stored under ``name``."""

    name: str

    def host_dtype(self, d: DType) -> np.dtype | None:
        return host_dtype(self.name, d)

    def wraps(self, d: DType) -> bool:
        return self.host_dtype(d) is not None

    def empty(self, dtype: str, shape: tuple[int, ...]) -> tuple[Any, np.ndarray]:
        a = np.empty(shape, dtype=host_dtype_of(self.name, lookup(dtype)))
        return a, a.reshape(-1).view(np.uint8)

    def from_bytes(self, dtype: str, shape: tuple[int, ...], flat: np.ndarray) -> Any:
        return flat.view(host_dtype_of(self.name, lookup(dtype))).reshape(shape)


class NumpyAdapter(HostArrays):
    """``numpy.ndarray`` leaves, and the stored kind ``numpy``."""

    name = "numpy"

    def owns(self, x: Any) -> bool:
        return isinstance(x, np.ndarray)

    def describe(self, x: Any, path: KeyPath) -> TensorRow:
        try:
            check_supported(x)
        except TypeError as e:
            raise TypeError(f"cannot save tensor at key path {render_path(path)!r}: {e}") from None
        return TensorRow("jax" if x.dtype.kind == "V" else "numpy", dtype_of(x).name, tuple(x.shape),
                    int(x.nbytes), alias_key(x))

    def dtype_name(self, x: Any) -> str:
        return dtype_of(x).name

    def shape(self, x: Any) -> tuple[int, ...]:
        return tuple(x.shape)

    def local_region(self, x: Any) -> Region | None:
        return None

    def host_bytes(self, x: Any) -> np.ndarray:
        return np.ascontiguousarray(x).reshape(-1).view(np.uint8)

    def writable_bytes(self, x: Any) -> np.ndarray | None:
        if x.flags.c_contiguous and x.flags.writeable:
            return x.reshape(-1).view(np.uint8)
        return None
