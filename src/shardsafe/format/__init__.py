"""On-disk format, version 1 (see docs/FORMAT.md). Pure: no threads, no I/O, no torch.distributed."""

from __future__ import annotations

FORMAT_VERSION = 1
INDEX_NAME = "index.json"
