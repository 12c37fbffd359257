"""The storage protocol every backend implements (see tests/storage/test_conformance.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable


class RangeWriter(Protocol):
    """One file being written in disjoint ranges, from any threads (``Storage.open_writer``).

    Attributes:
        direct: True while aligned ranges bypass the page cache (callers then hand it
            page-aligned buffers; see ``storage.local.LocalFileWriter``).
        size: The file's final size: ``close`` truncates to it. A writer that learns the
            size only at the end (a block file being coded) opens with an upper bound and
            lowers it before ``close``.
    """

    direct: bool
    size: int

    def write_at(self, offset: int, data: memoryview) -> None:
        """Writes ``data`` at ``offset`` (ranges may extend past the size: ``close`` truncates)."""
        ...

    def write_gather(self, offset: int, views: Sequence[memoryview]) -> None:
        """Writes ``views`` back to back from ``offset``."""
        ...

    def close(self, *, sync: bool = True) -> None:
        """Truncates the file to its size and (by default) makes it durable, then closes it."""
        ...

    def abort(self) -> None:
        """Closes without making the file durable (the caller deletes it)."""
        ...


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

    def open_writer(self, path: str, size: int) -> RangeWriter | None:
        """Creates ``path`` (``size`` bytes) for ranged writes, or returns None.

        None means the backend takes whole files only (object stores): the caller then
        hands the complete file to ``write``. The backend starts no threads: callers
        write ranges concurrently from their own (the engine's I/O pool).
        """
        ...

    def write(self, path: str, buffers: Sequence[memoryview]) -> None:
        """Creates or replaces ``path`` with the concatenation of ``buffers``, durably."""
        ...

    def write_stream(self, path: str, size: int | None, pieces: Iterable[memoryview]) -> None:
        """Creates or replaces ``path`` (``size`` bytes) from ``pieces`` in order, durably.

        The pieces are written as they come (a multipart upload on object stores), so a
        file of any size costs the memory of one piece; the iterable may produce them
        lazily (``shardsafe cp`` reads and verifies each). ``size`` None: not known in
        advance (a block file being coded); the file ends with the last piece. An error
        from the iterable propagates and leaves no complete file (the caller deletes what
        is left).
        """
        ...

    def publish(self, path: str, data: bytes) -> None:
        """Atomically creates ``path`` holding ``data`` (readers never see a partial file)."""
        ...

    def sibling_file(self, path: str, directory: str, name: str) -> str:
        """The path of file ``name`` in directory ``directory`` next to ``path`` (a
        checkpoint's reference to a data file of another checkpoint in the same parent).

        ``directory`` and ``name`` are plain names (checked by the index decoder). Local
        backends refuse a ``directory`` that is a symlink or not a directory
        (``CorruptCheckpointError``) and raise FileNotFoundError if it is absent; object
        stores have no links, so there it is a plain prefix.
        """
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

    def is_link(self, path: str) -> bool:
        """True if ``path`` is a symbolic link (object stores have none). Listing and
        deleting never go through one (docs/FORMAT.md section 9)."""
        ...

    def is_directory(self, path: str) -> bool:
        """True if ``path`` is a directory (prefix) itself: not a symbolic link to one, not a
        file, FIFO or device, and present."""
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
