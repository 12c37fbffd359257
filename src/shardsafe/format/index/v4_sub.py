"""The sub-block columns of a version 4 index (docs/FORMAT.md section 15.7).

An index that records sub-block checksums names their size in the global part's
``sub_block_size`` member and stores them in two optional columns: ``whole_sub_crc32c``
in the global part (for the tensors stored as one chunk, after ``whole_crc32c``) and
``sub_crc32c`` in each part (after ``crc32c``). Each holds ``format.sub_blocks.num_sub_blocks``
values per chunk, chunk after chunk, in the order of the chunk's block checksums. This
module names the columns, checks the member and the counts, and orders the values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..sub_blocks import SubBlocks, num_sub_blocks, sub_size_problem
from .rules import bad
from .v4_layout import ranges

WHOLE_SUB = "whole_sub_crc32c"
PART_SUB = "sub_crc32c"
I64 = np.int64


def sub_size_of(raw: dict[str, Any], block_size: int) -> int | None:
    """The global part's ``sub_block_size``, checked; None where it records no sub-blocks.

    Raises:
        CorruptCheckpointError: it is not a power of two of at least 4096 dividing ``block_size``.
    """
    if "sub_block_size" not in raw:
        return None
    problem = sub_size_problem(raw["sub_block_size"], block_size)
    if problem is not None:
        raise bad(problem)
    return int(raw["sub_block_size"])


def check_sub_count(col: np.ndarray, nbytes: np.ndarray, sub_size: int, what: str) -> np.ndarray:
    """``(rows + 1,)`` where each chunk's sub-blocks begin in ``col``, checked to hold
    exactly one value per sub-block of chunks of ``nbytes`` bytes.

    Raises:
        CorruptCheckpointError: ``col`` holds another number of values.
    """
    start = np.concatenate([[0], np.cumsum(num_sub_blocks(nbytes, sub_size))]).astype(I64)
    if len(col) != int(start[-1]):
        raise bad(f"{what}: column {PART_SUB if what.startswith('part') else WHOLE_SUB} holds {len(col)} "
                  f"values, its chunks have {int(start[-1])} sub-blocks of {sub_size} bytes")
    return start


def order_subs(sub_size: int, pieces: Sequence[np.ndarray], nbytes_pieces: np.ndarray,
               order: np.ndarray, nbytes: np.ndarray) -> SubBlocks:
    """The ``SubBlocks`` of a table whose rows are ``order`` of the pieces' rows.

    Args:
        sub_size: The sub-block size.
        pieces: Each piece's sub-block checksums, chunk after chunk.
        nbytes_pieces: The bytes of every chunk of the pieces, in the pieces' order.
        order: Row ``i`` of the table is chunk ``order[i]`` of the pieces.
        nbytes: The bytes of every chunk of the table (``nbytes_pieces[order]``).
    """
    n = num_sub_blocks(nbytes_pieces, sub_size)
    first = np.concatenate([[0], np.cumsum(n)]).astype(I64)[:-1]
    flat = np.concatenate(pieces) if len(pieces) else np.zeros(0, dtype=np.uint32)
    return SubBlocks.of(sub_size, flat[ranges(first[order], first[order] + n[order])], nbytes)


def runs_at(n: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The positions, in a column of runs of lengths ``n`` laid back to back, of runs ``keep``."""
    starts = np.concatenate([[0], np.cumsum(n)]).astype(I64)
    return ranges(starts[keep], starts[keep] + n[keep])


__all__ = ["PART_SUB", "WHOLE_SUB", "check_sub_count", "order_subs", "runs_at", "sub_size_of"]
