"""The options of a ``Checkpointer``'s saves, validated once, in one place.

Every option composes with every other: a memory budget (``max_staging_bytes``) with
compression and with asynchronous saves, and both with incremental saves and with
copies (``engine.copies``). With compression the budget holds the blocks being coded as
well as the staging buffers. What cannot work is refused here, with a message naming
the options: a budget with compression needs staging units that hold whole checksum
blocks (``unit_size`` a multiple of ``BLOCK_SIZE``), because each block is coded
straight from the unit it was staged into (``engine.block_stream``), and room for one
unit and one block being coded.
``CheckpointManager`` builds its engine options through this class too, so the rules
live here and nowhere else; a per-call override (``async_save(max_staging_bytes=...)``)
goes through ``with_call``, which applies the same checks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..format.codec import Compression, check_compression
from ..format.datafile import ALIGN
from .buffers import slot_count
from .prepared import BLOCK_SIZE, UNIT_SIZE

CODING_SHARE = 16
"""With a budget and compression, one block may be coded at once per this many blocks of
budget (at least one)."""
CODING_COST = 2 * BLOCK_SIZE
"""Memory one block being coded may take (the coder's planes and its output); the budget
keeps this much per coding block free of staging buffers."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SaveOptions:
    """How a ``Checkpointer`` stages and writes (see its docstring for each option)."""

    unit_size: int = UNIT_SIZE
    """Bytes per staging/write unit (a positive multiple of 4096)."""

    pin_memory: bool | None = None
    """Page-lock staging buffers for CUDA copies (None: when CUDA is present)."""

    overlap_writes: bool = False
    """With ``staging="blocking"``, write units while later ones are still copied."""

    max_staging_bytes: int | None = None
    """Host memory an async save may stage into (None: a copy of the whole state)."""

    compression: Compression | None = None
    """Lossless compression of the larger tensors (None, ``"zstd"`` or ``"auto"``)."""

    def __post_init__(self) -> None:
        u = self.unit_size
        if isinstance(u, bool) or not isinstance(u, int) or u <= 0 or u % ALIGN:
            raise ValueError(f"unit_size must be a positive multiple of {ALIGN}, got {u!r}")
        for name in ("overlap_writes",):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.pin_memory is not None and not isinstance(self.pin_memory, bool):
            raise ValueError(f"pin_memory must be a bool or None, got {self.pin_memory!r}")
        if self.max_staging_bytes is not None:
            slot_count(self.max_staging_bytes, u)
        object.__setattr__(self, "compression", check_compression(self.compression))
        if self.max_staging_bytes is not None and self.compression is not None:
            if u % BLOCK_SIZE:
                raise ValueError(f"max_staging_bytes with compression needs unit_size to be a multiple "
                                 f"of the {BLOCK_SIZE}-byte checksum block (each block is coded from the "
                                 f"unit it is staged into), got unit_size={u}")
            least = u + CODING_COST
            if self.max_staging_bytes < least:
                raise ValueError(f"max_staging_bytes with compression must be at least {least} bytes "
                                 f"(one staging unit and room to code one block), got "
                                 f"{self.max_staging_bytes}")

    @property
    def slots(self) -> int | None:
        """Unit buffers of the budget (None: no budget). With compression the budget also
        holds the blocks being coded (``coding_window`` of them)."""
        if self.max_staging_bytes is None:
            return None
        room = self.max_staging_bytes
        if self.compression is not None:
            room -= self.coding_window * CODING_COST
        return max(1, room // self.unit_size)

    @property
    def coding_window(self) -> int:
        """Blocks coded at once under the budget (see ``CODING_SHARE``)."""
        budget = self.max_staging_bytes or 0
        return max(1, budget // (CODING_SHARE * BLOCK_SIZE))

    def with_call(self, **overrides: object) -> SaveOptions:
        """These options with one call's overrides (those not None), checked alike."""
        given = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(self, **given) if given else self  # type: ignore[arg-type]


__all__ = ["SaveOptions"]
