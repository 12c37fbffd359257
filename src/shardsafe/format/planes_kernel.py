"""The planes codecs' transform as compiled code (the extension ``format._planes``), when built.

The package build (``pip install``, ``pip wheel``, ``make``; setup.py) compiles
``_planes.c`` into the extension module ``shardsafe.format._planes``; ``codec`` then splits
and joins the planes of a block in one fused pass of C (about 2-4x faster per byte than
its numpy passes, and without the GIL). Its functions take buffers (numpy arrays,
memoryviews) and check every length before writing. Where the module is absent (no C
compiler where the package was built) or the host is big-endian (the stored format is
little-endian), ``loaded()`` is None and ``codec`` runs its numpy transform, which
produces the same bytes. ``describe()`` says which one runs (``shardsafe --version``
prints it), and the first use logs it at debug level.
"""

from __future__ import annotations

import importlib
import logging
import sys
from types import ModuleType
from typing import Any

import numpy as np

log = logging.getLogger("shardsafe")
_UNSET = object()
_kernel: Any = _UNSET


def _load() -> ModuleType | None:
    if sys.byteorder != "little":
        log.debug("planes transform: numpy (a big-endian host; the compiled kernel is little-endian)")
        return None
    try:
        kernel = importlib.import_module(f"{__package__}._planes")
    except ImportError as e:
        log.debug("planes transform: numpy (the compiled kernel is not built: %s)", e)
        return None
    log.debug("planes transform: compiled kernel %s", kernel.__file__)
    return kernel


def loaded() -> ModuleType | None:
    """The compiled kernel, or None where ``codec`` must use numpy (loaded once)."""
    global _kernel
    if _kernel is _UNSET:
        _kernel = _load()
    return _kernel


def describe() -> str:
    """Which planes transform ``compression="auto"`` runs here, in words."""
    return "compiled kernel" if loaded() is not None else "numpy (the compiled kernel is not built)"


def _mantissas(k: int, planes: dict[Any, np.ndarray]) -> tuple[np.ndarray | None, ...]:
    return tuple(planes.get(j) for j in range(k - 1))


def split(kernel: ModuleType, k: int, x: np.ndarray, c: int, targets: dict[Any, np.ndarray]) -> None:
    """Writes the planes named in ``targets`` (codec's keys) of the elements ``x``."""
    kernel.split(k, x, c, targets.get("lo"), targets.get("hi"), targets.get("exp"), _mantissas(k, targets))


def join(kernel: ModuleType, k: int, c: int, planes: dict[Any, np.ndarray], out: np.ndarray) -> None:
    """The elements ``out`` from every plane of one layout (all must be present)."""
    kernel.join(k, out, c, planes.get("lo"), planes.get("hi"), planes.get("exp"), _mantissas(k, planes))
