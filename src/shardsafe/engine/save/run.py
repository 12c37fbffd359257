"""``run()``: the one driver of a save, from the feed through the transforms to the sinks.

    feed ──units──▶ transforms ──bytes──▶ sinks ──durable──▶ end
    (copy out of       (checksum,            (data file, block file,   (commit, or hand
     training memory)   compress)             upload, replica mirror)   the entries back)

Every save goes through it: sync saves, async saves (blocking or background staging,
with or without a budget), the manager's tiers (a step due on both tiers is one save
carrying a replica), ``shardsafe.dcp.Writer``'s parts and ``shardsafe cp``'s recoding.
The stages hand units to each other through bounded hand-offs, so they overlap: the feed
copies unit k+2 while the transform pool checksums or codes unit k+1 and the I/O pool
writes unit k, and a save runs at the speed of its slowest stage. What bounds the
units in flight is the feed's buffers (a ``PoolFeed``'s pool is the memory budget).

``Pipeline`` holds one save in flight; ``run`` is a generator that drives it: it yields
``STAGED`` once the state is copied (an async save's caller returns there; a sync save
goes straight on) and ends once its end stage has what this rank wrote (``save.ends``:
the commit, or a part's entries handed back), or aborts everything it began and
re-raises. No stage calls back into the driver: stages return, or raise. Every stage is
a protocol (``Feed``, ``Transform``, ``Sink``, ``End``); ``save.saver.Saver`` is the one
place that picks them and assembles a pipeline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ...storage.files import with_path
from ..buffers import round_up
from ..commit.entries import BlockSums, CodedFile
from ..io_pool import io_pool
from .feeds import Feed, Unit
from .prepare import PreparedSave
from .replica import PreparedReplica, begin_replica, commit_replica, fail_replica
from .sinks import Sink
from .streams import Owner, Stream, Outlet, build_streams
from .transforms import transform_pool

STAGED = "staged"


@dataclass(frozen=True, slots=True)
class Written:
    """What this rank wrote of a save, durable: the block checksums of each data file
    (``prep.plans`` order) and what each block file part holds."""

    sums: list[BlockSums]
    coded: list[CodedFile]


class End(Protocol):
    """The last stage of a run (``save.ends``): begun before the first write, finished with
    what this rank wrote once it is durable, aborted when the run fails."""

    def begin(self) -> None:
        """Before anything is written (e.g. creates the working directory)."""
        ...

    def finish(self, written: Written) -> None:
        """This rank's files are durable (e.g. commits the save)."""
        ...

    def abort(self, error: BaseException, begun: bool) -> None:
        """The run failed (``begun``: ``begin`` had returned); removes what it began."""
        ...


class Pipeline:
    """One save in flight (see the module docstring).

    Args:
        prep: The planned save.
        replicas: Its replicas (each commits or fails on its own).
        feed: Where the units come from.
        end: What the run ends with (``save.ends``: ``Commit``, or ``HandBack`` for a part).
        unit_size, block_unit: Units of data files and of block files (a block file's
            a multiple of the checksum block; with a ``PoolFeed`` both fit its buffers).
        window: Blocks coded at once.
        gated: Hold every unit back until ``open_gate`` (staging first, then writes).
    """

    def __init__(self, prep: PreparedSave, replicas: Sequence[PreparedReplica], feed: Feed, end: End, *,
                 unit_size: int, block_unit: int, window: int, gated: bool = False) -> None:
        self.prep, self.replicas, self.feed, self.end = prep, list(replicas), feed, end
        self.streams, self.save, self.owners = build_streams(prep, self.replicas, unit_size, block_unit, window,
                                                             lambda targets: _BlockOutput(self, targets),
                                                             self._release)
        self.gated = gated
        self._cond = threading.Condition()
        self._transforms = 0
        self._fatal: BaseException | None = None
        self._queued: list[Unit] = []
        self._ordered: dict[int, _InOrder] = {}
        self._begun = False

    # ------------------------------------------------------------------ begin
    def begin(self) -> None:
        """Begins the end (e.g. the working directory) and the replicas, and opens the data
        files' sinks; a replica that cannot begin fails alone."""
        self.end.begin()
        self._begun = True
        for r, o in zip(self.replicas, self.owners):
            try:
                begin_replica(r)
            except OSError as e:
                o.fail(with_path(e, r.prep.txn.workdir))
        for s in self.streams:
            if not s.coded:
                for t in s.targets:
                    self._open(t, s.name_of(0), 0, s.units.size, True)

    def _open(self, t: Outlet, name: str, part: int, size: int, exact: bool) -> None:
        if t.owner.alive:
            try:
                t.sinks[part] = t.opener(name, size, exact)
            except (OSError, ValueError) as e:
                t.owner.fail(e)

    # ------------------------------------------------------------------ stage
    def stopped(self) -> BaseException | None:
        """Why nothing more is staged or written (None while anyone wants the bytes)."""
        if self._fatal is not None:
            return self._fatal
        if self.save.alive or any(o.alive for o in self.owners):
            return None
        return self.save.error

    def stage(self, threads: int | None) -> None:
        """Feeds every unit (on this thread and copy helpers); raises a staging failure."""
        try:
            self.feed.stage(self.streams, self._emit, self.stopped, threads)
        except BaseException as e:
            self._fatal = self._fatal or e
            raise
        err = self.stopped()
        if err is not None:
            raise err

    def settle(self) -> None:
        """Hands on the units whose device copies were still landing when staging returned
        (the caller's streams wait for those copies on the GPU, not its thread)."""
        try:
            self.feed.settle(self._emit)
        except BaseException as e:
            self._fatal = self._fatal or e
            raise

    def open_gate(self) -> None:
        """Hands on the units held back while staging (``gated``)."""
        with self._cond:
            queued, self._queued, self.gated = self._queued, [], False
        for u in queued:
            self._dispatch(u)

    def _emit(self, unit: Unit) -> None:
        if self.gated:
            with self._cond:
                if self.gated:
                    self._queued.append(unit)
                    return
        self._dispatch(unit)

    def _dispatch(self, unit: Unit) -> None:
        s = unit.stream
        if self.stopped() is not None or not s.live():
            self._release(unit)
            return
        with self._cond:
            self._transforms += 1
        if s.transform.inline:
            self._transform(unit)
        else:
            transform_pool().submit(self._transform, unit)

    def _transform(self, unit: Unit) -> None:
        s: Stream = unit.stream
        try:
            if self.stopped() is not None or not s.live():
                self._release(unit)
            elif s.coded:
                s.transform(unit)  # hands its output on and gives the unit back itself
            else:
                try:
                    s.transform(unit)
                except BaseException:
                    self._release(unit)
                    raise
                self._write_unit(unit)
        except BaseException as e:  # noqa: BLE001 - stops the save; finish() or abort() raises it
            self._fatal = self._fatal or e
        finally:
            with self._cond:
                self._transforms -= 1
                self._cond.notify_all()

    # ------------------------------------------------------------------ write
    def _write_unit(self, unit: Unit) -> None:
        s: Stream = unit.stream
        last = unit.k == s.units.nunits - 1
        data = unit.view(unit.start, unit.stop)
        padded = unit.view(unit.start, unit.start + round_up(unit.stop - unit.start)) if last else None
        sinks = [(t.owner, t.sinks[0]) for t in s.targets if t.owner.alive and 0 in t.sinks]
        self.fan_out(sinks, unit.start, data, padded, lambda: self._release(unit))

    def fan_out(self, sinks: list[tuple[Owner, Sink]], offset: int, data: memoryview,
                padded: memoryview | None, done: Callable[[], None]) -> None:
        """Writes ``data`` at ``offset`` to every sink on the I/O pool; ``done`` once all have."""
        if not sinks:
            done()
            return
        left = [len(sinks)]

        def one_done() -> None:
            with self._cond:
                left[0] -= 1
                last = left[0] == 0
            if last:
                done()

        for owner, sink in sinks:
            with self._cond:
                owner.inflight += 1
            job = (owner, sink, offset, data, padded, one_done)
            if sink.ordered:
                self._in_order(sink).put(offset, len(data), job)
            else:
                io_pool().submit(self.write, *job)

    def write(self, owner: Owner, sink: Sink, offset: int, data: memoryview, padded: memoryview | None,
              done: Callable[[], None]) -> None:
        """One sink's write (skipped once its owner failed or the save stopped)."""
        try:
            if owner.alive and self._fatal is None:
                sink.write(offset, data, padded)
        except BaseException as e:  # noqa: BLE001 - the owner fails alone (finish raises the save's)
            owner.fail(e)
        finally:
            done()
            with self._cond:
                owner.inflight -= 1
                self._cond.notify_all()

    def _in_order(self, sink: Sink) -> _InOrder:
        with self._cond:
            got = self._ordered.get(id(sink))
            if got is None:
                got = self._ordered[id(sink)] = _InOrder(self)
            return got

    def _release(self, unit: Unit) -> None:
        self.feed.release(unit)

    def _wait(self, ready: Callable[[], bool]) -> None:
        with self._cond:
            self._cond.wait_for(ready)

    # ------------------------------------------------------------------ finish
    def finish(self) -> Written:
        """Once everything is staged: the block files' last chunks, every replica
        committed (or failed) as soon as its own files are durable, then this rank's files
        of the save made durable.

        Raises:
            BaseException: the save's failure (its replicas are settled already).
        """
        self._wait(lambda: self._transforms == 0)
        err = self.stopped()
        if err is not None:
            raise err
        held = {id(s): s.transform.result() for s in self.streams if s.live()}  # what each file holds
        for r, o in zip(self.replicas, self.owners):
            self._finish_replica(r, o, held)
        self._close(self.save, held)
        if self.save.error is not None:
            raise self.save.error
        return _written(self._files_of(self.save), held)

    def _files_of(self, owner: Owner) -> list[Stream]:
        return [s for s in self.streams if any(t.owner is owner for t in s.targets)]

    def _close(self, owner: Owner, held: dict[int, Any]) -> None:
        """Makes ``owner``'s files durable (or, once it failed, drops them)."""
        self._wait(lambda: owner.inflight == 0)
        for s in self._files_of(owner):
            for t in s.targets:
                if t.owner is not owner:
                    continue
                for k, sink in t.sinks.items():
                    if not owner.alive:
                        sink.abort()
                        continue
                    try:
                        sink.close(held[id(s)][k].size if s.coded else s.units.size)
                    except BaseException as e:  # noqa: BLE001 - the owner's failure
                        owner.fail(e)
                        sink.abort()

    def _finish_replica(self, r: PreparedReplica, o: Owner, held: dict[int, Any]) -> None:
        self._close(o, held)
        if o.error is not None:
            fail_replica(r, o.error)
            return
        written = _written(self._files_of(o), held)
        commit_replica(r, written.sums, written.coded)

    # ------------------------------------------------------------------ abort
    def abort(self, error: BaseException) -> None:
        """Stops everything, waits for the work in flight, aborts the end (which removes
        what was begun, never a committed checkpoint, and tells the other ranks of a
        collective save) and settles the replicas still open."""
        self._fatal = self._fatal or error
        self.feed.settle(self._release)  # copies still landing in the feed's buffers
        with self._cond:
            queued, self._queued, self.gated = self._queued, [], False
            ordered = list(self._ordered.values())
        for u in queued:
            self._release(u)
        for o in ordered:
            o.skip_all()
        self._wait(lambda: self._transforms == 0 and self.save.inflight == 0
                   and all(o.inflight == 0 for o in self.owners))
        for s in self.streams:
            s.transform.cancel()
            for t in s.targets:
                for sink in t.sinks.values():
                    sink.abort()
                t.sinks.clear()
        self.end.abort(error, self._begun)
        for r in self.replicas:
            if not r.progress.settled.is_set():
                fail_replica(r, error)

    def close(self) -> None:
        """Frees the transforms' buffers (the run has ended)."""
        for s in self.streams:
            s.transform.close()


def _written(streams: list[Stream], held: dict[int, Any]) -> Written:
    """What one owner's files hold (``streams``, ``held``: each file's transform result)."""
    return Written([held[id(s)] for s in streams if not s.coded],
                   [f for s in streams if s.coded for f in held[id(s)]])


class _BlockOutput:
    """A block stream's parts, as its assembler sees them: opened and written through the pipeline."""

    def __init__(self, pipe: Pipeline, targets: list[Outlet]) -> None:
        self.pipe, self.targets = pipe, targets

    def open_part(self, part: int, name: str, bound: int) -> None:
        for t in self.targets:
            self.pipe._open(t, name, part, bound, False)

    def write(self, part: int, offset: int, data: memoryview, padded: memoryview | None,
              done: Callable[[], None]) -> None:
        sinks = [(t.owner, t.sinks[part]) for t in self.targets if t.owner.alive and part in t.sinks]
        self.pipe.fan_out(sinks, offset, data, padded, done)


class _InOrder:
    """The writes of an ordered sink (an upload), run one at a time in file order."""

    def __init__(self, pipe: Pipeline) -> None:
        self.pipe = pipe
        self._lock = threading.Lock()
        self._next = 0
        self._pending: dict[int, tuple[int, tuple[Any, ...]]] = {}
        self._running = False
        self._skip = False

    def put(self, offset: int, length: int, job: tuple[Any, ...]) -> None:
        with self._lock:
            self._pending[offset] = (length, job)
            if self._running:
                return
            self._running = True
        io_pool().submit(self._drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                got = self._pending.pop(self._next, None) if not self._skip else None
                if got is None:
                    self._running = False
                    return
                self._next += got[0]
            self.pipe.write(*got[1])

    def skip_all(self) -> None:
        """The save stopped: every write still waiting for its turn ends unwritten."""
        with self._lock:
            self._skip = True
            pending, self._pending = list(self._pending.values()), {}
        for _, (owner, _sink, _o, _d, _p, done) in pending:
            self.pipe.write(owner, _Skipped(), 0, memoryview(b""), None, done)


class _Skipped:
    """A sink that takes nothing (a skipped write still ends like any other)."""

    def write(self, offset: int, data: memoryview, padded: memoryview | None = None) -> None:
        return None


def run(pipe: Pipeline, *, threads: int | None = None) -> Iterator[str]:
    """Drives ``pipe``: begin, feed (``threads`` copy threads), transforms and sinks, then
    its end with what this rank wrote; yields ``STAGED`` once the state is copied. On any
    failure, aborts (``Pipeline.abort``) and re-raises. A gated pipeline stages first and
    begins after (the caller's stall does not wait for the begin)."""
    try:
        if not pipe.gated:
            pipe.begin()
        pipe.stage(threads)
        yield STAGED
        pipe.settle()
        if pipe.gated:
            pipe.begin()
            pipe.open_gate()
        pipe.end.finish(pipe.finish())
    except BaseException as e:
        pipe.abort(e)
        raise
    finally:
        pipe.close()


__all__ = ["End", "Pipeline", "STAGED", "Written", "run"]
