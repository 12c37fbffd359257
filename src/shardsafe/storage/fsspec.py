"""fsspec backend: object stores (``s3://``, ``gs://``, ...) and any other fsspec filesystem.

Object stores have no atomic rename, so ``atomic_rename`` is False and the commit rule
of ``engine.commit`` applies: data objects are uploaded under the final prefix and the
index object is written last. A single PUT is atomic on every object store, which makes
``publish`` a plain upload.

Every request goes through ``storage.runner``: retried on throttling, server errors,
resets, responses cut short and timeouts (jittered exponential backoff honouring
``Retry-After``, within a per-request budget), abandoned when it stalls, and bounded by
the deadline of the save or load that made it (``storage_for(..., deadline=...)``). For
S3 the client's own retry layers are turned off (botocore and s3fs would multiply the
attempts and hide ``Retry-After``), its connect and read timeouts are set to the stall
timeout, and its connections are watched for stalled uploads (``storage.stall``).

Large files go up as S3 multipart uploads whose parts are sent concurrently (the next
as soon as any has been stored) and retried one by one; a failed upload is aborted
(``storage.multipart``). Each part is copied out
of the staged buffers only when it is sent, so memory stays at ``part_size *
max_concurrency`` above the staged state. Reads are ranged GETs of just the wanted
bytes; long ranges are split into parts fetched concurrently (smaller towards the end of
the range), each retried on its own, the next part asked for as soon as any part has
arrived (``storage.batch``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import posixpath
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from .. import knobs
from .._numbers import ceil_div
from ..errors import CheckpointError
from . import batch, multipart
from .deadline import Deadline
from . import runner as _runner
from .runner import Request, Runner
from .retry import RetryPolicy
from .s3_client import endpoint_of, s3_options, watch_of
from .tail import TailPolicy

try:
    import fsspec
    from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
except ImportError as e:  # the optional dependency of URL paths
    raise ImportError(f"URL paths need fsspec ({e}); install 'shardsafe[s3]' for S3") from None

log = logging.getLogger("shardsafe")

PART_SIZE = 32 << 20  # multipart part / ranged-read piece (S3 needs >= 5 MiB per part)
MAX_CONCURRENCY = 8  # parts in flight per file
MAX_PARTS = 10_000  # S3's limit on parts per multipart upload
UNSIZED_PUT_PARTS = 2  # a stream of unknown size that ends before filling this many parts: one PUT
READ_CHUNK = 1 << 20  # bytes of a ranged GET's body read at a time (each is progress)

# Protocols whose listings must not be cached: another process (another rank, a crashed
# save, a concurrent `gc`) changes them behind our back, and a stale listing would make
# a committed checkpoint look absent.
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss"})


_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")


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
        policy: Retries and stall timeout of every request (default: from the
            environment, ``RetryPolicy.from_knobs``).
        deadline: The deadline of the save or load this backend serves, if any.
    """

    atomic_rename = False

    def __init__(self, fs: Any, *, part_size: int = PART_SIZE, max_concurrency: int = MAX_CONCURRENCY,
                 policy: RetryPolicy | None = None, deadline: Deadline | None = None) -> None:
        if part_size < 5 << 20:
            raise ValueError(f"part_size must be at least 5 MiB (S3's minimum), got {part_size}")
        self.fs = fs
        self.part_size = part_size
        self.max_concurrency = max(1, max_concurrency)
        protos = _protocols(fs)
        self._object_store = bool(protos & _OBJECT_STORES)
        self._s3 = bool(protos & {"s3", "s3a"})
        self._backend_errors = _backend_errors(protos)
        # one code path: a synchronous filesystem runs in fsspec's threads behind async calls
        self._afs = fs if getattr(fs, "async_impl", False) else AsyncFileSystemWrapper(fs, asynchronous=False)
        self._runner = Runner(self._afs.loop, policy or RetryPolicy.from_knobs(), deadline,
                              watch_of(fs), knobs.store_requests(), endpoint_of(fs), TailPolicy.from_knobs())
        self._cleanup: Runner | None = None

    @classmethod
    def for_url(cls, url: str, storage_options: dict | None = None,
                deadline: Deadline | None = None) -> tuple[FsspecStorage, str]:
        """The backend for ``url`` and the path in the filesystem's terms.

        ``storage_options`` go to the fsspec filesystem (e.g. ``endpoint_url``, ``key``,
        ``secret`` for s3fs). Listing caches are off for object stores unless the options
        say otherwise; for S3 the client's retries, timeouts and stall watch are set as
        the module docstring says, unless the options set them.
        """
        opts = dict(storage_options or {})
        protocol = url.split("://", 1)[0]
        policy = RetryPolicy.from_knobs()
        if protocol in _OBJECT_STORES:
            opts.setdefault("use_listings_cache", False)
        if protocol in ("s3", "s3a"):
            opts = s3_options(opts, policy)
        try:
            fs, path = fsspec.core.url_to_fs(url, **opts)
        except ImportError as e:
            raise ImportError(f"{protocol}:// needs an fsspec implementation ({e}); for S3 "
                              f"install 'shardsafe[s3]'") from None
        if protocol in ("s3", "s3a"):
            fs.retries = 1  # s3fs' own retry loop: one try (this filesystem instance is ours)
        return cls(fs, policy=policy, deadline=deadline), path.rstrip("/") or path

    def join(self, *parts: str) -> str:
        return posixpath.join(*parts)

    def sibling_file(self, path: str, directory: str, name: str) -> str:
        # object stores have no links; the names are plain (checked by the index decoder)
        return posixpath.join(posixpath.dirname(path.rstrip("/")), directory, name)

    def _call(self, verb: str, path: str, detail: str, make: Callable[[], Awaitable[_T]]) -> _T:
        return self._runner_for(verb).run(Request(verb, path, detail), make)

    def _runner_for(self, verb: str) -> Runner:
        """The call's runner; once its deadline has passed, requests that only look or
        delete (the clean-up of the failed call) share a short window of their own."""
        deadline = self._runner.deadline
        if verb in ("PUT", "POST") or deadline is None or not deadline.passed():
            return self._runner
        if self._cleanup is None:
            self._cleanup = self._runner.for_cleanup()
        return self._cleanup

    # ------------------------------------------------------------------ writing
    def open_writer(self, path: str, size: int) -> None:
        """None: objects are uploaded whole (or as one multipart upload) by ``write``."""
        return None

    def _part(self, size: int) -> int:
        return max(self.part_size, ceil_div(size, MAX_PARTS))

    @_os_errors
    def write(self, path: str, buffers: Sequence[memoryview]) -> None:
        data = _Parts(buffers)
        if self._s3 and data.size >= 2 * self.part_size:
            # the parts go up concurrently; the upload completes only when all arrived,
            # so the object appears whole or not at all
            part = self._part(data.size)
            multipart.upload(self._afs, self._runner, path, data.size, part,
                             (data[o:o + part] for o in range(0, data.size, part)), self.max_concurrency)
        else:
            self._put(path, data[:])

    def _put(self, path: str, body: bytes) -> None:
        # s3fs would split a body of twice its chunk size into parts of its own: never here
        kw = {"chunksize": len(body) + 1} if self._s3 else {}
        self._call("PUT", path, f"{len(body)} bytes", lambda: self._afs._pipe_file(path, body, **kw))

    def _upload_unsized(self, path: str, pieces: Iterable[memoryview]) -> None:
        """An object whose size is known only at its end (a block file being coded): one
        PUT if it ends before filling two parts, else a multipart upload of ``part_size``
        parts (the rule of a known size), created once two parts are full, so that they
        go up while the rest is still being coded."""
        parts = _regroup(pieces, self.part_size, None, path)
        head = list(itertools.islice(parts, UNSIZED_PUT_PARTS))
        if len(head) < UNSIZED_PUT_PARTS or len(head[-1]) < self.part_size:  # it ended within them
            self._put(path, b"".join(head))
            return
        multipart.upload(self._afs, self._runner, path, None, self.part_size, itertools.chain(head, parts),
                         self.max_concurrency)

    @_os_errors
    def write_stream(self, path: str, size: int | None, pieces: Iterable[memoryview]) -> None:
        if self._s3:
            if size is None:
                self._upload_unsized(path, pieces)
            elif size >= 2 * self.part_size:
                part = self._part(size)
                multipart.upload(self._afs, self._runner, path, size, part,
                                 _regroup(pieces, part, size, path), self.max_concurrency)
            else:
                self._put(path, b"".join(_regroup(pieces, 2 * self.part_size, size, path)))
            return
        # fsspec's buffered file uploads a part whenever part_size bytes are in; discard()
        # abandons it on an error
        f = self.fs.open(path, "wb", block_size=self._part(size or 0))
        written = 0
        try:
            for piece in pieces:
                written += f.write(memoryview(piece).cast("B"))
            if size is not None and written != size:
                raise ValueError(f"{path}: {written} bytes written, {size} expected")
        except BaseException:
            # abandon the upload where the file can; elsewhere the caller deletes it
            discard = getattr(f, "discard", None)
            (discard or f.close)()
            raise
        f.close()

    @_os_errors
    def publish(self, path: str, data: bytes) -> None:
        """One PUT: object stores never expose a partially written object.

        When it fails for good (out of attempts, past the deadline), an attempt whose
        answer was lost may have landed all the same; the object is then removed, so a
        failed commit does not stay committed (a removal that fails too is logged).
        """
        try:
            self._put(path, bytes(data))
        except CheckpointError:
            cleanup = self._runner.for_cleanup()
            try:
                cleanup.run(Request("DELETE", path, "undo publish"), lambda: self._afs._rm_file(path))
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("%s may have been published by a request that failed; it could not "
                            "be removed: %s", path, e)
            raise

    # ------------------------------------------------------------------ reading
    @_os_errors
    def read(self, path: str) -> bytes:
        return self._call("GET", path, "", lambda: self._afs._cat_file(path))

    @_os_errors
    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        out = memoryview(out).cast("B")
        end = offset + len(out)

        def calls() -> Iterator[batch.Call[tuple[int, int], bytes]]:
            for s, e in batch.split(offset, end, self.part_size, self.max_concurrency):
                yield ((s, e), Request("GET", path, f"bytes {s}-{e - 1}", size=e - s, idempotent=True),
                       functools.partial(self._get_range, path, s, e))

        # each part lands in its own range of ``out``: a slot goes to the next part as soon as
        # any part has arrived, so one slow answer holds back no other part; the parts shrink
        # towards the end, so that the last answers, which the read waits for, are small
        with contextlib.closing(batch.as_completed(self._runner, calls(), self.max_concurrency)) as parts:
            for (s, e), data in parts:
                if len(data) != e - s:
                    raise EOFError(f"{path}: object ends before byte {e}")
                out[s - offset:e - offset] = data

    async def _get_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``path``. On S3 the body is read a chunk at a time and
        each chunk noted as the attempt's progress (``request.progress``), so that a
        response that stops is cut at the learned stall limit, not the client's timeout."""
        if not self._s3:
            return await self._afs._cat_file(path, start=start, end=end)
        from s3fs.core import _error_wrapper, version_id_kw

        bucket, key, version = self._afs.split_path(path)
        progress = _runner.progress()

        async def get() -> bytes:
            if progress is not None:
                progress.note(time.monotonic(), 0)
            resp = await self._afs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}",
                                            **version_id_kw(version))
            body = resp["Body"]
            out = bytearray()
            try:
                while chunk := await body.read(READ_CHUNK):
                    out += chunk
                    if progress is not None:
                        progress.note(time.monotonic(), len(chunk))
            finally:
                body.close()
            return bytes(out)

        return await _error_wrapper(get, retries=1)

    @_os_errors
    def size(self, path: str) -> int:
        info = self._info(path)
        if info.get("type") == "directory":
            raise FileNotFoundError(f"{path} is a directory/prefix, not an object")
        return int(info["size"])

    def _info(self, path: str) -> dict[str, Any]:
        return self._runner_for("HEAD").run(Request("HEAD", path, "", size=0, idempotent=True),
                                            lambda: self._afs._info(path))

    @_os_errors
    def modified(self, path: str) -> float | None:
        """Last-modified time (POSIX seconds) of an object, or None when unknown."""
        try:
            info = self._info(path)
        except (FileNotFoundError, IsADirectoryError):
            return None
        value = info.get("LastModified") or info.get("mtime") or info.get("created")
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @_os_errors
    def exists(self, path: str) -> bool:
        return bool(self._call("HEAD", path, "exists", lambda: self._afs._exists(path)))

    @_os_errors
    def list(self, path: str) -> list[str]:
        try:
            entries = self._call("LIST", path, "", lambda: self._afs._ls(path, detail=False))
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
            return self._info(path).get("type") == "directory"
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
        out: list[tuple[str, str, float | None]] = []
        marker: dict[str, str] = {}
        while True:
            page = self._call("LIST", path, "multipart uploads", lambda m=dict(marker): self._afs._call_s3(
                "list_multipart_uploads", Bucket=bucket, Prefix=prefix, **m))
            for u in page.get("Uploads", []) or []:
                started = u.get("Initiated")
                out.append((f"{bucket}/{u['Key']}", u["UploadId"],
                            started.timestamp() if started is not None else None))
            if not page.get("IsTruncated"):
                return out
            marker = {"KeyMarker": page.get("NextKeyMarker", ""),
                      "UploadIdMarker": page.get("NextUploadIdMarker", "")}

    @_os_errors
    def abort_upload(self, key_path: str, upload_id: str) -> None:
        """Aborts an unfinished multipart upload (see ``incomplete_uploads``)."""
        bucket, _, key = key_path.partition("/")
        self._call("DELETE", key_path, "abort multipart upload", lambda: self._afs._call_s3(
            "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id))

    # ------------------------------------------------------------------ namespace
    @_os_errors
    def makedirs(self, path: str) -> None:
        if not self._object_store:  # object stores have no directories to create
            self._call("MKDIR", path, "", lambda: self._afs._makedirs(path, exist_ok=True))

    @_os_errors
    def delete(self, path: str) -> None:
        try:
            if self._is_dir(path):
                self._call("DELETE", path, "recursive", lambda: self._afs._rm(path, recursive=True))
            else:
                self._call("DELETE", path, "", lambda: self._afs._rm_file(path))
        except FileNotFoundError:
            pass

    def rename(self, src: str, dst: str, *, exchange: bool = False) -> None:
        raise OSError(f"{type(self.fs).__name__} has no atomic rename ({src} -> {dst}); "
                      f"object stores commit by writing the index last")

    def sync_dir(self, path: str) -> None:
        # uploads are durable when they return; there is no directory entry to flush
        return None


def _regroup(pieces: Iterable[memoryview], part: int, size: int | None, path: str) -> Iterator[bytearray]:
    """The bytes of ``pieces`` in parts of ``part`` bytes (the last one shorter).

    Each byte is copied once, into a part of its own that is never changed once yielded
    (a request body that a retry may send again); a piece is fully copied before the next
    one is asked for, so its caller may then reuse its buffer.

    Raises:
        ValueError: the pieces do not add up to ``size`` bytes.
    """
    buf = bytearray()
    total = 0
    for piece in pieces:
        view = memoryview(piece).cast("B")
        total += len(view)
        while len(view):
            n = min(len(view), part - len(buf))
            buf += view[:n]
            view = view[n:]
            if len(buf) == part:
                yield buf
                buf = bytearray()
    if size is not None and total != size:
        raise ValueError(f"{path}: {total} bytes written, {size} expected")
    if buf:
        yield buf
