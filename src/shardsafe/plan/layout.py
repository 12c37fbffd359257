"""Place tensor items into a data file: pure layout, no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..format.datafile import METADATA_KEY, Layout, Slot, layout
from ..format.index import ChunkEntry
from ..format.tree import render_path
from .flatten import TensorItem


@dataclass(frozen=True, slots=True)
class FilePlan:
    """A data file to write: its name, layout and the items it holds (same order)."""

    name: str
    items: tuple[TensorItem, ...]
    layout: Layout


def data_file_name(rank: int, part: int = 0) -> str:
    return f"data-r{rank:05d}-{part:03d}.safetensors"


def plan_file(name: str, items: Sequence[TensorItem]) -> FilePlan:
    """Lays out ``items`` in one data file; slot names are the items' dotted key paths."""
    names: set[str] = {METADATA_KEY}  # a state key "__metadata__" gets a suffix like any clash
    slots = []
    for it in items:
        base = render_path(it.path)
        if any(it.offsets):
            base += "@" + ",".join(map(str, it.offsets))
        n, k = base, 1
        while n in names:  # dotted paths can collide ("a.b" vs a -> b)
            n, k = f"{base}#{k}", k + 1
        names.add(n)
        slots.append(Slot(n, it.dtype, it.local_shape))
    return FilePlan(name, tuple(items), layout(slots))


def chunk_entries(plan: FilePlan, checksums: Sequence[Sequence[int]]) -> list[tuple[int, ChunkEntry]]:
    """``(item id, chunk entry)`` for each item of a written file, given its block checksums."""
    return [
        (it.id, ChunkEntry(file=plan.name, offset=off, nbytes=it.nbytes, offsets=it.offsets,
                           shape=it.local_shape, checksums=tuple(sums)))
        for it, off, sums in zip(plan.items, plan.layout.offsets, checksums)
    ]
