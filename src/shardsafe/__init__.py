"""shardsafe: fast, safe, resharding checkpoints for training jobs.

Quick use::

    import shardsafe
    shardsafe.save({"model": model, "optim": opt, "step": step, "rng": shardsafe.RNGState()}, "ckpt")
    shardsafe.load("ckpt", {"model": model, "optim": opt, "rng": shardsafe.RNGState()})
"""

from __future__ import annotations

from ._version import __version__
from .api.async_save import async_save
from .api.delete import delete
from .api.load import LoadResult, load
from .api.save import save
from .engine.checkpointer import Checkpointer
from .engine.handle import SaveHandle
from .errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointTimeoutError,
    CorruptCheckpointError,
    StateMismatchError,
    StorageRequestError,
)
from .manager import CheckpointManager, ManagerOptions, RestoreInfo
from .per_rank import PerRank
from .rng import RNGState


def __getattr__(name: str):  # noqa: ANN202 - PEP 562 lazy attribute
    # imported lazily: it needs torch.distributed, which ``import shardsafe`` must not
    if name == "ModelOptimizerState":
        from .model_state import ModelOptimizerState

        return ModelOptimizerState
    raise AttributeError(f"module 'shardsafe' has no attribute {name!r}")


__all__ = [
    "__version__",
    "save",
    "async_save",
    "load",
    "delete",
    "Checkpointer",
    "SaveHandle",
    "LoadResult",
    "RNGState",
    "PerRank",
    "ModelOptimizerState",
    "CheckpointManager",
    "ManagerOptions",
    "RestoreInfo",
    "CheckpointError",
    "CorruptCheckpointError",
    "CheckpointNotFoundError",
    "StateMismatchError",
    "CheckpointTimeoutError",
    "StorageRequestError",
]
