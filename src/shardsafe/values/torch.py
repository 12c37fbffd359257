"""torch tensors: what a save stores of one, and the tensors a load builds (torch is optional).

torch is imported when first needed, not with shardsafe: the command line and numpy-only
users start in a fraction of a second. ``values.torch.torch`` imports it; a leaf is asked
whether it is a tensor only once torch is imported (before that no tensor can exist).
DTensors are tensors too; their adapter (``values.dtensor``) builds on this one.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Hashable
from typing import Any

import numpy as np

from ..format.dtypes import DTYPES, DType, lookup
from ..format.tree import KeyPath, render_path
from .adapter import Region, TensorRow
from .numpy import host_dtype, host_dtype_of

HAVE_TORCH = importlib.util.find_spec("torch") is not None

_TORCH: list[Any] = []  # the module, once imported (tensor paths ask for it per tensor)


def _torch() -> Any:
    """The torch module (imported on first use), or None where it is not installed."""
    if not _TORCH:
        if not HAVE_TORCH:
            return None
        _TORCH.append(importlib.import_module("torch"))
    return _TORCH[0]


def __getattr__(name: str) -> Any:
    """``values.torch.torch``, ``STRIDED`` and ``PLAIN_TENSOR_TYPES``, which import torch."""
    if name == "torch":
        return _torch()
    if name == "STRIDED":
        return _torch().strided if HAVE_TORCH else None
    if name == "PLAIN_TENSOR_TYPES":
        return _plain_types()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_torch_tensor(x: Any) -> bool:
    t = sys.modules.get("torch")  # no tensor of torch exists before torch is imported
    return t is not None and isinstance(x, t.Tensor)


_TORCH_DTYPE_NAMES: dict[Any, str] = {}


def torch_dtype_name(dt: Any) -> str:
    """The format name of ``torch.dtype`` ``dt`` (torch's, without the ``torch.`` prefix)."""
    name = _TORCH_DTYPE_NAMES.get(dt)  # str(dtype) costs microseconds, per tensor
    if name is None:
        name = _TORCH_DTYPE_NAMES[dt] = str(dt).removeprefix("torch.")
    return name


_CPU_DTYPES: dict[Any, tuple[str, int]] = {}


def cpu_dtype_table() -> dict[Any, tuple[str, int]]:
    """``torch.dtype -> (format name, itemsize)`` of every dtype the format stores and this
    torch has (quantized dtypes are absent, so a hit also means "not quantized")."""
    if not _CPU_DTYPES and HAVE_TORCH:
        torch = _torch()
        for name in DTYPES:
            dt = getattr(torch, name, None) if DTYPES[name].torch else None
            if isinstance(dt, torch.dtype):
                _CPU_DTYPES[dt] = (name, DTYPES[name].itemsize)
    return _CPU_DTYPES


_BY_NAME: dict[str, Any] = {}


def torch_dtypes() -> dict[str, Any]:
    """Format dtype name -> ``torch.dtype`` (the inverse of ``cpu_dtype_table``)."""
    if not _BY_NAME:
        _BY_NAME.update((name, dt) for dt, (name, _) in cpu_dtype_table().items())
    return _BY_NAME


_PLAIN: list[tuple[type, ...]] = []


def _plain_types() -> tuple[type, ...]:
    """Exactly these types (not subclasses such as DTensor) have the plain shape/size
    attributes: ``torch.Tensor`` and ``torch.nn.Parameter`` once torch is imported."""
    if not _PLAIN:
        t = sys.modules.get("torch")
        if t is None:
            return ()
        _PLAIN.append((t.Tensor, t.nn.Parameter))
    return _PLAIN[0]


def is_plain(x: Any) -> bool:
    """True for a tensor of exactly ``torch.Tensor`` or ``torch.nn.Parameter``."""
    return type(x) in (_PLAIN[0] if _PLAIN else _plain_types())


def dtype_of(x: Any) -> DType:
    """The format DType of tensor ``x``.

    Raises:
        ValueError: the format has no such dtype, or only one of its name that torch
            lays out otherwise (torch's sub-byte shells ``int4``, ``uint4``).
    """
    d = lookup(torch_dtype_name(x.dtype))
    if not d.torch:  # torch's sub-byte shells (int4, uint4) have no byte layout of their own
        raise ValueError(f"torch dtype {x.dtype} is not the format's {d.name}")
    return d


def check_supported(x: Any) -> None:
    """Raises TypeError (without a key path; the caller adds it) for an unsavable tensor."""
    torch = _torch()
    if x.layout != torch.strided:
        raise TypeError(f"{x.layout} tensors are not supported (only strided/dense)")
    if x.is_quantized or x.is_nested or x.device.type == "meta":
        raise TypeError("quantized, nested and meta tensors are not supported")
    try:
        dtype_of(x)
    except ValueError:
        raise TypeError(f"dtype {x.dtype} is not supported") from None


def alias_key(x: Any) -> Hashable | None:
    """One memory, one geometry, one dtype (see ``values.alias_key``); None for subclasses
    (DTensors among them), empty tensors and tensors without real memory."""
    if type(x) not in _plain_types() or x.numel() == 0 or x.is_meta:
        return None
    ptr = x.data_ptr()  # the first element's address: storage and offset in one number
    if ptr == 0:
        return None
    # a conj/neg view shares memory and geometry with its base but not its values
    device = "cpu" if x.is_cpu else str(x.device)
    return (device, ptr, x.shape, x.stride(), x.dtype, x.is_conj(), x.is_neg())


_FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


def copy_into(target: Any, source: Any) -> None:
    """Copies ``source`` (a host tensor/array of the same shape) into tensor ``target``."""
    torch = _torch()
    src = source if is_torch_tensor(source) else torch.from_numpy(np.asarray(source))
    # an inference tensor may only be updated in place inside inference mode
    with torch.inference_mode() if target.is_inference() else torch.no_grad():
        target.copy_(src)


def as_numpy(source: Any) -> np.ndarray:
    """Host tensor ``source`` as a numpy array to copy from: one of a dtype numpy lacks
    (bfloat16, float8) as float32, which holds every value."""
    if torch_dtype_name(source.dtype) in ("bfloat16", *_FLOAT8):
        source = source.to(_torch().float32)
    return source.numpy()


class TorchAdapter:
    """``torch.Tensor`` leaves (``nn.Parameter`` and other subclasses among them); the
    stored kind ``torch`` (numpy arrays where torch is not installed)."""

    name = "torch"

    def owns(self, x: Any) -> bool:
        return is_torch_tensor(x)

    def describe(self, x: Any, path: KeyPath) -> TensorRow:
        """A dense CPU tensor of a supported dtype is decided with a handful of attribute
        reads (the common case: 20,000 small tensors cost milliseconds); anything else
        (devices, nested, sparse, unsupported dtypes, meta, subclasses) is checked fully,
        and the error names the problem."""
        dt = (_CPU_DTYPES or cpu_dtype_table()).get(x.dtype)
        if (dt is not None and type(x) in _plain_types() and x.is_cpu and not x.is_nested
                and x.layout is _torch().strided):
            shape = tuple(x.shape)
            n = x.numel()
            ptr = x.data_ptr() if n else 0
            key = ("cpu", ptr, x.shape, x.stride(), x.dtype, x.is_conj(), x.is_neg()) if ptr else None
            return TensorRow("torch", dt[0], shape, n * dt[1], key)
        try:
            check_supported(x)
        except TypeError as e:
            raise TypeError(f"cannot save tensor at key path {render_path(path)!r}: {e}") from None
        d = dtype_of(x)
        shape = self.shape(x)
        nbytes = int(x.nbytes) if is_plain(x) else math.prod(shape) * d.itemsize
        return TensorRow("torch", d.name, shape, nbytes, alias_key(x))

    def dtype_name(self, x: Any) -> str:
        return dtype_of(x).name

    def shape(self, x: Any) -> tuple[int, ...]:
        if is_plain(x):
            return tuple(x.shape)
        return tuple(int(s) for s in x.shape)

    def local_region(self, x: Any) -> Region | None:
        return None

    def host_bytes(self, x: Any) -> np.ndarray:
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
        return t.reshape(-1).view(_torch().uint8).numpy()

    def writable_bytes(self, x: Any) -> np.ndarray | None:
        if x.device.type != "cpu" or not x.is_contiguous() or x.is_conj() or x.is_neg():
            return None
        return x.detach().reshape(-1).view(_torch().uint8).numpy()

    def host_dtype(self, d: DType) -> np.dtype | None:
        return host_dtype("torch", d)

    def wraps(self, d: DType) -> bool:
        return HAVE_TORCH

    def empty(self, dtype: str, shape: tuple[int, ...]) -> tuple[Any, np.ndarray]:
        d = lookup(dtype)
        if not HAVE_TORCH:
            a = np.empty(shape, dtype=host_dtype_of("torch", d))
            return a, a.reshape(-1).view(np.uint8)
        torch = _torch()
        t = torch.empty(shape, dtype=getattr(torch, d.name))
        return t, t.reshape(-1).view(torch.uint8).numpy()

    def from_bytes(self, dtype: str, shape: tuple[int, ...], flat: np.ndarray) -> Any:
        d = lookup(dtype)
        if not HAVE_TORCH:
            return flat.view(host_dtype_of("torch", d)).reshape(shape)
        torch = _torch()
        if not flat.size:
            return torch.empty(shape, dtype=getattr(torch, d.name))
        return torch.frombuffer(flat, dtype=torch.uint8).view(getattr(torch, d.name)).reshape(shape)
