"""CUDA staging: page-locked host buffers and device-to-host copies on side streams.

Everything here is a no-op or raises a clear error without CUDA; the module imports on
CPU-only machines (and without torch).

Ordering, and why a save holds the values of the moment of the call:

- ``Fence.capture`` runs on the caller's thread when a save is submitted. On each device
  that holds saved tensors it records an event on the caller's *current* stream (the
  current stream is per host thread: staging helpers and the writer thread have their
  own, so it is taken here and nowhere later).
- Every side stream that copies from a device first waits for that event, on the GPU:
  kernels the caller queued before the call (the step that produced the values) finish
  before the copies read them, whatever thread queues the copies.
- ``DeviceCopier.hold_callers`` makes each caller stream wait, on the GPU, for the copies
  queued so far: the caller's next in-place update (the next optimizer step) runs after
  them, and the call can return before they have landed. ``wait`` blocks a host thread
  until they have (blocking events: the thread sleeps, it does not spin).
- ``record_stream`` on each source tells PyTorch's caching allocator that the side stream
  uses the memory, so a tensor the caller drops is not handed out again before it is read.

Page-locking registers existing host memory (``cudaHostRegister``, portable: page-locked
for every context) under the device whose tensors are copied, so that a helper thread
never creates a context on another GPU. A refusal clears the error CUDA keeps for the
thread (PyTorch's next kernel-launch check would raise it) and falls back to pageable
memory with a warning.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..values import torch as torch_values

log = logging.getLogger("shardsafe")

HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every CUDA context
_CUDART = re.compile(r"libcudart(-[0-9a-f]+)?\.so")  # torch's own, or a wheel's bundled copy
_COPY_AS = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}  # itemsize -> dtype copied by integer kernels


def available() -> bool:
    """True when torch sees at least one CUDA device."""
    return torch_values.HAVE_TORCH and torch_values.torch.cuda.is_available()


def is_device_tensor(x: Any) -> bool:
    """True for torch tensors that live on a CUDA device."""
    return torch_values.is_torch_tensor(x) and x.device.type == "cuda"


def device_index(x: Any) -> int:
    """The CUDA device index of tensor ``x`` (its current device when it names none)."""
    i = x.device.index
    return torch_values.torch.cuda.current_device() if i is None else int(i)


# ---------------------------------------------------------------------- page-locking
def cudart_paths(maps: str) -> list[str]:
    """The CUDA runtime libraries mapped into a process, from its ``/proc/<pid>/maps`` text,
    in order of first appearance (none: a runtime linked statically into torch)."""
    out: list[str] = []
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6:
            path = fields[5].strip()
            if _CUDART.match(os.path.basename(path)) and path not in out:
                out.append(path)
    return out


_runtime: list[Any] = []  # [the loaded runtime's CDLL, or None], once looked up


def _loaded_runtime() -> Any:
    """torch's own libcudart, through ctypes (RTLD_NOLOAD: never a second copy), or None
    when it cannot be told for sure (none mapped, or several: another library's own)."""
    if not _runtime:
        lib = None
        try:
            with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
                paths = cudart_paths(f.read())
            if len(paths) == 1:
                lib = ctypes.CDLL(paths[0], mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
                lib.cudaGetLastError.restype = ctypes.c_int
        except (OSError, AttributeError) as e:
            log.debug("the CUDA runtime is not reachable through ctypes (%s)", e)
            lib = None
        _runtime.append(lib)
    return _runtime[0]


def clear_last_error(device: int) -> None:
    """Clears the error a failed runtime call left as this thread's last CUDA error.

    PyTorch's ``cudart()`` bindings return a call's error without reading it back, and
    the runtime keeps it until ``cudaGetLastError``: the next kernel launch of this thread
    would report it as its own failure. Where torch's runtime is the one shared library
    of the process it is called directly; else one tiny kernel's launch check, which is
    torch's own ``cudaGetLastError``, reads (and clears) the error.
    """
    lib = _loaded_runtime()
    if lib is not None:
        lib.cudaGetLastError()
        return
    torch = torch_values.torch
    try:
        torch.empty(1, device=torch.device("cuda", device)).zero_()
    except RuntimeError as e:  # what the launch check raises: the pending error, now cleared
        log.debug("cleared a pending CUDA error: %s", e)


def _code(err: Any) -> int:
    return int(getattr(err, "value", err))


def pin(array: np.ndarray, device: int | None = None) -> bool:
    """Page-locks ``array``'s memory (portable) under ``device`` (default: the current one)
    for asynchronous copies; False, with a warning and no CUDA error left behind, if CUDA
    refuses."""
    if not available() or array.size == 0:
        return False
    torch = torch_values.torch
    dev = torch.cuda.current_device() if device is None else device
    with torch.cuda.device(dev):
        err = torch.cuda.cudart().cudaHostRegister(int(array.ctypes.data), int(array.nbytes),
                                                   HOST_REGISTER_PORTABLE)
        if _code(err) != 0:
            clear_last_error(dev)
            log.warning("cudaHostRegister of %d bytes failed (CUDA error %d); staging uses pageable memory",
                        array.nbytes, _code(err))
            return False
    return True


def unpin(array: np.ndarray, device: int | None = None) -> None:
    """Undoes ``pin`` (under the device it was pinned under)."""
    if not available() or array.size == 0:
        return
    torch = torch_values.torch
    dev = torch.cuda.current_device() if device is None else device
    with torch.cuda.device(dev):
        err = torch.cuda.cudart().cudaHostUnregister(int(array.ctypes.data))
        if _code(err) != 0:
            clear_last_error(dev)
            log.warning("cudaHostUnregister of %d bytes failed (CUDA error %d)", array.nbytes, _code(err))


# ---------------------------------------------------------------------- ranges of tensors
Block = tuple[tuple[int, ...], int, int]
"""``(index, lo, hi)``: the elements ``t[index][lo:hi]`` of a tensor ``t`` with ndim >= 1."""


def element_blocks(shape: tuple[int, ...], lo: int, hi: int) -> list[Block]:
    """Elements ``[lo, hi)`` of a row-major array of ``shape`` (ndim >= 1) as at most
    ``2 * ndim - 1`` boxes, in order: a partial row, whole rows, a partial row (recursively).

    Each box is a view of any strided tensor, so a range can be gathered without
    materialising the rest of a non-contiguous tensor.
    """
    if lo >= hi:
        return []
    inner = 1
    for s in shape[1:]:
        inner *= s
    r0, o0 = divmod(lo, inner)
    r1, o1 = divmod(hi, inner)
    if r0 == r1:  # inside one row
        return [((r0,) + ix, a, b) for ix, a, b in element_blocks(shape[1:], o0, o1)]
    out: list[Block] = []
    if o0:
        out += [((r0,) + ix, a, b) for ix, a, b in element_blocks(shape[1:], o0, inner)]
        r0 += 1
    if r0 < r1:
        out.append(((), r0, r1))
    if o1:
        out += [((r1,) + ix, a, b) for ix, a, b in element_blocks(shape[1:], 0, o1)]
    return out


def byte_range(t: Any, start: int, n: int) -> Any:
    """Bytes ``[start, start + n)`` of torch tensor ``t``'s logical row-major bytes, as a
    1-D uint8 tensor on ``t``'s device, queued on the current stream.

    A plain contiguous tensor gives a view. Anything else (strided, expanded,
    channels-last, a conj or neg view) is gathered into a new buffer holding only the
    elements the range touches, so a large non-contiguous tensor streamed in units is
    never copied whole per unit. Works the same on any device.
    """
    torch = torch_values.torch
    t = t.detach()
    plain = not t.is_conj() and not t.is_neg()
    if plain and t.is_contiguous():
        return t.reshape(-1).view(torch.uint8)[start : start + n]
    size = t.element_size()
    if plain and size in _COPY_AS:
        t = t.view(getattr(torch, _COPY_AS[size]))  # every dtype, copied by integer kernels
    e0, e1 = start // size, -(-(start + n) // size)
    flat = torch.empty(e1 - e0, dtype=t.dtype, device=t.device)
    if t.dim() == 0:
        flat.view(()).copy_(t)  # copy_ resolves conj and neg bits
    else:
        at = 0
        for ix, a, b in element_blocks(tuple(t.shape), e0, e1):
            part = t[ix][a:b]
            m = part.numel()
            flat[at : at + m].view(part.shape).copy_(part)
            at += m
    skip = start - e0 * size
    return flat.view(torch.uint8)[skip : skip + n]


# ---------------------------------------------------------------------- ordering
class Fence:
    """Where a save's copies start on each device: the caller's current stream at the
    call, and an event recorded on it then (see the module docstring).

    Attributes:
        marks: Device index -> ``(caller stream, event)``.
    """

    def __init__(self, marks: dict[int, tuple[Any, Any]]) -> None:
        self.marks = marks

    @classmethod
    def capture(cls, values: Iterable[Any]) -> Fence | None:
        """Records the caller's point on every device of ``values`` (call it on the
        caller's thread); None when none of them is a CUDA tensor. Costs nothing without
        CUDA: no CUDA tensor exists before torch has initialised CUDA."""
        if not available() or not torch_values.torch.cuda.is_initialized():
            return None
        torch = torch_values.torch
        tensor = torch.Tensor
        # per item: two C-level attribute reads (states hold 10^4-10^5 tensors)
        devices = {device_index(v) for v in values if isinstance(v, tensor) and v.is_cuda}
        if not devices:
            return None
        marks = {}
        for d in sorted(devices):
            stream = torch.cuda.current_stream(d)
            ev = torch.cuda.Event(blocking=True)
            ev.record(stream)
            marks[d] = (stream, ev)
        return cls(marks)


class DeviceCopier:
    """Queues device-to-host copies of CUDA tensors on one side stream per device.

    Usage: ``copy(tensor, host_bytes)`` for each tensor; then ``hold_callers()`` (the
    caller's next kernels wait for the copies on the GPU) and/or ``wait()`` before the
    host bytes are read. Not thread-safe; one per staging thread and batch of copies.

    Args:
        fence: The save's ``Fence``: what the side streams wait for. Without one (or for
            a device it lacks) they wait for this thread's current stream, which is the
            caller's only on the caller's thread.
    """

    def __init__(self, fence: Fence | None = None) -> None:
        self.fence = fence
        self._streams: dict[int, Any] = {}
        self._done: dict[int, Any] = {}

    def _stream(self, device: int) -> Any:
        torch = torch_values.torch
        s = self._streams.get(device)
        if s is None:
            s = self._streams[device] = torch.cuda.Stream(device=device)
            mark = self.fence.marks.get(device) if self.fence is not None else None
            if mark is not None:
                s.wait_event(mark[1])
            else:
                s.wait_stream(torch.cuda.current_stream(device))
        return s

    def copy(self, src: Any, out: np.ndarray, *, start: int = 0) -> None:
        """Queues a copy of CUDA tensor ``src``'s bytes (row-major) into host ``out`` (uint8).

        With ``start``, copies only bytes ``[start, start + len(out))`` of the tensor.
        """
        if out.size == 0:
            return
        torch = torch_values.torch
        dev = device_index(src)
        stream = self._stream(dev)
        self._done.pop(dev, None)
        with torch.cuda.device(dev), torch.cuda.stream(stream):
            # the caching allocator must not hand the source's memory to anyone else before
            # this stream has read it (the caller may drop the tensor right after the call)
            src.record_stream(stream)
            piece = byte_range(src, start, out.size)  # a gather runs on this stream too
            torch.from_numpy(out).copy_(piece, non_blocking=True)

    def _record(self) -> dict[int, Any]:
        torch = torch_values.torch
        for d, s in self._streams.items():
            if d not in self._done:
                ev = self._done[d] = torch.cuda.Event(blocking=True)
                ev.record(s)
        return self._done

    def hold_callers(self) -> None:
        """Makes each caller stream of the fence wait, on the GPU, for the copies queued so
        far: the caller's later kernels (in-place updates of the saved tensors) run after
        them, without the caller's thread waiting."""
        if self.fence is None:
            return
        for d, ev in self._record().items():
            mark = self.fence.marks.get(d)
            if mark is not None:
                mark[0].wait_event(ev)

    def wait(self) -> None:
        """Blocks this thread (asleep) until every queued copy has landed in host memory."""
        for ev in self._record().values():
            ev.synchronize()
        self._streams.clear()
        self._done.clear()


__all__ = ["DeviceCopier", "Fence", "available", "byte_range", "clear_last_error", "cudart_paths",
           "device_index", "element_blocks", "is_device_tensor", "pin", "unpin"]
