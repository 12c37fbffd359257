"""What a save has decided before any byte is copied, and the index built from it.

``PreparedSave`` is the plain data the save phases hand each other; ``build_index``
turns it and every rank's chunk entries into the index bytes. Both the single-process
pipeline (``engine.pipeline``) and the collective modules (``engine.plan_exchange``,
``engine.two_phase_commit``) use this module, which imports neither of them: data
flows one way.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._version import __version__
from ..comm import Channel, Comm
from ..format.index.container import check_metadata  # noqa: F401 - the save paths import it from here
from ..format.index.versions import WRITE_VERSION, encode_columnar
from ..format.tree import Node
from ..plan.flatten import TensorItem
from ..plan.layout import FilePlan
from ..storage import Storage
from . import commit
from .entries import CodedFile, Entries, columnar_index, from_block_files, from_plans, join
from .incremental import Baseline, Delta

BLOCK_SIZE = 16 << 20  # checksum block: partial (resharded) reads verify whole blocks
UNIT_SIZE = 16 << 20  # write/staging unit: big enough for full-speed direct I/O, small
#                       enough that writes start while later units are still staged
CODED_MIN = 64 << 10  # with compression, items from this size go to the block file


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
        baseline: The manager's record of its previous save (incremental saves), advanced
            once this save commits.
        split: This rank's chunks divided into written and referenced (incremental saves).
        compression: How this rank codes the items of ``coded`` (None: nothing is coded).
        coded: The items this rank compresses, one plan per block file it begins
            (``engine.block_writer`` writes them, in parts if large); a plan's layout
            places its items in the staging image only (a block file has no safetensors
            header).
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
    baseline: Baseline | None = None
    split: Delta | None = None
    compression: str | None = None
    coded: list[FilePlan] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Bytes this rank writes (data files, headers included; compressed items at their raw size)."""
        return sum(p.layout.size for p in self.plans) + sum(p.layout.size for p in self.coded)

    def file_path(self, plan: FilePlan) -> str:
        """Where the data file of ``plan`` is written (inside the working directory)."""
        return self.path_of(plan.name)

    def path_of(self, name: str) -> str:
        """Where the data file ``name`` is written (inside the working directory)."""
        return self.storage.join(self.txn.workdir, name)


def local_entries(prep: PreparedSave, sums: Sequence[list[list[int]]],
                  coded: Sequence[CodedFile] = ()) -> Entries:
    """This rank's chunk and file entries (columns), given the block checksums of its data
    files and what its block files hold, plus the chunks it references (incremental saves)."""
    plain = from_plans(prep.plans, sums, prep.comm.rank, prep.split.refs if prep.split else ())
    if not coded:
        return plain
    return join([plain, from_block_files(coded, prep.comm.rank)])


def split_coded(items: Sequence[TensorItem], compression: str | None) -> tuple[list[TensorItem], list[TensorItem]]:
    """This rank's items as (stored raw in its safetensors file, compressed in its block file).

    With compression, every item of at least ``CODED_MIN`` bytes is compressed; smaller
    ones stay raw (coding them saves next to nothing, and they stay memory-mappable).
    An incremental save passes only the items it writes (``Delta.write``).
    """
    if compression is None:
        return list(items), []
    return ([it for it in items if it.nbytes < CODED_MIN], [it for it in items if it.nbytes >= CODED_MIN])


def build_index(prep: PreparedSave, parts: Sequence[Entries]) -> bytes:
    """The index bytes (format ``WRITE_VERSION``) from every rank's entries, built as columns throughout.

    Raises:
        CheckpointError: the ranks' chunks do not hold exactly each tensor's elements.
    """
    index = columnar_index(prep.items, parts, BLOCK_SIZE, tree=prep.tree,
                           world_size=prep.comm.world_size, created=time.time(),
                           metadata=prep.metadata, library=f"shardsafe {__version__}")
    return encode_columnar(index, WRITE_VERSION)
