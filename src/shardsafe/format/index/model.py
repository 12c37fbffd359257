"""What every index version decodes into: the tensor rows and the chunk table as columns.

``ColumnarIndex`` is the decoded, validated index of any version (``versions.decode``):
the header (``IndexHeader``), the state's tree, one ``TensorInfo`` per tensor and every
chunk as columns of a ``ChunkTable``. Encoders of the binary versions write it back;
``objects.Index`` is the same index with per-tensor entry objects built on demand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .. import tree
from .chunk_table import ChunkTable
from .rows import FileEntry


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexHeader:
    """What every index version records about the save besides its tensors (keyword-only).

    Attributes:
        world_size: Ranks that saved.
        created: Time of the save (seconds since the epoch).
        metadata: User metadata (JSON).
        library: Name and version of the writer.
    """

    world_size: int = 1
    created: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    library: str = ""


class TensorInfo(NamedTuple):
    """A tensor of the index: key path, kind, dtype and shape (its chunks are rows of the
    ``ChunkTable``)."""

    key: tree.KeyPath
    kind: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True, eq=False)
class ColumnarIndex(IndexHeader):
    """A decoded, validated index of any version; ``chunks`` holds every chunk as columns."""

    tree: tree.Node
    tensors: tuple[TensorInfo, ...]
    files: tuple[FileEntry, ...]
    chunks: ChunkTable

    @property
    def block_size(self) -> int:
        return self.chunks.block_size

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ColumnarIndex):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in
                   ("tree", "tensors", "files", "chunks", "world_size", "created", "metadata", "library"))
