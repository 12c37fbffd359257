"""CUDA staging: page-locked host buffers and device-to-host copies on a side stream.

Everything here is a no-op or raises a clear error without CUDA; the module imports on
CPU-only machines (and without torch). The copies run on a dedicated stream that first
waits for the caller's current stream, so kernels already queued (the last optimizer
step) finish before their outputs are read; an event recorded after the copies is
what ``DeviceCopier.wait()`` synchronises on.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .. import tensors

log = logging.getLogger("shardsafe")


def available() -> bool:
    """True when torch sees at least one CUDA device."""
    return tensors.HAVE_TORCH and tensors.torch.cuda.is_available()


def is_device_tensor(x: Any) -> bool:
    """True for torch tensors that live on a CUDA device."""
    return tensors.is_torch_tensor(x) and x.device.type == "cuda"


def pin(array: np.ndarray) -> bool:
    """Page-locks ``array``'s memory for asynchronous copies; False if CUDA refuses."""
    if not available() or array.size == 0:
        return False
    torch = tensors.torch
    err = torch.cuda.cudart().cudaHostRegister(int(array.ctypes.data), int(array.nbytes), 0)
    if int(getattr(err, "value", err)) != 0:
        log.warning("cudaHostRegister of %d bytes failed (%s); staging uses pageable memory",
                    array.nbytes, err)
        return False
    return True


def unpin(array: np.ndarray) -> None:
    """Undoes ``pin``."""
    if available() and array.size:
        tensors.torch.cuda.cudart().cudaHostUnregister(int(array.ctypes.data))


class DeviceCopier:
    """Queues device-to-host copies of CUDA tensors on one side stream per device.

    Usage: ``copy(tensor, host_bytes)`` for each tensor, then ``wait()`` before the host
    bytes are read or the device tensors may change. Not thread-safe; one per stager.
    """

    def __init__(self) -> None:
        self._streams: dict[Any, Any] = {}
        self._events: list[Any] = []

    def _stream(self, device: Any) -> Any:
        torch = tensors.torch
        s = self._streams.get(device)
        if s is None:
            s = self._streams[device] = torch.cuda.Stream(device=device)
            # Kernels already queued on the caller's stream (the step that produced these
            # values) must finish before the side stream reads their outputs.
            s.wait_stream(torch.cuda.current_stream(device))
        return s

    def copy(self, src: Any, out: np.ndarray, *, start: int = 0) -> None:
        """Queues a copy of CUDA tensor ``src``'s bytes (row-major) into host ``out`` (uint8).

        With ``start``, copies only bytes ``[start, start + len(out))`` of the tensor.
        """
        torch = tensors.torch
        stream = self._stream(src.device)
        with torch.cuda.stream(stream):
            t = src.detach()
            if t.is_conj():
                t = t.resolve_conj()
            if t.is_neg():
                t = t.resolve_neg()
            t = t.contiguous()
            # The caching allocator must not hand the source's memory to someone else
            # before this stream has read it.
            t.record_stream(stream)
            host = torch.from_numpy(out)
            flat = t.reshape(-1).view(torch.uint8)
            if start or out.size != flat.numel():
                flat = flat[start : start + out.size]
            host.copy_(flat, non_blocking=True)

    def wait(self) -> None:
        """Blocks until every queued copy has landed in host memory."""
        torch = tensors.torch
        for s in self._streams.values():
            ev = torch.cuda.Event()
            ev.record(s)
            self._events.append(ev)
        for ev in self._events:
            ev.synchronize()
        self._events.clear()
        self._streams.clear()
