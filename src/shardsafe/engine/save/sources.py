"""Where the bytes of a save's items are, and the copy of one unit out of them.

A unit's bytes are copied out of training memory exactly once, by ``copy_unit``: one
``memmove`` per part, by address (it releases the GIL, so copy threads run in parallel,
and costs no Python object per tensor). CUDA items are left to ``copy_device_parts``,
which queues device-to-host copies on a side stream (``engine.cuda.DeviceCopier``).
"""

from __future__ import annotations

import ctypes

import numpy as np

from ... import values
from ...values import torch as torch_values
from ...plan.layout import FilePlan
from .. import cuda
from .units import HEADER, FileUnits


class Sources:
    """Where the bytes of each item of a plan are on the host, by address.

    ``addr[i]`` is the address of item ``i``'s row-major bytes: the tensor's own memory
    when it is a contiguous host tensor (no object is made for it), else a host copy
    kept alive here; 0 for a CUDA item, which ``copy_device_parts`` copies on a side
    stream (``device`` lists those).
    """

    def __init__(self, plan: FilePlan) -> None:
        self.addr: list[int] = []
        self.device: list[int] = []
        self._keep: dict[int, np.ndarray] = {}
        plain = torch_values.PLAIN_TENSOR_TYPES  # empty until torch is imported: no torch tensor then
        strided = torch_values.STRIDED if plain else None
        for i, it in enumerate(plan.items):
            x = it.value
            if (type(x) in plain and x.is_cpu and x.layout is strided and x.is_contiguous()
                    and not x.is_conj() and not x.is_neg()):
                self.addr.append(x.data_ptr())
            elif type(x) is np.ndarray and x.flags.c_contiguous:
                self.addr.append(x.ctypes.data)
            elif cuda.is_device_tensor(x):
                self.addr.append(0)
                self.device.append(i)
            else:
                host = self._keep[i] = values.host_bytes(x)
                self.addr.append(host.ctypes.data)


def copy_unit(units: FileUnits, k: int, sources: Sources, out: np.ndarray, base: int = 0) -> None:
    """Copies the host bytes of unit ``k`` into ``out[dst - base]`` (device parts are skipped)."""
    header = units.plan.layout.header
    parts = units.parts(k)
    addr = sources.addr
    dst0 = out.ctypes.data - base
    move = ctypes.memmove
    for item, src, dst, n in zip(*parts):
        if item == HEADER:
            out[dst - base : dst - base + n] = np.frombuffer(header, dtype=np.uint8, count=n, offset=src)
        elif addr[item]:
            move(dst0 + dst, addr[item] + src, n)


def pin_device(sources: Sources, plan: FilePlan) -> int:
    """The CUDA device whose tensors a stream with CUDA items copies into host buffers (the
    first CUDA item's): the buffers are page-locked under it."""
    return cuda.device_index(plan.items[sources.device[0]].value)


def copy_device_parts(units: FileUnits, k: int, sources: Sources, out: np.ndarray, base: int = 0,
                      fence: cuda.Fence | None = None) -> None:
    """Copies the CUDA parts of unit ``k`` into ``out[dst - base]`` and waits for them (the
    side stream first waits for ``fence``: the caller's stream at the call)."""
    if not sources.device:
        return
    copier = None
    addr = sources.addr
    for item, src, dst, n in zip(*units.parts(k)):
        if item != HEADER and addr[item] == 0:
            copier = copier or cuda.DeviceCopier(fence)
            copier.copy(units.plan.items[item].value, out[dst - base : dst - base + n], start=src)
    if copier is not None:
        copier.wait()


__all__ = ["Sources", "copy_device_parts", "copy_unit", "pin_device"]
