"""``Reader``: DCP's ``StorageReader`` over any committed shardsafe checkpoint.

``read_metadata`` reads and validates the index (``engine.commit.read_index``) and
presents it as DCP's ``Metadata`` (``translate.view``): every tensor with its saved
chunks, every other value as a byte item. ``read_data`` reads each tensor region DCP
asks for with the engine's reader (only the checksum blocks that hold it, each verified;
compressed blocks decoded), straight into DCP's target where it is contiguous host
memory of the stored dtype. A damaged block raises ``CorruptCheckpointError`` naming the
file and the key; DCP hands it to every rank inside its ``CheckpointException``.

Byte items (values that are not tensors): DCP's planner deserialises whatever a reader
returns for one with full unpickling, so ``Reader`` returns only bytes that shardsafe
serialised itself from a typed value it decoded from the index, and refuses a stored
pickle by name unless ``allow_pickle=True`` (``byte_items``).
"""

from __future__ import annotations

import io
import os
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from ..engine.commit.diagnose import read_index_explained
from ..engine.load.match import TensorTarget
from ..engine.load.placers import Placement
from ..engine.load.reader import ChunkReader
from ..engine.load.run import read_placement
from ..errors import CheckpointError
from ..format.index.objects import Index
from ..storage import storage_for
from ..values.torch import torch_dtype_name
from . import byte_items, translate


class Reader(StorageReader):
    """Makes ``dcp.load`` read a shardsafe checkpoint, resharded to the target's layout.

    Reads checkpoints written by ``Writer`` and by ``shardsafe.save`` or a
    ``CheckpointManager`` alike: ``dcp.load(state_dict, storage_reader=Reader(path))``
    on every rank fills ``state_dict`` in place (each rank reads only the blocks its
    shards need, and verifies them).

    Values that are not tensors reach DCP as bytes that shardsafe serialised from the
    typed value in the index, so nothing from the checkpoint is unpickled. A value that a
    ``Writer`` kept as DCP's pickle (one PyTorch's restricted unpickler refused), a
    ``bytes`` value that a checkpoint's DCP record does not name as a value, and the byte
    items of checkpoints written by earlier versions of ``Writer`` are treated as pickles:
    a load that needs one raises ``CheckpointError`` naming it, unless ``allow_pickle``.

    Args:
        path: The checkpoint's directory or fsspec URL (``dcp.load``'s ``checkpoint_id``
            replaces it when given).
        storage_options: Passed to fsspec for URLs.
        allow_pickle: Hand DCP the stored pickles too. DCP unpickles them with
            ``torch.load(weights_only=False)``, which can run code from the checkpoint:
            only for checkpoints you trust.
    """

    def __init__(self, path: str | os.PathLike[str], *,
                 storage_options: dict[str, Any] | None = None, allow_pickle: bool = False) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.storage_options = storage_options
        self.allow_pickle = allow_pickle
        self._index: Index | None = None
        self._view: translate.DcpView | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """A new load begins (from ``checkpoint_id`` when given)."""
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._index, self._view = None, None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Any path or fsspec URL can be read."""
        return isinstance(checkpoint_id, (str, os.PathLike))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's index as DCP's ``Metadata`` (every rank reads and validates it).

        Raises:
            CheckpointNotFoundError: No committed checkpoint at the path (the message says
                what the path is instead).
            CorruptCheckpointError: The index (or its DCP record) is damaged.
        """
        storage, spath = storage_for(self.path, self.storage_options)
        self._index = read_index_explained(storage, spath, self.path)
        self._view = translate.view(self._index, self.path)
        return self._view.metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        if self._view is None:  # DCP handed us metadata read elsewhere
            self.read_metadata()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Reads every item of ``plan`` (verified), then hands each to ``planner``."""
        assert self._index is not None and self._view is not None, "read_metadata did not run"
        targets: list[TensorTarget] = []
        commits: list[tuple[ReadItem, Any, Any]] = []
        for ri in plan.items:
            if ri.type == LoadItemType.BYTE_IO:
                planner.load_bytes(ri, io.BytesIO(self._bytes(ri.storage_index.fqn)))
                continue
            tid = self._view.tensors[ri.storage_index.fqn]
            entry = self._index.tensors[tid]
            target = planner.resolve_tensor(ri).detach()
            offsets = tuple(int(a) + int(b) for a, b in zip(ri.storage_index.offset, ri.storage_offsets))
            into = target
            if torch_dtype_name(target.dtype) != entry.dtype:  # DCP casts; raw bytes cannot
                into = torch.empty(tuple(ri.lengths), dtype=getattr(torch, entry.dtype))
            targets.append(TensorTarget(entry, into, offsets=offsets))
            commits.append((ri, target, into))
        storage, spath = storage_for(self.path, self.storage_options)
        read_placement(ChunkReader(storage, spath, self._index), Placement(self._index, targets))
        for ri, target, into in commits:
            if into is not target:
                target.copy_(into)
            planner.commit_tensor(ri, target)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _bytes(self, fqn: str) -> bytes:
        """What DCP deserialises for the byte item ``fqn``."""
        assert self._view is not None
        value = self._view.values[fqn]
        if fqn in self._view.pickles:
            if not self.allow_pickle:
                raise CheckpointError(
                    f"{self.path!r}: {fqn!r} is stored as bytes that DCP would unpickle with "
                    f"torch.load(weights_only=False), which can run code from the checkpoint (a "
                    f"value kept as DCP's pickle, or bytes its DCP record does not name as a "
                    f"value); pass Reader(path, allow_pickle=True) only for checkpoints you trust")
            return value
        if _holds_tensor(value):
            raise CheckpointError(f"{self.path!r}: {fqn!r} is a {type(value).__name__} holding tensors, "
                                  f"which DCP would load as one serialised value; load it with "
                                  f"shardsafe.load instead")
        return byte_items.serialise(value)


def _holds_tensor(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, dict):
        return any(_holds_tensor(v) for v in x.values())
    if isinstance(x, (list, tuple, set, frozenset)):
        return any(_holds_tensor(v) for v in x)
    return False


__all__ = ["Reader"]
