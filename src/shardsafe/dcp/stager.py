"""``Stager``: DCP's ``AsyncStager`` on shardsafe's staging.

``dcp.async_save`` first *stages* the state (a copy that training may no longer change),
then writes that copy in the background. DCP's default stager allocates a new copy of
every tensor on each save, so the training loop waits for page faults as well as for the
copy. ``Stager`` copies into host memory that it keeps between saves
(``engine.buffers.StagingArena``: pre-faulted, page-locked where CUDA is present), laid
out as one data-file image (``plan.layout``) and filled by the save pipeline's feed
(``engine.save.feeds.stage_image``: a parallel ``memmove`` per unit, CUDA tensors on a
side stream). The staged state dict holds views of that memory.

The memory is reused only once DCP has dropped the previous save's staged tensors (its
write has finished): a save that starts while the previous one still writes gets a second
image if ``max_staging_bytes`` leaves room for it, else waits for the first. Every use of
the engine's staging internals is in this module.
"""

from __future__ import annotations

import copy
import gc
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.staging import AsyncStager

from .. import knobs, values
from ..engine import cuda
from ..engine.buffers import StagingArena
from ..engine.save.feeds import stage_image
from ..engine.save.units import BLOCK_SIZE, UNIT_SIZE
from ..errors import CheckpointTimeoutError
from ..plan.flatten import TensorItem
from ..plan.layout import plan_file
from ..values.dtensor import is_dtensor
from ..values.torch import check_supported, dtype_of

MAX_IMAGES = 2  # a save still writing and the next one being staged
_POLL_S = 0.01
# A save whose future has just completed may still hold its staged dict for a moment (the
# executor thread drops its arguments after it sets the result): wait this long for an
# image to be released before allocating a second one.
_RELEASE_GRACE_S = 0.05


class _Image:
    """One staging arena and the staged tensors that still use it (weak references)."""

    def __init__(self, pin: bool) -> None:
        self.arena = StagingArena(pin=pin)
        self.users: list[weakref.ref] = []

    def busy(self) -> bool:
        return any(r() is not None for r in self.users)


class Stager(AsyncStager):
    """Stages a state dict for ``dcp.async_save`` into reused host buffers.

    ``dcp.async_save(sd, storage_writer=Writer(path), async_stager=Stager())`` returns
    once every tensor has been copied (the caller may change its tensors at once); with
    DCP's ``FileSystemWriter`` it works the same way. Tensors come back as CPU tensors
    (DTensors as DTensors around a CPU local shard); other values are deep-copied.

    Args:
        max_staging_bytes: The most host memory the stager holds (None: as much as the
            state needs, twice while one save writes and the next is staged). DCP writes
            from a complete staged copy, so a state whose image is larger than this is
            refused with ``ValueError`` (``shardsafe.async_save(max_staging_bytes=...)``
            streams a larger state through a smaller budget).
        pin_memory: Page-lock the buffers (default: when CUDA is available).
        timeout: Seconds to wait for a previous save to release its buffers before
            raising ``CheckpointTimeoutError`` (default ``SHARDSAFE_TIMEOUT``).
    """

    _synchronize_after_execute = False  # stage() returns once the copy is complete

    def __init__(self, *, max_staging_bytes: int | None = None, pin_memory: bool | None = None,
                 timeout: float | None = None) -> None:
        if max_staging_bytes is not None and (isinstance(max_staging_bytes, bool)
                                              or not isinstance(max_staging_bytes, int)
                                              or max_staging_bytes < 1):
            raise ValueError(f"max_staging_bytes must be None or a positive int, got {max_staging_bytes!r}")
        self.max_staging_bytes = max_staging_bytes
        self._pin = cuda.available() if pin_memory is None else pin_memory
        self._timeout = knobs.timeout() if timeout is None else timeout
        self._images: list[_Image] = []
        self._lock = threading.Lock()
        self._peak = 0

    @property
    def nbytes(self) -> int:
        """Host memory held now."""
        return sum(im.arena.nbytes for im in self._images)

    @property
    def peak_nbytes(self) -> int:
        """The most host memory held at once (never more than ``max_staging_bytes``)."""
        return self._peak

    @property
    def allocations(self) -> int:
        """How many times staging memory was allocated (a state of one layout: once)."""
        return sum(im.arena.allocations for im in self._images)

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``state_dict`` whose tensors live in the stager's host buffers.

        Raises:
            ValueError: The state's image is larger than ``max_staging_bytes``.
            CheckpointTimeoutError: The previous saves did not release their buffers in time.
        """
        locals_: list[Any] = []
        skeleton = _collect(state_dict, locals_)
        items = [TensorItem(i, (str(i),), x, "torch", dtype_of(x).name, tuple(x.shape),
                            (0,) * x.dim()) for i, x in enumerate(locals_)]
        plan = plan_file("staged", items)
        size = plan.layout.size
        if self.max_staging_bytes is not None and size > self.max_staging_bytes:
            raise ValueError(f"the state needs {size} bytes of staging, more than max_staging_bytes="
                             f"{self.max_staging_bytes}: dcp.async_save writes from a complete staged "
                             f"copy (shardsafe.async_save can stream through a smaller budget)")
        with self._lock:
            image = self._free_image(size)
            out = image.arena.get([size])[0]
            self._peak = max(self._peak, self.nbytes)
            stage_image(plan, out, UNIT_SIZE, BLOCK_SIZE, pin=image.arena.pin)
            staged = [_view(out.array, plan.layout.offsets[i], x) for i, x in enumerate(locals_)]
            image.users = [weakref.ref(t) for t in staged]
        return _rebuild(skeleton, staged)

    def synchronize_staging(self) -> None:
        """Nothing to wait for: ``stage`` returns once the copy is complete."""

    def close(self) -> None:
        """Frees the buffers (a later ``stage`` allocates again)."""
        with self._lock:
            for im in self._images:
                im.arena.release()
            self._images = []

    def _free_image(self, size: int) -> _Image:
        """An image no staged tensor uses any more; a new one if the budget allows; else
        waits for one to be released."""
        now = time.monotonic()
        deadline, grace = now + self._timeout, now + _RELEASE_GRACE_S
        collected = False
        while True:
            for im in self._images:
                if not im.busy():
                    others = self.nbytes - im.arena.nbytes
                    if self.max_staging_bytes is None or others + size <= self.max_staging_bytes:
                        return im
            if self._images and time.monotonic() < grace:
                time.sleep(_POLL_S / 10)
                continue
            if len(self._images) < MAX_IMAGES and (self.max_staging_bytes is None
                                                   or self.nbytes + size <= self.max_staging_bytes):
                self._images.append(_Image(self._pin))
                return self._images[-1]
            if time.monotonic() > deadline:
                raise CheckpointTimeoutError(
                    f"the staging buffers are still used by earlier saves after {self._timeout:.0f} s "
                    f"(max_staging_bytes={self.max_staging_bytes}): wait for dcp.async_save's future "
                    f"before the next save, or give the stager room for two copies")
            if not collected:  # a staged dict kept only by a reference cycle
                gc.collect()
                collected = True
            time.sleep(_POLL_S)


class _Tensor:
    """A tensor's place in the skeleton: its position in the locals list, and the DTensor
    it was the local shard of (if any)."""

    __slots__ = ("i", "dt")

    def __init__(self, i: int, dt: Any) -> None:
        self.i, self.dt = i, dt


def _collect(x: Any, locals_: list[Any]) -> Any:
    """The skeleton of ``x`` (tensors replaced by ``_Tensor``), appending the tensors to stage."""
    if isinstance(x, torch.Tensor):
        dt = x if is_dtensor(x) else None
        local = (x._local_tensor if dt is not None else x).detach()
        try:
            check_supported(local)
        except TypeError:  # sparse, nested, an unsupported dtype: DCP's way, a plain copy
            return local.to("cpu", copy=True) if dt is None else _clone_dtensor(dt)
        locals_.append(local)
        return _Tensor(len(locals_) - 1, dt)
    if isinstance(x, Mapping):
        return type(x)((k, _collect(v, locals_)) for k, v in x.items())
    if type(x) in (list, tuple):
        return type(x)(_collect(v, locals_) for v in x)
    return copy.deepcopy(x)


def _clone_dtensor(dt: Any) -> Any:
    return type(dt)(dt._local_tensor.detach().to("cpu", copy=True), dt._spec, requires_grad=False)


def _view(image: Any, offset: int, like: Any) -> Any:
    """A CPU tensor over ``image[offset:]`` with ``like``'s dtype and shape."""
    nbytes = values.nbytes_of(like)
    if nbytes == 0:
        return torch.empty(like.shape, dtype=like.dtype)
    flat = torch.frombuffer(image[offset : offset + nbytes], dtype=torch.uint8)
    return flat.view(like.dtype).view(like.shape)


def _rebuild(skeleton: Any, staged: list[Any]) -> Any:
    if isinstance(skeleton, _Tensor):
        t = staged[skeleton.i]
        return t if skeleton.dt is None else type(skeleton.dt)(t, skeleton.dt._spec, requires_grad=False)
    if isinstance(skeleton, Mapping):
        return type(skeleton)((k, _rebuild(v, staged)) for k, v in skeleton.items())
    if type(skeleton) in (list, tuple):
        return type(skeleton)(_rebuild(v, staged) for v in skeleton)
    return skeleton


__all__ = ["Stager"]
