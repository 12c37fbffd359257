"""Placers: the last stage of a load, where verified bytes land.

A placer turns a request's target into what the reads fill (``Placement``) and, once
every read succeeded, into what the load returns (``finish``):

- ``in_place.InPlace``: a live state, restored into its own tensors (``match``);
- ``new.NewTensors``: ``load(path)``, new tensors allocated for the reads;
- ``mapped.Mapped``: ``load(path, mmap=True)``, views of the mapped data files (its
  bytes are verified where they lie: it reads nothing through the reader);
- ``jax_arrays.JaxArrays``: a JAX pytree, host boxes put on the target's devices.

Inside a placement each tensor's destination is decided once, when it is planned
(``run``): contiguous host memory is read into directly (by address, for whole raw
chunks); a tensor on a GPU, with strided memory or of another dtype (``cast=True``) is
staged through bounded host buffers, page-locked for a GPU (``staged``).

``placer_for`` picks the placer from the request's target kind, decided once at the edge
(``LoadRequest.target``); the JAX placer's module is imported only for a JAX target.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .... import values
from ....errors import StateMismatchError
from ....format.dtypes import lookup
from ....format.index.objects import Index
from ....format.index.v4_global import Region
from ....plan.regroup import regroup
from ..match import TensorTarget

log = logging.getLogger("shardsafe")

if TYPE_CHECKING:
    from ..index_exchange import IndexRead
    from ..request import LoadRequest
    from .new import Allocated


@dataclass(slots=True)
class Placement:
    """What a placer needs read.

    Attributes:
        index: The index the reads use (a version 4 index narrowed to the targets' regions).
        targets: The tensors (or boxes of tensors) to read, each with its target.
        new: Tensors of new memory read whole by table row and address (``load(path)``).
        nbytes: Bytes of tensor data the load reads (for the log line).
    """

    index: Index
    targets: list[TensorTarget] = field(default_factory=list)
    new: Allocated | None = None
    nbytes: int = 0


class Placer(Protocol):
    """One kind of target (see the module docstring)."""

    def place(self, read: IndexRead) -> Placement:
        """Matches the target against the index (``read``) and says what to read; changes
        nothing in the target yet.

        Raises:
            StateMismatchError: A strict load whose target differs from the checkpoint.
        """
        ...

    def finish(self) -> Any:
        """What the load returns, once every read succeeded (applies in-place changes)."""
        ...


_PLACERS = {"in_place": ("in_place", "InPlace"), "new": ("new", "NewTensors"),
            "mapped": ("mapped", "Mapped"), "jax": ("jax_arrays", "JaxArrays")}


def placer_for(request: LoadRequest) -> Placer:
    """The placer of ``request``'s target kind (its module imported on first use)."""
    module, name = _PLACERS[request.target]
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)(request)


def named_as_target(index: Index, state: Any) -> Index:
    """``index`` with its tree's names nested as ``state`` nests them, where a JAX save
    and a torch target (or the reverse) differ (``plan.regroup``)."""
    tree = regroup(index.tree, state)
    return index if tree is index.tree else dataclasses.replace(index, tree=tree)


def saved_from_jax(index: Index) -> bool:
    """Whether ``index`` holds tensors saved from JAX (their names nest another way)."""
    return any(t.kind == "jax" for t in (index.infos if index.infos is not None else index.tensors))


def skipped(path: str, problems: list[str], strict: bool) -> None:
    """Refuses a strict load whose target differs (``problems``), or logs what a lenient
    one skips.

    Raises:
        StateMismatchError: ``strict`` and there are problems.
    """
    if problems and strict:
        raise StateMismatchError(problems)
    if problems:
        log.warning("load(%s, strict=False) skipped %d key path(s):\n  %s", path, len(problems),
                    "\n  ".join(problems))


def target_regions(targets: list[TensorTarget], index: Index) -> list[Region]:
    """``(tensor id, offsets, shape)``: the region of its tensor each target is read from
    (what a load needs of the index). A DTensor target's box is worked out once, here:
    its local tensor and offsets replace it in the target."""
    out = []
    for tt in targets:
        if tt.dest is not None:
            shape = tuple(index.tensors[tt.tid].shape)
            out.append((tt.tid, (0,) * len(shape), shape))
            continue
        if tt.offsets is None:
            local = values.local_region(tt.target)
            if local is not None:
                tt.target, tt.offsets, _ = local
        shape = values.shape_of(tt.target)
        out.append((tt.tid, tt.offsets if tt.offsets is not None else (0,) * len(shape), shape))
    return out


def tensor_bytes(index: Index) -> int:
    """Bytes of every tensor of ``index``."""
    return sum(math.prod(t.shape) * lookup(t.dtype).itemsize for t in index.tensors)


def region_bytes(index: Index, regions: list[Region]) -> int:
    """Bytes of the stored tensors' ``regions``."""
    assert index.infos is not None, "a decoded index has its tensor table as columns"
    return sum(math.prod(shape) * lookup(index.infos[tid].dtype).itemsize for tid, _, shape in regions)


__all__ = ["Placement", "Placer", "named_as_target", "placer_for", "region_bytes", "saved_from_jax",
           "skipped", "target_regions", "tensor_bytes"]
