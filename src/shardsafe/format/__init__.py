"""On-disk format (see docs/FORMAT.md): saves write version 2; version 1 stays readable.

Pure: no threads, no I/O, no torch.distributed.
"""

from __future__ import annotations

INDEX_NAME = "index.json"
