"""Sinks: the last stage of the save pipeline, where a stream's bytes become a file.

Every sink follows one protocol (``Sink``) and passes one conformance suite
(tests/engine/test_sinks.py): the bytes and the checksums exact, a cancelled sink
leaves nothing durable, an error surfaces at the caller, the memory budget respected.

- ``FileSink``: a file written in ranges from any thread (``Storage.open_writer``): on a
  local file system aligned ranges go through ``O_DIRECT`` where the file system
  allows it (``storage.local.LocalFileWriter``). Data files and block files alike (the
  assembler hands block files over in aligned chunks).
- ``UploadSink``: an object written as one stream (object stores, whose backends take
  whole files or streams only): the bytes must come in file order, back to back, and go
  up as they come (``Storage.write_stream``, a multipart upload), on a thread of the
  sink's own, so the upload overlaps the stages before it.
- ``replica.MirrorSink``: the data section of a save's data file, written again into a
  replica's file (the local tier's copy of a save) with the replica's own header.

A DCP part (``shardsafe.dcp.Writer``) is written by the same sinks; what differs is the
end of its run: the entries go back to DCP's coordinator instead of a commit.

A sink owns the bytes it is given only until ``write`` returns: the caller then reuses
its buffer.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Protocol

from ...storage.base import RangeWriter, Storage
from ...storage.files import with_path


class Sink(Protocol):
    """One file a save writes, created when the sink is made (``open_sink``).

    Attributes:
        path: The file's path in its storage (for messages).
        ordered: Writes must come in file order, each starting where the last ended.
    """

    path: str
    ordered: bool

    def write(self, offset: int, data: memoryview, padded: memoryview | None = None) -> None:
        """Writes ``data`` at ``offset`` (disjoint ranges, any threads unless ``ordered``).

        ``padded``: the same bytes followed by padding up to a page boundary, where the
        caller's buffer has it (the last range of a file): a direct-I/O sink writes it
        whole and ``close`` cuts the padding off.
        """

    def close(self, size: int) -> None:
        """Makes the file durable at exactly ``size`` bytes (raises if it cannot)."""

    def abort(self) -> None:
        """Stops; nothing of the file becomes durable (never raises)."""


def open_sink(storage: Storage, path: str, size: int, *, exact: bool = True) -> Sink:
    """Creates ``path`` on ``storage`` for a file of ``size`` bytes (at most ``size`` when
    not ``exact``: a block file) and returns its sink: a ``FileSink`` where the backend
    writes ranges, else an ``UploadSink``."""
    try:
        writer = storage.open_writer(path, size)
    except OSError as e:
        raise with_path(e, path) from None
    if writer is not None:
        return FileSink(path, writer)
    return UploadSink(storage, path, size if exact else None)


class FileSink:
    """A file of ranged writes (``Storage.open_writer``)."""

    ordered = False

    def __init__(self, path: str, writer: RangeWriter) -> None:
        self.path = path
        self._writer: RangeWriter | None = writer

    def write(self, offset: int, data: memoryview, padded: memoryview | None = None) -> None:
        assert self._writer is not None, "write after close"
        try:
            self._writer.write_at(offset, padded if padded is not None and self._writer.direct else data)
        except OSError as e:  # e.g. disk full: say which file
            raise with_path(e, self.path) from None

    def close(self, size: int) -> None:
        w, self._writer = self._writer, None
        assert w is not None, "closed twice"
        w.size = size
        try:
            w.close(sync=True)
        except OSError as e:
            raise with_path(e, self.path) from None

    def abort(self) -> None:
        w, self._writer = self._writer, None
        if w is not None:
            w.abort()


_END = object()


class UploadSink:
    """An object uploaded as one stream, as its bytes arrive in order.

    ``write`` hands the bytes to the upload thread and returns once the upload has taken
    them (copied them into the part being filled), so the caller may reuse its buffer;
    the upload's own parts are in flight meanwhile. A failure of the upload is raised by
    the next ``write`` or by ``close``; ``abort`` abandons the upload (no object appears).
    """

    ordered = True

    def __init__(self, storage: Storage, path: str, size: int | None) -> None:
        self.storage, self.path = storage, path
        self._queue: queue.Queue[object] = queue.Queue(maxsize=1)
        self._taken = threading.Semaphore(0)
        self._error: BaseException | None = None
        self._pos = 0
        self._stop = False
        self._thread = threading.Thread(target=self._upload, args=(size,), daemon=True, name="shardsafe-upload")
        self._thread.start()

    def _upload(self, size: int | None) -> None:
        try:
            self.storage.write_stream(self.path, size, self._pieces())
        except BaseException as e:  # noqa: BLE001 - raised by the next write or by close
            self._error = with_path(e, self.path)
            self._taken.release()  # a writer waiting for its piece to be taken

    def _pieces(self) -> Iterator[memoryview]:
        while True:
            piece = self._queue.get()
            if self._stop:  # abandons the upload: no object appears
                raise RuntimeError(f"the upload of {self.path} was cancelled")
            if piece is _END:
                return
            yield piece  # type: ignore[misc]
            self._taken.release()  # the upload asked for the next piece: it has this one

    def write(self, offset: int, data: memoryview, padded: memoryview | None = None) -> None:
        if offset != self._pos:
            raise ValueError(f"{self.path}: upload writes must be in order (at {self._pos}, got {offset})")
        data = memoryview(data).cast("B")
        self._pos += len(data)
        if not len(data):
            return
        if self._error is not None:
            raise self._error
        self._queue.put(data)
        self._taken.acquire()
        if self._error is not None:
            raise self._error

    def close(self, size: int) -> None:
        if size != self._pos:
            self.abort()
            raise ValueError(f"{self.path}: {self._pos} bytes written, {size} expected")
        self._queue.put(_END)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        self._stop = True
        while self._thread.is_alive():
            try:
                self._queue.put(_END, timeout=0.05)
            except queue.Full:
                continue
            break
        self._thread.join()


__all__ = ["FileSink", "Sink", "UploadSink", "open_sink"]
