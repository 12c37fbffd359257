"""A storage that counts its requests: the local file system behind an fsspec protocol
``countfs://`` (so shardsafe reaches it through ``FsspecStorage``, as it reaches S3).

Every call shardsafe's fsspec backend makes is counted as the request an object store
would serve: ``ls`` a LIST, ``info``/``exists`` a HEAD, ``cat_file``/``cat_ranges`` GETs
(with the bytes they return, per file name). Each process counts its own requests
(``COUNTS``, ``BYTES``); importing this module registers the protocol.
"""

from __future__ import annotations

import collections
import posixpath
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

PROTOCOL = "countfs"
COUNTS: collections.Counter[str] = collections.Counter()
"""Requests by kind: ``list``, ``head``, ``get``, ``put``, ``delete``."""
BYTES: collections.Counter[str] = collections.Counter()
"""Bytes returned by GETs, per file name (``index.json``, ``data-r00000-000.safetensors``, ...)."""
GETS: collections.Counter[str] = collections.Counter()
"""GET requests per file name."""


def reset() -> None:
    COUNTS.clear()
    BYTES.clear()
    GETS.clear()


def url(path: str) -> str:
    """The ``countfs://`` URL of a local path."""
    return f"{PROTOCOL}://{path}"


class CountingFileSystem(LocalFileSystem):
    """The local file system, counting the requests an object store would see."""

    protocol = PROTOCOL

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, str) and path.startswith(PROTOCOL + "://"):
            path = path[len(PROTOCOL) + 3 :]
        return LocalFileSystem._strip_protocol(path)

    def _get(self, path: str, data: bytes) -> bytes:
        name = posixpath.basename(path)
        COUNTS["get"] += 1
        GETS[name] += 1
        BYTES[name] += len(data)
        return data

    def ls(self, path: str, detail: bool = False, **kw: Any) -> Any:
        COUNTS["list"] += 1
        return super().ls(path, detail=detail, **kw)

    def info(self, path: str, **kw: Any) -> Any:
        COUNTS["head"] += 1
        return super().info(path, **kw)

    def exists(self, path: str, **kw: Any) -> bool:
        COUNTS["head"] += 1
        return super().exists(path, **kw)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kw: Any) -> bytes:
        return self._get(path, super().cat_file(path, start=start, end=end, **kw))

    def cat_ranges(self, paths: list[str], starts: list[int], ends: list[int], **kw: Any) -> list[bytes]:
        return [self.cat_file(p, start=s, end=e) for p, s, e in zip(paths, starts, ends)]

    def pipe_file(self, path: str, value: bytes, **kw: Any) -> None:
        COUNTS["put"] += 1
        super().pipe_file(path, value, **kw)

    def rm_file(self, path: str) -> None:
        COUNTS["delete"] += 1
        super().rm_file(path)


fsspec.register_implementation(PROTOCOL, CountingFileSystem, clobber=True)
