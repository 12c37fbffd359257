"""Storage backends: a small protocol with a local POSIX backend and an fsspec backend."""

from __future__ import annotations

from .base import RangeWriter, Storage
from .deadline import Deadline
from .local import LocalStorage


def storage_for(path: str, storage_options: dict | None = None, *,
                deadline: Deadline | None = None) -> tuple[Storage, str]:
    """Returns the backend for ``path`` and the path in that backend's terms.

    Local paths (and ``file://`` URLs) use the POSIX backend; other URLs go through fsspec,
    whose requests are retried, watched for stalls and, with a ``deadline`` (that of the
    save or load they serve), abandoned when it passes (``storage.runner``).
    """
    path = str(path)
    if "://" not in path:
        return LocalStorage(), path
    if path.startswith("file://"):
        return LocalStorage(), path[len("file://"):]
    from .fsspec import FsspecStorage  # optional dependency, imported only for URLs

    return FsspecStorage.for_url(path, storage_options or {}, deadline)


__all__ = ["Deadline", "RangeWriter", "Storage", "LocalStorage", "storage_for"]
