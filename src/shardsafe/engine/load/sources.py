"""Sources: the first stage of a load, byte ranges of a checkpoint's files from any storage.

A ``FileSource`` reads ranges of one checkpoint's data and block files (references to an
earlier step's files resolved by ``commit.locations``) straight into the memory it is
given: a target's own bytes, a staging buffer, or the calling thread's scratch buffer.
Small ranges are not read one by one: ``groups`` orders them by file and offset and
joins neighbours into reads of at most ``GROUP_MAX`` bytes (the one coalescer,
``plan.load_plan.coalesce``, which the index reads use too).

A short file is reported as damaged, a missing one as missing
(``CorruptCheckpointError`` naming the file and the key), so the load can tell a
checkpoint deleted meanwhile from a damaged one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..._scratch import ScratchBuffer
from ...errors import CorruptCheckpointError
from ...plan.load_plan import coalesce
from ...storage.base import Storage
from ..commit.locations import Locator

MAX_GAP = 64 << 10  # small ranges further apart than this are not read together
GROUP_MAX = 4 << 20  # bytes per coalesced read (each I/O thread keeps a scratch buffer this big)

scratch = ScratchBuffer(GROUP_MAX).get
"""The calling thread's scratch buffer of at least ``n`` bytes (``scratch(n)``): its pages
stay faulted in between loads."""


class FileSource:
    """Byte ranges of the files of the checkpoint at ``path`` on ``storage``."""

    def __init__(self, storage: Storage, path: str) -> None:
        self.storage = storage
        self.path = path
        self._file = Locator(storage, path)  # index file name -> backend path (references too)

    def read(self, file: str, offset: int, out: memoryview, key: Callable[[], str]) -> None:
        """Fills ``out`` with the bytes of ``file`` from ``offset`` on.

        Raises:
            CorruptCheckpointError: The file is shorter than the range, or missing (``key()``
                names the tensor in the message).
        """
        try:
            self.storage.read_into(self._file(file), offset, out)
        except EOFError:
            raise CorruptCheckpointError("data file is truncated", file=file, key=key()) from None
        except FileNotFoundError:  # the load tells a deleted checkpoint from a damaged one
            raise CorruptCheckpointError("data file is missing", file=file, key=key()) from None


def groups(files: Sequence[int] | np.ndarray, offsets: Sequence[int] | np.ndarray,
           sizes: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, bounds)``: ranges ``order[bounds[g]:bounds[g + 1]]`` are read as group
    ``g``, one request of at most ``GROUP_MAX`` bytes (``plan.load_plan.coalesce``)."""
    return coalesce(files, offsets, sizes, GROUP_MAX, MAX_GAP)


__all__ = ["FileSource", "GROUP_MAX", "MAX_GAP", "groups", "scratch"]
