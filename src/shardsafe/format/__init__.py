"""On-disk format (see docs/FORMAT.md): the index (``format.index``: saves write
``format.index.versions.WRITE_VERSION``, every earlier version stays readable), data and
block files, checksums, codecs, and the tree of non-tensor values.

Pure: no threads, no I/O, no torch.distributed.
"""

from __future__ import annotations

INDEX_NAME = "index.json"
