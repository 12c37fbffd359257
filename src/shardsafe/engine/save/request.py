"""A save, as one request: built once at the API edge, read by every stage below.

``shardsafe.save``, ``shardsafe.async_save``, ``Checkpointer.save``/``async_save`` and
the manager's tiers describe what they want saved as a ``SaveRequest`` (with its
``Replica``s); the engine (``save.saver.Saver.submit``) plans it once (``save.prepare``,
which takes the request itself) and drives it through one ``run()`` (``save.run``). No
layer below the edge takes the options as keywords again. (``shardsafe.dcp`` and
``shardsafe cp``, which commit saves of their own making, have their parts written by
``Saver.write_part``.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from ...format.codec import Compression
from .handle import SaveProgress

if TYPE_CHECKING:
    from .incremental import Baseline

StagingMode = Literal["blocking", "background"]
"""How ``async_save`` copies the state: on the caller's thread, or in the background."""
STAGING_MODES: tuple[StagingMode, ...] = get_args(StagingMode)


@dataclass(frozen=True, slots=True)
class Replica:
    """Also commit this rank's own checkpoint of ``state`` at ``path`` (a local path).

    Attributes:
        state: This rank's view of the saved state (the same tensors, e.g. DTensors as
            their local shards); saved by this rank alone.
        path: Where the replica is committed (replacing a checkpoint there).
        metadata: JSON-serialisable metadata of the replica's index.
        progress: Settles once the replica is committed or has failed (its ``handle``
            is what the requester waits on), independently of the save.
    """

    state: Mapping[str, Any]
    path: str
    metadata: Mapping[str, Any] | None = None
    progress: SaveProgress = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "progress", SaveProgress(self.path))


@dataclass(frozen=True, kw_only=True, slots=True)
class SaveRequest:
    """One save: what to save, where, and how (see ``shardsafe.save`` for each option).

    Attributes:
        state: The state (a mapping, or a single Stateful object).
        path: The checkpoint's directory or fsspec URL.
        overwrite: Replace a committed checkpoint at ``path``.
        metadata: JSON-serialisable user metadata of the index.
        storage_options: fsspec options for URLs.
        process_group: The group of a collective save (None: the Checkpointer's, or the world).
        timeout: Seconds a rank waits for the others.
        collective: False: this rank alone saves its own state.
        compression: None: the Checkpointer's default; ``"zstd"`` or ``"auto"``.
        baseline: Incremental saves: reference the chunks unchanged since its save.
        replicas: This rank's own checkpoints of views of the state, written from the
            same staged bytes (``save.replica``).
        staging: None for a synchronous save; else how an async save stages.
        max_staging_bytes: An async save's host staging budget (None: the Checkpointer's).
    """

    state: Any
    path: str
    overwrite: bool = False
    metadata: Mapping[str, Any] | None = None
    storage_options: dict | None = None
    process_group: Any = None
    timeout: float | None = None
    collective: bool | None = None
    compression: Compression | None = None
    baseline: Baseline | None = None
    replicas: tuple[Replica, ...] = ()
    staging: StagingMode | None = None
    max_staging_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.staging is not None and self.staging not in STAGING_MODES:
            raise ValueError(f"staging must be one of {STAGING_MODES}, got {self.staging!r}")


__all__ = ["STAGING_MODES", "Replica", "SaveRequest", "StagingMode"]
