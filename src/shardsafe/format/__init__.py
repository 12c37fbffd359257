"""On-disk format (see docs/FORMAT.md): saves write version 2; version 1 stays readable.

Pure: no threads, no I/O, no torch.distributed.
"""

from __future__ import annotations

FORMAT_VERSION = 2  # what saves write (format.index_v2); format.index reads 1 and 2
INDEX_NAME = "index.json"
