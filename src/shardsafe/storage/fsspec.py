"""fsspec backend: object stores (``s3://``, ``gs://``, ...) and any other fsspec filesystem.

Object stores have no atomic rename, so ``atomic_rename`` is False and the commit rule
of ``engine.commit`` applies: data objects are uploaded under the final prefix and the
index object is written last. A single PUT is atomic on every object store, which makes
``publish`` a plain upload.

Large files are uploaded as multipart uploads whose parts go up concurrently (s3fs'
``pipe_file``); each part is copied out of the staged buffers only when it is sent, so
memory stays at ``part_size * max_concurrency`` above the staged state. Reads are ranged
GETs of just the wanted bytes; long ranges are split into parts fetched concurrently.
"""

from __future__ import annotations

import functools
import logging
import posixpath
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from .._numbers import ceil_div

try:
    import fsspec
except ImportError as e:  # the optional dependency of URL paths
    raise ImportError(f"URL paths need fsspec ({e}); install 'shardsafe[s3]' for S3") from None

log = logging.getLogger("shardsafe")

PART_SIZE = 32 << 20  # multipart part / ranged-read piece (S3 needs >= 5 MiB per part)
MAX_CONCURRENCY = 8  # parts in flight per file
MAX_PARTS = 10_000  # S3's limit on parts per multipart upload

# Protocols whose listings must not be cached: another process (another rank, a crashed
# save, a concurrent `gc`) changes them behind our back, and a stale listing would make
# a committed checkpoint look absent.
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss"})


_F = TypeVar("_F", bound=Callable[..., Any])


def _backend_errors(protocols: set[str]) -> tuple[type[BaseException], ...]:
    """Client errors that the filesystem lets through untranslated (s3fs: botocore's own)."""
    if protocols & {"s3", "s3a"}:
        from botocore.exceptions import BotoCoreError  # s3fs maps only ClientError to OSError

        return (BotoCoreError,)
    return ()


def _os_errors(method: _F) -> _F:
    """Re-raises backend client errors (no credentials, endpoint unreachable) as OSError.

    Callers of a Storage handle OSError; a botocore exception escaping would be a
    traceback in the CLI and an unexpected type for the library.
    """

    @functools.wraps(method)
    def wrapper(self: FsspecStorage, path: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, path, *args, **kwargs)
        except self._backend_errors as e:
            raise OSError(f"{path}: {type(e).__name__}: {e}") from e

    return wrapper  # type: ignore[return-value]


def _protocols(fs: Any) -> set[str]:
    p = fs.protocol
    return {p} if isinstance(p, str) else set(p)


class _Parts:
    """Sliceable view of the concatenation of ``buffers`` that copies only what is sliced.

    s3fs' ``pipe_file`` needs ``len(data)`` and ``data[a:b]`` (one part at a time); handing
    it this instead of ``b"".join(buffers)`` avoids a second copy of the whole file.
    """

    def __init__(self, buffers: Sequence[memoryview]) -> None:
        self.buffers = [memoryview(b).cast("B") for b in buffers]
        self.starts = []
        pos = 0
        for b in self.buffers:
            self.starts.append(pos)
            pos += len(b)
        self.size = pos

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, s: slice) -> bytes:
        start, stop, step = s.indices(self.size)
        if step != 1:
            raise ValueError("only contiguous slices are supported")
        out = bytearray()
        for b, b0 in zip(self.buffers, self.starts):
            lo, hi = max(start, b0), min(stop, b0 + len(b))
            if lo < hi:
                out += b[lo - b0 : hi - b0]
        return bytes(out)


class FsspecStorage:
    """Storage on an fsspec filesystem, with object-store commit semantics.

    Args:
        fs: The fsspec filesystem instance.
        part_size: Bytes per multipart part and per concurrent ranged read.
        max_concurrency: Parts uploaded or downloaded at once for one file.
    """

    atomic_rename = False

    def __init__(self, fs: Any, *, part_size: int = PART_SIZE,
                 max_concurrency: int = MAX_CONCURRENCY) -> None:
        if part_size < 5 << 20:
            raise ValueError(f"part_size must be at least 5 MiB (S3's minimum), got {part_size}")
        self.fs = fs
        self.part_size = part_size
        self.max_concurrency = max(1, max_concurrency)
        protos = _protocols(fs)
        self._object_store = bool(protos & _OBJECT_STORES)
        self._s3 = bool(protos & {"s3", "s3a"})
        self._backend_errors = _backend_errors(protos)

    @classmethod
    def for_url(cls, url: str, storage_options: dict | None = None) -> tuple[FsspecStorage, str]:
        """The backend for ``url`` and the path in the filesystem's terms.

        ``storage_options`` go to the fsspec filesystem (e.g. ``endpoint_url``, ``key``,
        ``secret`` for s3fs). Listing caches are off for object stores unless the options
        say otherwise.
        """
        opts = dict(storage_options or {})
        protocol = url.split("://", 1)[0]
        if protocol in _OBJECT_STORES:
            opts.setdefault("use_listings_cache", False)
        try:
            fs, path = fsspec.core.url_to_fs(url, **opts)
        except ImportError as e:
            raise ImportError(f"{protocol}:// needs an fsspec implementation ({e}); for S3 "
                              f"install 'shardsafe[s3]'") from None
        return cls(fs), path.rstrip("/") or path

    def join(self, *parts: str) -> str:
        return posixpath.join(*parts)

    def sibling_file(self, path: str, directory: str, name: str) -> str:
        # object stores have no links; the names are plain (checked by the index decoder)
        return posixpath.join(posixpath.dirname(path.rstrip("/")), directory, name)

    # ------------------------------------------------------------------ writing
    def open_writer(self, path: str, size: int) -> None:
        """None: objects are uploaded whole (or as one multipart upload) by ``write``."""
        return None

    @_os_errors
    def write(self, path: str, buffers: Sequence[memoryview]) -> None:
        data = _Parts(buffers)
        if self._s3 and data.size >= 2 * self.part_size:
            # s3fs uploads the parts of a multipart upload concurrently and completes it
            # only when all arrived: the object appears whole or not at all.
            part = max(self.part_size, ceil_div(data.size, MAX_PARTS))
            self.fs.pipe_file(path, data, chunksize=part, max_concurrency=self.max_concurrency)
        else:
            self.fs.pipe_file(path, data[:])

    @_os_errors
    def write_stream(self, path: str, size: int | None, pieces: Iterable[memoryview]) -> None:
        # fsspec's buffered file uploads a part whenever part_size bytes are in (s3fs: a
        # multipart upload completed on close); discard() abandons it on an error
        f = self.fs.open(path, "wb", block_size=max(self.part_size, ceil_div(size or 0, MAX_PARTS)))
        written = 0
        try:
            for piece in pieces:
                written += f.write(memoryview(piece).cast("B"))
            if size is not None and written != size:
                raise ValueError(f"{path}: {written} bytes written, {size} expected")
        except BaseException:
            # abandon the upload where the file can (s3fs); elsewhere the caller deletes it
            discard = getattr(f, "discard", None)
            (discard or f.close)()
            raise
        f.close()

    @_os_errors
    def publish(self, path: str, data: bytes) -> None:
        # one PUT: object stores never expose a partially written object
        self.fs.pipe_file(path, bytes(data))

    # ------------------------------------------------------------------ reading
    @_os_errors
    def read(self, path: str) -> bytes:
        return self.fs.cat_file(path)

    @_os_errors
    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        out = memoryview(out).cast("B")
        n = len(out)
        if n == 0:
            return
        starts = list(range(offset, offset + n, self.part_size))
        ends = [min(s + self.part_size, offset + n) for s in starts]
        for i in range(0, len(starts), self.max_concurrency):
            batch = slice(i, i + self.max_concurrency)
            if len(starts) == 1:
                pieces = [self.fs.cat_file(path, start=starts[0], end=ends[0])]
            else:
                pieces = self.fs.cat_ranges([path] * len(starts[batch]), starts[batch],
                                            ends[batch], on_error="raise")
            for s, e, data in zip(starts[batch], ends[batch], pieces):
                if len(data) != e - s:
                    raise EOFError(f"{path}: object ends before byte {offset + n}")
                out[s - offset : e - offset] = data

    @_os_errors
    def size(self, path: str) -> int:
        info = self.fs.info(path)
        if info.get("type") == "directory":
            raise FileNotFoundError(f"{path} is a directory/prefix, not an object")
        return int(info["size"])

    @_os_errors
    def modified(self, path: str) -> float | None:
        """Last-modified time (POSIX seconds) of an object, or None when unknown."""
        try:
            value = self.fs.modified(path)
        except (NotImplementedError, FileNotFoundError, IsADirectoryError):
            return None
        return value.timestamp() if value is not None else None

    @_os_errors
    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    @_os_errors
    def list(self, path: str) -> list[str]:
        try:
            entries = self.fs.ls(path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        prefix = path.rstrip("/") + "/"
        names = {e.rstrip("/")[len(prefix):] if e.startswith(prefix) else posixpath.basename(e.rstrip("/"))
                 for e in entries}
        names.discard("")
        if names == {posixpath.basename(path.rstrip("/"))} and not self._is_dir(path):
            return []  # ls of a single object returns the object itself
        return sorted(names)

    def is_link(self, path: str) -> bool:
        return False  # object stores and fsspec's remote filesystems have no links

    @_os_errors
    def is_directory(self, path: str) -> bool:
        return self._is_dir(path)

    def _is_dir(self, path: str) -> bool:
        try:
            return self.fs.info(path).get("type") == "directory"
        except FileNotFoundError:
            return False

    @_os_errors
    def incomplete_uploads(self, path: str) -> list[tuple[str, str, float | None]]:
        """Unfinished multipart uploads under ``path``: ``(key path, upload id, start time)``.

        A save killed mid-upload leaves these behind; they are invisible to listings but
        hold storage. Empty for filesystems other than S3.
        """
        if not self._s3:
            return []
        bucket, _, prefix = path.partition("/")
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        out = []
        for u in self.fs.list_multipart_uploads(bucket):
            if u["Key"].startswith(prefix):
                started = u.get("Initiated")
                out.append((f"{bucket}/{u['Key']}", u["UploadId"],
                            started.timestamp() if started is not None else None))
        return out

    @_os_errors
    def abort_upload(self, key_path: str, upload_id: str) -> None:
        """Aborts an unfinished multipart upload (see ``incomplete_uploads``)."""
        bucket, _, key = key_path.partition("/")
        self.fs.abort_mpu(bucket, key, upload_id)

    # ------------------------------------------------------------------ namespace
    @_os_errors
    def makedirs(self, path: str) -> None:
        if not self._object_store:  # object stores have no directories to create
            self.fs.makedirs(path, exist_ok=True)

    @_os_errors
    def delete(self, path: str) -> None:
        try:
            if self._is_dir(path):
                self.fs.rm(path, recursive=True)
            else:
                self.fs.rm_file(path)
        except FileNotFoundError:
            pass

    def rename(self, src: str, dst: str, *, exchange: bool = False) -> None:
        raise OSError(f"{type(self.fs).__name__} has no atomic rename ({src} -> {dst}); "
                      f"object stores commit by writing the index last")

    def sync_dir(self, path: str) -> None:
        # uploads are durable when they return; there is no directory entry to flush
        return None
