"""Communication between the ranks of a save or load (the only layer that may touch
torch.distributed). This file holds the seam the engine uses and its single-process
implementation; the torch.distributed implementations live beside it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Comm(Protocol):
    """Collectives the save/load pipeline needs, over plain (JSON-like) Python values.

    Attributes:
        rank: This process's rank in the group.
        world_size: Number of ranks.
    """

    rank: int
    world_size: int

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Returns ``src``'s ``obj`` on every rank."""
        ...

    def gather(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Returns every rank's ``obj`` (in rank order) on ``dst``; None elsewhere."""
        ...

    def barrier(self) -> None:
        """Returns once every rank has called it."""
        ...


class SingleProcess:
    """The trivial group of one process: no torch.distributed needed."""

    rank = 0
    world_size = 1

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def gather(self, obj: Any, dst: int = 0) -> list[Any] | None:
        return [obj]

    def barrier(self) -> None:
        return None


__all__ = ["Comm", "SingleProcess"]
