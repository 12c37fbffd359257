"""DTensor leaves: where this rank's piece of a distributed tensor sits in the whole.

A DTensor (FSDP2 ``fully_shard``, tensor parallel, any DeviceMesh and placements) is
saved as chunks of its global tensor. On each rank the local tensor is one box of the
global tensor at ``offsets`` with ``shape``; ranks that differ only in their coordinate
along ``Replicate`` mesh dimensions hold identical boxes (the ``holders``), and the
planner lets exactly one of them write it. Offsets follow
``compute_local_shape_and_global_offset``, the function DCP itself uses, so uneven
shards and multi-dimensional meshes place exactly as torch places them.

A DTensor is a torch tensor: its adapter is the torch one (what a save stores: the
global shape and dtype under the kind ``torch``; never shared with another path), plus
its box. Only this module and ``shardsafe.comm`` know about torch.distributed types.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from .adapter import Region
from .torch import TorchAdapter

_DTENSOR_MODULE = "torch.distributed.tensor"
_dtensor_class: Any = None  # DTensor, once its module is imported


def is_dtensor(x: Any) -> bool:
    """True for ``torch.distributed.tensor.DTensor`` values.

    Nothing is imported here: a DTensor exists only once ``torch.distributed.tensor`` has
    been imported (by whoever made it), and importing it costs about a second, which
    ``import shardsafe`` (and every ``shardsafe`` command) would otherwise pay.
    """
    global _dtensor_class
    if _dtensor_class is None:
        _dtensor_class = getattr(sys.modules.get(_DTENSOR_MODULE), "DTensor", None)
        if _dtensor_class is None:
            return False
    return isinstance(x, _dtensor_class)


@dataclass(frozen=True, slots=True)
class LocalShard:
    """This rank's box of a DTensor.

    Attributes:
        local: The local tensor (``to_local()``): read from on save, written into on load.
        offsets: Position of the box in the global tensor, one entry per dimension.
        shape: Shape of the box (equal to ``local.shape``).
        global_shape: Shape of the whole tensor.
        holders: Sorted default-group ranks whose local box is this very box (this rank
            included); more than one when the tensor is replicated along a mesh dimension.
    """

    local: Any
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    global_shape: tuple[int, ...]
    holders: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def holders_of(mesh_ranks: Any, coordinate: list[int], replicated_dims: set[int]) -> tuple[int, ...]:
    """Ranks of ``mesh_ranks`` (an n-D array) sharing ``coordinate`` outside ``replicated_dims``."""
    index = tuple(slice(None) if d in replicated_dims else c for d, c in enumerate(coordinate))
    sub = mesh_ranks[index]
    flat = sub.reshape(-1).tolist() if hasattr(sub, "reshape") else [int(sub)]
    return tuple(sorted(int(r) for r in flat))


def local_shard(x: Any, key: str = "<tensor>") -> LocalShard:
    """Describes this rank's part of DTensor ``x``.

    Raises:
        TypeError: ``x`` has a ``Partial`` placement (its value is a pending reduction,
            not data: redistribute it first), or this rank is not in its mesh.
    """
    from torch.distributed.tensor import Partial, Replicate  # imported already: x is a DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    placements = tuple(x.placements)
    if any(isinstance(p, Partial) for p in placements):
        raise TypeError(f"cannot save DTensor at key path {key!r}: placement Partial holds a pending "
                        f"reduction; call .redistribute() or .full_tensor() first")
    mesh = x.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise TypeError(f"DTensor at key path {key!r}: this rank is not part of its device mesh")
    global_shape = tuple(int(s) for s in x.shape)
    shape, offsets = compute_local_shape_and_global_offset(global_shape, mesh, placements)
    local = x.to_local()
    if tuple(local.shape) != tuple(shape):
        raise TypeError(f"DTensor at key path {key!r}: local tensor has shape {tuple(local.shape)}, "
                        f"its placements imply {tuple(shape)} (padded shards are not supported)")
    replicated = {d for d, p in enumerate(placements) if isinstance(p, Replicate)}
    holders = holders_of(mesh.mesh.cpu(), list(coordinate), replicated)
    return LocalShard(local, tuple(int(o) for o in offsets), tuple(int(s) for s in shape),
                      global_shape, holders)


class DTensorAdapter(TorchAdapter):
    """``torch.distributed.tensor.DTensor`` leaves (see the module docstring)."""

    name = "dtensor"

    def owns(self, x: Any) -> bool:
        return is_dtensor(x)

    def local_region(self, x: Any) -> Region | None:
        """Its local tensor and box: a load into it reads only this rank's region."""
        box = local_shard(x)
        return box.local, box.offsets, box.shape
