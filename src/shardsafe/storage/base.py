"""The storage protocol every backend implements (see tests/storage/test_conformance.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class Storage(Protocol):
    """Primitive file operations under string paths, in the backend's own syntax.

    Implementations must make ``write`` durable before it returns (fsync or a completed
    upload) and ``publish`` atomic: a reader sees either no file or the whole content.
    """

    #: True when ``rename`` of a directory is atomic (POSIX); False for object stores.
    atomic_rename: bool

    def join(self, *parts: str) -> str:
        """Joins path components."""
        ...

    def write(self, path: str, buffers: Sequence[memoryview]) -> None:
        """Creates or replaces ``path`` with the concatenation of ``buffers``, durably."""
        ...

    def publish(self, path: str, data: bytes) -> None:
        """Atomically creates ``path`` holding ``data`` (readers never see a partial file)."""
        ...

    def read(self, path: str) -> bytes:
        """Returns the whole content of a (small) file; FileNotFoundError if absent."""
        ...

    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        """Fills ``out`` with the bytes at ``[offset, offset + len(out))``; EOFError if short."""
        ...

    def size(self, path: str) -> int:
        """Size of a file in bytes; FileNotFoundError if absent."""
        ...

    def exists(self, path: str) -> bool:
        """True if ``path`` is an existing file or directory (prefix)."""
        ...

    def list(self, path: str) -> list[str]:
        """Sorted names directly under directory/prefix ``path``; empty if it is absent."""
        ...

    def makedirs(self, path: str) -> None:
        """Creates directory ``path`` and its parents (no-op on object stores)."""
        ...

    def delete(self, path: str) -> None:
        """Removes a file, or a directory/prefix recursively; no error if absent."""
        ...

    def rename(self, src: str, dst: str, *, exchange: bool = False) -> None:
        """Atomically renames ``src`` to ``dst`` (or swaps them); only if ``atomic_rename``."""
        ...

    def sync_dir(self, path: str) -> None:
        """Makes directory entries under ``path`` durable (fsync); no-op on object stores."""
        ...
