"""The format's dtype table (every index version names dtypes by it): name, element size,
safetensors code, numpy dtype."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class DType:
    """One element type the format can store.

    Attributes:
        name: Canonical name in the index (torch's name without the ``torch.`` prefix).
        itemsize: Bytes per element.
        safetensors: Code in a safetensors header, or None when safetensors has none
            (such chunks appear there as ``U8`` byte arrays).
        numpy: The numpy dtype string when numpy can represent it exactly, else None.
        torch: Whether torch's dtype of this name is this type (False for ml_dtypes'
            types, JAX's, whose names torch lacks or, for its sub-byte shells ``int4``
            and ``uint4``, uses without a byte layout of its own).
    """

    name: str
    itemsize: int
    safetensors: str | None
    numpy: str | None
    torch: bool = True


_TABLE = (
    DType("bool", 1, "BOOL", "bool"),
    DType("uint8", 1, "U8", "uint8"),
    DType("int8", 1, "I8", "int8"),
    DType("uint16", 2, "U16", "uint16"),
    DType("int16", 2, "I16", "int16"),
    DType("uint32", 4, "U32", "uint32"),
    DType("int32", 4, "I32", "int32"),
    DType("uint64", 8, "U64", "uint64"),
    DType("int64", 8, "I64", "int64"),
    DType("float16", 2, "F16", "float16"),
    DType("bfloat16", 2, "BF16", None),
    DType("float32", 4, "F32", "float32"),
    DType("float64", 8, "F64", "float64"),
    DType("float8_e4m3fn", 1, "F8_E4M3", None),
    DType("float8_e5m2", 1, "F8_E5M2", None),
    DType("float8_e4m3fnuz", 1, "F8_E4M3FNUZ", None),
    DType("float8_e5m2fnuz", 1, "F8_E5M2FNUZ", None),
    DType("float8_e8m0fnu", 1, None, None),
    DType("float4_e2m1fn_x2", 1, None, None),
    # JAX's (ml_dtypes') narrow types, one element per byte
    DType("float8_e3m4", 1, None, None, torch=False),
    DType("float8_e4m3", 1, None, None, torch=False),
    DType("float8_e4m3b11fnuz", 1, None, None, torch=False),
    DType("float4_e2m1fn", 1, None, None, torch=False),
    DType("int4", 1, None, None, torch=False),
    DType("uint4", 1, None, None, torch=False),
    DType("complex32", 4, None, None),
    DType("complex64", 8, "C64", "complex64"),
    DType("complex128", 16, None, "complex128"),
)

DTYPES: dict[str, DType] = {d.name: d for d in _TABLE}
_BY_NUMPY: dict[str, DType] = {d.numpy: d for d in _TABLE if d.numpy is not None}


def lookup(name: str) -> DType:
    """Returns the DType called ``name``; raises ValueError for an unknown name."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}") from None


def from_numpy(dtype: np.dtype) -> DType:
    """Maps a numpy dtype to the format's DType; raises TypeError when unsupported."""
    dt = np.dtype(dtype)
    d = _BY_NUMPY.get(dt.name)
    if d is None or dt.byteorder == ">":
        raise TypeError(f"numpy dtype {dt!s} is not supported")
    return d
