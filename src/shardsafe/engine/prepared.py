"""What a save has decided before any byte is copied, and the index built from it.

``PreparedSave`` is the plain data the save phases hand each other; ``build_index``
turns it and every rank's chunk entries into the index bytes. Both the single-process
pipeline (``engine.pipeline``) and the collective modules (``engine.plan_exchange``,
``engine.two_phase_commit``) use this module, which imports neither of them: data
flows one way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from .._version import __version__
from ..comm import Channel, Comm
from ..format import FORMAT_VERSION
from ..format import index as fmt
from ..format.tree import Node
from ..plan.flatten import TensorItem
from ..plan.layout import FilePlan, chunk_entries
from ..storage import Storage
from . import commit

BLOCK_SIZE = 16 << 20  # checksum block: partial (resharded) reads verify whole blocks
UNIT_SIZE = 16 << 20  # write/staging unit: big enough for full-speed direct I/O, small
#                       enough that writes start while later units are still staged

#: One rank's part of the index: its chunk entries by item id, and its data files.
Entries: TypeAlias = tuple[dict[int, list[fmt.ChunkEntry]], list[fmt.FileEntry]]


@dataclass(slots=True)
class PreparedSave:
    """Everything decided before any byte is copied (phases a and b of ``engine.pipeline``).

    Attributes:
        storage: Backend of the checkpoint.
        txn: The transaction (working directory, final path).
        tree: Structure tree of the whole state.
        items: Every tensor item of the state (index order).
        plans: The data files this rank writes.
        metadata: User metadata for the index.
        comm: The group of ranks taking part.
        channel: Store channel of this save (None for world size 1).
        timeout: Seconds a rank waits for the others (collective saves).
        reported: This rank has told rank 0 how its part went (collective saves).
    """

    storage: Storage
    txn: commit.Transaction
    tree: Node
    items: list[TensorItem]
    plans: list[FilePlan]
    metadata: dict[str, Any]
    comm: Comm
    channel: Channel | None = None
    timeout: float = 0.0
    reported: bool = False

    @property
    def nbytes(self) -> int:
        """Bytes this rank writes (data files, headers included)."""
        return sum(p.layout.size for p in self.plans)

    def file_path(self, plan: FilePlan) -> str:
        """Where the data file of ``plan`` is written (inside the working directory)."""
        return self.storage.join(self.txn.workdir, plan.name)


def check_metadata(metadata: Mapping[str, Any]) -> None:
    """Raises TypeError/ValueError unless ``metadata`` can be stored in an index (JSON)."""
    fmt.encode_index(fmt.Index(tree={"t": "dict", "k": [], "v": []}, tensors=(), files=(),
                               block_size=BLOCK_SIZE, metadata=dict(metadata)))


def local_entries(prep: PreparedSave, sums: Sequence[list[list[int]]]) -> Entries:
    """This rank's chunk and file entries, given the block checksums of its files."""
    by_item: dict[int, list[fmt.ChunkEntry]] = {}
    for plan, s in zip(prep.plans, sums):
        for item_id, c in chunk_entries(plan, s):
            by_item.setdefault(item_id, []).append(c)
    files = [fmt.FileEntry(p.name, p.layout.size, p.layout.data_start, prep.comm.rank)
             for p in prep.plans]
    return by_item, files


def build_index(prep: PreparedSave, parts: Sequence[Entries]) -> bytes:
    """The index bytes from every rank's ``(chunks by item id, files)``."""
    chunks: dict[int, list[fmt.ChunkEntry]] = {}
    files: list[fmt.FileEntry] = []
    for by_item, fs in parts:
        for i, cs in by_item.items():
            chunks.setdefault(i, []).extend(cs)
        files.extend(fs)
    tensors = tuple(fmt.TensorEntry(key=it.path, kind=it.kind, dtype=it.dtype, shape=it.shape,
                                    chunks=_ordered(chunks.get(it.id, [])))
                    for it in prep.items)
    index = fmt.Index(tree=prep.tree, tensors=tensors, files=tuple(files), block_size=BLOCK_SIZE,
                      world_size=prep.comm.world_size, created=time.time(), metadata=prep.metadata,
                      library=f"shardsafe {__version__}")
    return fmt.encode_index(index, version=FORMAT_VERSION)


def _ordered(cs: list[fmt.ChunkEntry]) -> tuple[fmt.ChunkEntry, ...]:
    """Chunks in global-offset order (most tensors have one: skip the sort)."""
    return tuple(cs) if len(cs) < 2 else tuple(sorted(cs, key=lambda c: c.offsets))
