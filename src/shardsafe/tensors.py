"""What counts as a tensor, and raw byte views of tensors (torch is optional).

Everything that touches ``torch`` for plain tensors lives here, so the rest of the
package works with numpy alone. DTensor support lives in ``shardsafe.dtensor``, JAX
support in ``shardsafe.jax_values`` (a ``jax.Array`` is not a tensor here: flatten
makes an item of it, and ``host_bytes`` reads it whole).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from typing import Any

import numpy as np

from . import jax_values
from .format.dtypes import DTYPES, DType, from_numpy, lookup

# torch is imported when first needed, not with shardsafe: the command line and
# numpy-only users start in a fraction of a second. ``tensors.torch`` imports it.
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
    """``tensors.torch``, ``STRIDED`` and ``PLAIN_TENSOR_TYPES``, which import torch."""
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


def is_tensor(x: Any) -> bool:
    """True for torch tensors and numpy arrays (numpy scalars are plain values)."""
    return isinstance(x, np.ndarray) or is_torch_tensor(x)


def kind_of(x: Any) -> str:
    """``torch``, ``numpy``, or ``jax`` for a numpy array of an ml_dtypes type (bfloat16,
    float8, int4...), which loads back as one only where ml_dtypes is installed."""
    if isinstance(x, np.ndarray):
        return "jax" if x.dtype.kind == "V" else "numpy"
    return "torch"


_TORCH_DTYPE_NAMES: dict[Any, str] = {}


def torch_dtype_name(dt: Any) -> str:
    name = _TORCH_DTYPE_NAMES.get(dt)  # str(dtype) costs microseconds, per tensor
    if name is None:
        name = _TORCH_DTYPE_NAMES[dt] = str(dt).removeprefix("torch.")
    return name


def dtype_of(x: Any) -> DType:
    """The format DType of a tensor or array; TypeError if unsupported."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind == "V":  # ml_dtypes' types are numpy "void" kinds with their own names
            return lookup(jax_values.dtype_name(x.dtype, "numpy array"))
        return from_numpy(x.dtype)
    d = lookup(torch_dtype_name(x.dtype))
    if not d.torch:  # torch's sub-byte shells (int4, uint4) have no byte layout of their own
        raise ValueError(f"torch dtype {x.dtype} is not the format's {d.name}")
    return d


def check_supported(x: Any) -> None:
    """Raises TypeError (without a key path; the caller adds it) for unsavable tensors."""
    if isinstance(x, np.ndarray):
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
        return
    torch = _torch()
    if x.layout != torch.strided:
        raise TypeError(f"{x.layout} tensors are not supported (only strided/dense)")
    if x.is_quantized or x.is_nested or x.device.type == "meta":
        raise TypeError("quantized, nested and meta tensors are not supported")
    try:
        dtype_of(x)
    except ValueError:
        raise TypeError(f"dtype {x.dtype} is not supported") from None


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
    """True for host-layout tensors/arrays whose ``shape``/``nbytes`` can be read directly."""
    return type(x) in (_PLAIN[0] if _PLAIN else _plain_types()) or isinstance(x, np.ndarray)


def shape_of(x: Any) -> tuple[int, ...]:
    if is_plain(x):  # the fast path: 20,000 small tensors cost milliseconds, not a second
        return tuple(x.shape)
    return tuple(int(s) for s in x.shape)


def nbytes_of(x: Any) -> int:
    if is_plain(x):
        return int(x.nbytes)
    return math.prod(shape_of(x)) * dtype_of(x).itemsize


def host_bytes(x: Any) -> np.ndarray:
    """A flat uint8 view of the tensor's bytes in row-major order, on the host.

    Copies only when needed (device tensors, non-contiguous tensors).
    """
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    if jax_values.is_array(x):
        return np.ascontiguousarray(jax_values.host_array(x)).reshape(-1).view(np.uint8)
    t = x.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t.reshape(-1).view(_torch().uint8).numpy()


def writable_bytes(x: Any) -> np.ndarray | None:
    """A flat uint8 view of a tensor's own memory that can be written in place.

    None when the tensor is not a contiguous host tensor (the caller then reads into a
    temporary buffer and copies).
    """
    if isinstance(x, np.ndarray):
        if x.flags.c_contiguous and x.flags.writeable:
            return x.reshape(-1).view(np.uint8)
        return None
    if not is_torch_tensor(x) or x.device.type != "cpu" or not x.is_contiguous():
        return None
    if x.is_conj() or x.is_neg():
        return None
    return x.detach().reshape(-1).view(_torch().uint8).numpy()


def host_dtype(kind: str, d: DType) -> np.dtype | None:
    """The numpy dtype of a loaded ``kind`` array of ``d`` (None: numpy cannot hold it).
    Arrays saved from JAX get ml_dtypes' types (bfloat16, float8, int4...) where installed."""
    if kind == "jax":
        return jax_values.numpy_dtype(d.name)
    return np.dtype(d.numpy) if d.numpy else None


def empty(kind: str, dtype: str, shape: tuple[int, ...]) -> tuple[Any, np.ndarray]:
    """Allocates a new host tensor and returns ``(tensor, writable byte view)``."""
    d = lookup(dtype)
    if kind == "torch" and HAVE_TORCH:
        torch = _torch()
        t = torch.empty(shape, dtype=getattr(torch, d.name))
        return t, t.reshape(-1).view(torch.uint8).numpy()
    a = np.empty(shape, dtype=_numpy_dtype(kind, d))
    return a, a.reshape(-1).view(np.uint8)


def from_bytes(kind: str, dtype: str, shape: tuple[int, ...], flat: np.ndarray) -> Any:
    """The bytes ``flat`` (uint8, exactly the tensor's) as a host tensor of ``kind``,
    ``dtype`` and ``shape``, without a copy."""
    d = lookup(dtype)
    if kind == "torch" and HAVE_TORCH:
        torch = _torch()
        if not flat.size:
            return torch.empty(shape, dtype=getattr(torch, d.name))
        return torch.frombuffer(flat, dtype=torch.uint8).view(getattr(torch, d.name)).reshape(shape)
    return flat.view(_numpy_dtype(kind, d)).reshape(shape)


def _numpy_dtype(kind: str, d: DType) -> np.dtype:
    nd = host_dtype(kind, d)
    if nd is None:
        raise TypeError(f"dtype {d.name} needs {'ml_dtypes' if kind == 'jax' else 'torch'} to be loaded "
                        f"(numpy cannot represent it)")
    return nd


_FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


def copy_into(target: Any, source: Any) -> None:
    """Copies ``source`` (a host tensor/array of the same shape) into ``target``, converting
    a floating-point dtype that differs (``load(..., cast=True)``)."""
    torch = _torch()
    if isinstance(target, np.ndarray):
        if is_torch_tensor(source) and torch_dtype_name(source.dtype) in ("bfloat16", *_FLOAT8):
            source = source.to(torch.float32)  # numpy has no such dtype; float32 holds every value
        np.copyto(target, source if isinstance(source, np.ndarray) else source.numpy())
        return
    src = source if is_torch_tensor(source) else torch.from_numpy(np.asarray(source))
    # an inference tensor may only be updated in place inside inference mode
    with torch.inference_mode() if target.is_inference() else torch.no_grad():
        target.copy_(src)
