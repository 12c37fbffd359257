"""The options of a ``Checkpointer``'s saves, validated once, in one place.

Every option composes with every other: a memory budget (``max_staging_bytes``) with
compression and with asynchronous saves, and both with incremental saves and with
replicas (``save.replica``). With compression the budget holds the blocks being coded
and the block file's write chunks as well as the staging units. What cannot work is
refused here, with a message naming the options: a budget with compression needs units
that hold whole checksum blocks (``unit_size`` a multiple of ``BLOCK_SIZE``), because
each block is coded straight from the unit it was staged into, and room for one unit,
one block being coded and the block file's chunks (``least_budget``).
``CheckpointManager`` builds its engine options through this class too, so the rules
live here and nowhere else; a request's overrides (``max_staging_bytes``,
``compression``) go through ``with_call``, which applies the same checks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...format.codec import Compression, check_compression
from ...format.datafile import ALIGN
from ... import knobs
from .. import io_pool
from ..buffers import slot_count
from .assembly import ASSEMBLY_BYTES
from .units import BLOCK_SIZE, UNIT_SIZE

CODING_SHARE = 16
"""With a budget and compression, one block may be coded at once per this many blocks of
budget (at least one)."""
CODING_COST = 2 * BLOCK_SIZE
"""Memory one block being coded may take (the coder's planes and its output); the budget
keeps this much per coding block free of staging buffers."""
SYNC_UNIT_MAX = 64 << 20
"""The largest unit (and bounce buffer) of a sync save."""


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
        if not isinstance(self.overlap_writes, bool):
            raise ValueError(f"overlap_writes must be a bool, got {self.overlap_writes!r}")
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
            least = self.least_budget
            if self.max_staging_bytes < least:
                raise ValueError(f"max_staging_bytes with compression must be at least {least} bytes "
                                 f"(one staging unit, room to code one block and the block file's "
                                 f"write chunks), got {self.max_staging_bytes}")

    @property
    def least_budget(self) -> int:
        """The smallest ``max_staging_bytes`` these options allow with compression."""
        return self.unit_size + CODING_COST + ASSEMBLY_BYTES

    @property
    def slots(self) -> int | None:
        """Unit buffers of the budget (None: no budget). With compression the budget also
        holds the blocks being coded (``coding_window`` of them) and the block file's chunks."""
        if self.max_staging_bytes is None:
            return None
        room = self.max_staging_bytes
        if self.compression is not None:
            room -= self.coding_window * CODING_COST + ASSEMBLY_BYTES
        return max(1, room // self.unit_size)

    @property
    def coding_window(self) -> int:
        """Blocks coded at once: under a budget one per ``CODING_SHARE`` blocks of it."""
        if self.max_staging_bytes is None:
            return knobs.copy_threads()
        return max(1, self.max_staging_bytes // (CODING_SHARE * BLOCK_SIZE))

    def with_call(self, **overrides: object) -> SaveOptions:
        """These options with one request's overrides (those not None), checked alike."""
        given = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(self, **given) if given else self  # type: ignore[arg-type]


def sync_bounce(nbytes: int, unit_size: int, compression: str | None) -> tuple[int, int]:
    """The bounce buffers of a sync save of ``nbytes``: ``(size, count)``.

    ``count`` lets every I/O thread write one while the copy threads fill others; ``size``
    is a multiple of ``unit_size`` (and, with compression, of the checksum block) of at
    most ``SYNC_UNIT_MAX``, with all of them together at most about a quarter of the state
    (they are kept between saves). Measured on the project VM: direct writes of 64 MiB
    from 4 threads reach ~1.3x the throughput of 16 MiB ones (more bytes in flight).
    """
    count = io_pool.io_threads() + knobs.copy_threads()
    step = unit_size if compression is None else _lcm(unit_size, BLOCK_SIZE)
    want = nbytes // (4 * count)
    units = max(1, min(SYNC_UNIT_MAX // step, want // step))
    return units * step, count


def _lcm(a: int, b: int) -> int:
    from math import gcd

    return a * b // gcd(a, b)


__all__ = ["CODING_COST", "SaveOptions", "sync_bounce"]
