"""Place tensor items into a data file: pure layout, no I/O."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..format.datafile import METADATA_KEY, Layout, layout_columns
from ..format.tree import render_path
from .flatten import TensorItem


@dataclass(frozen=True, slots=True)
class FilePlan:
    """A data file to write: its name, layout and the items it holds (same order)."""

    name: str
    items: tuple[TensorItem, ...]
    layout: Layout


DATA_SUFFIX = ".safetensors"  # a data file of raw tensor bytes
BLOCK_SUFFIX = ".blocks"  # a block file of compressed chunks (docs/FORMAT.md section 12)
_DATA_NAME = re.compile(r"data-r\d+-\d+(" + re.escape(DATA_SUFFIX) + "|" + re.escape(BLOCK_SUFFIX) + ")")


def data_file_name(rank: int, part: int = 0) -> str:
    return f"data-r{rank:05d}-{part:03d}{DATA_SUFFIX}"


def block_file_name(rank: int, part: int = 0) -> str:
    """Name of a block file (compressed chunks; docs/FORMAT.md section 12)."""
    return f"data-r{rank:05d}-{part:03d}{BLOCK_SUFFIX}"


def is_data_file_name(name: str) -> bool:
    """Whether ``name`` is one a save gives its data files (``data_file_name`` or ``block_file_name``)."""
    return _DATA_NAME.fullmatch(name) is not None


PARTS_KEY = "shardsafe.parts"  # __metadata__ entry describing the partial chunks of a data file


def part_name(path: str, offsets: Sequence[int], shape: Sequence[int]) -> str:
    """Header name of a partial chunk: ``model.w/part[0:512,0:1024]`` (half-open ranges per dim)."""
    return f"{path}/part[{','.join(f'{o}:{o + s}' for o, s in zip(offsets, shape))}]"


def plan_file(name: str, items: Sequence[TensorItem]) -> FilePlan:
    """Lays out ``items`` in one data file.

    Slot names are the items' dotted key paths. A chunk holding only part of its tensor
    (a shard) is named ``<path>/part[<begin>:<end>,...]`` instead, and the header's
    ``__metadata__["shardsafe.parts"]`` maps each such name (as JSON text) to its tensor,
    offsets and global shape, so a tool reading the file without the index cannot take a
    shard for a whole tensor.
    """
    names = [render_path(it.path) for it in items]
    locals_ = [it.local_shape for it in items]
    parts: dict[str, dict[str, object]] = {}
    if len(set(names)) != len(names) or METADATA_KEY in names or any(
            local != it.shape for local, it in zip(locals_, items)):
        names = _unique_names(items, names, locals_, parts)
    meta = {PARTS_KEY: json.dumps(parts, separators=(",", ":"))} if parts else None
    return FilePlan(name, tuple(items), layout_columns(names, [it.dtype for it in items], locals_, meta,
                                                       [it.nbytes for it in items]))


def _unique_names(items: Sequence[TensorItem], paths: Sequence[str], locals_: Sequence[tuple[int, ...]],
                  parts: dict[str, dict[str, object]]) -> list[str]:
    """Slot names when some item is a shard or two dotted paths collide (fills ``parts``)."""
    names: set[str] = {METADATA_KEY}  # a state key "__metadata__" gets a suffix like any clash
    out = []
    for it, path, local in zip(items, paths, locals_):
        partial = local != it.shape
        base = part_name(path, it.offsets, local) if partial else path
        n, k = base, 1
        while n in names:  # dotted paths can collide ("a.b" vs a -> b)
            n, k = f"{base}#{k}", k + 1
        names.add(n)
        out.append(n)
        if partial:
            parts[n] = {"tensor": path, "offsets": list(it.offsets), "shape": list(local),
                        "global_shape": list(it.shape)}
    return out

