"""The planes codecs' transform as compiled code (``_planes.c``), when it is built.

``make`` compiles ``_planes.c`` (next to this module) into ``_planes.so`` with the system's C
compiler; ``codec`` then splits and joins the planes of a block in one fused pass of C
(about 2-4x faster per byte than its numpy passes, and without the GIL: ctypes releases
it for the call). Where the library is absent (no compiler, an install without ``make``),
cannot be loaded, reports another ABI number (a build of an older source) or the host is
big-endian (the stored format is little-endian), ``loaded()`` is None and ``codec`` runs
its numpy transform, which produces the same bytes.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

import numpy as np

LIBRARY = Path(__file__).with_name("_planes.so")
_ABI = 1  # must equal shardsafe_planes_abi() in _planes.c
_UNSET = object()
_lib: Any = _UNSET
_PTR = ctypes.c_void_p


def _load() -> ctypes.CDLL | None:
    if sys.byteorder != "little" or not LIBRARY.is_file():
        return None
    try:
        lib = ctypes.CDLL(str(LIBRARY))
        if lib.shardsafe_planes_abi() != _ABI:
            return None
        for k in (2, 4, 8):
            for name in (f"shardsafe_planes_split{k}", f"shardsafe_planes_join{k}"):
                fn = getattr(lib, name)
                fn.argtypes = [_PTR, ctypes.c_size_t, ctypes.c_uint8, _PTR, _PTR, _PTR, _PTR]
                fn.restype = None
    except (OSError, AttributeError):
        return None
    return lib


def loaded() -> ctypes.CDLL | None:
    """The compiled kernel, or None where ``codec`` must use numpy (loaded once)."""
    global _lib
    if _lib is _UNSET:
        _lib = _load()
    return _lib


def _address(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _mantissa(k: int, planes: dict[Any, np.ndarray]) -> Any:
    return (_PTR * (k - 1))(*[_address(planes.get(j)) for j in range(k - 1)])


def split(lib: ctypes.CDLL, k: int, x: np.ndarray, c: int, targets: dict[Any, np.ndarray]) -> None:
    """Writes the planes named in ``targets`` (codec's keys) of the elements ``x``."""
    getattr(lib, f"shardsafe_planes_split{k}")(
        x.ctypes.data, len(x), c, _address(targets.get("lo")), _address(targets.get("hi")),
        _address(targets.get("exp")), _mantissa(k, targets))


def join(lib: ctypes.CDLL, k: int, c: int, planes: dict[Any, np.ndarray], out: np.ndarray) -> None:
    """The elements ``out`` from every plane of one layout (all must be present)."""
    getattr(lib, f"shardsafe_planes_join{k}")(
        out.ctypes.data, len(out), c, _address(planes.get("lo")), _address(planes.get("hi")),
        _address(planes.get("exp")), _mantissa(k, planes))
