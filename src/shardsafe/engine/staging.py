"""Copy tensors into a data file's host buffer and checksum the result."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import tensors
from ..format.checksum import block_checksums
from ..plan.layout import FilePlan


def stage(plan: FilePlan, out: np.ndarray) -> None:
    """Writes the header and every item's bytes into ``out`` (uint8, ``plan.layout.size``)."""
    header = plan.layout.header
    out[: len(header)] = np.frombuffer(header, dtype=np.uint8)
    for it, off in zip(plan.items, plan.layout.offsets):
        src = tensors.host_bytes(it.value)
        out[off : off + src.size] = src


def checksums(plan: FilePlan, buf: np.ndarray, block_size: int) -> list[list[int]]:
    """Block checksums of every item of ``plan`` as staged in ``buf``."""
    mv = memoryview(buf)
    return [block_checksums(mv[off : off + it.nbytes], block_size)
            for it, off in zip(plan.items, plan.layout.offsets)]


def total_bytes(plans: Sequence[FilePlan]) -> int:
    return sum(p.layout.size for p in plans)
