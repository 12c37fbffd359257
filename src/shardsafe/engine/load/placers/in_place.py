"""The placer of an in-place load: a live state restored into its own tensors.

The target is matched against the index first (``match``): a strict load whose target
differs fails before anything is read or changed. Tensors are then read into their own
memory (or staged, ``placers.staged``), and once every read succeeded the container
assignments and ``load_state_dict`` calls run (``Matching.apply``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....per_rank import loading
from ..match import Matching, match
from ..request import LoadRequest, LoadResult
from . import Placement, named_as_target, region_bytes, saved_from_jax, skipped, target_regions

if TYPE_CHECKING:
    from ..index_exchange import IndexRead


class InPlace:
    """Restores ``request.state`` in place (see the module docstring)."""

    def __init__(self, request: LoadRequest) -> None:
        self.request = request
        self._matching: Matching | None = None
        self._problems: list[str] = []

    def place(self, read: IndexRead) -> Placement:
        r = self.request
        index = named_as_target(read.index, r.state) if saved_from_jax(read.index) else read.index
        with loading():  # PerRank values describe only this rank's entry
            m = match(index, r.state, r.cast)
        self._problems = m.problems()
        skipped(r.path, self._problems, r.strict)
        self._matching = m
        regions = target_regions(m.reads, index)
        return Placement(read.narrow(regions), m.reads, nbytes=region_bytes(index, regions))

    def finish(self) -> LoadResult:
        m = self._matching
        assert m is not None, "finish() follows place()"
        m.apply()
        return LoadResult(m.missing, m.unexpected, m.mismatched, self._problems)


__all__ = ["InPlace"]
