"""``Saver``: the engine behind a ``Checkpointer``: one save at a time, its buffers kept.

``submit`` takes a ``SaveRequest``, plans it on the caller's thread (with Python's
collector paused: ``_gc_pause``), builds its ``Pipeline`` and drives it with ``run``.
``Saver`` is the one place that assembles a pipeline: it picks the feed, and the end
(``save.ends.Commit``; ``HandBack`` for ``write_part``, a part of a save committed
elsewhere, which may bring its own feed):

- a sync save runs it on the caller's thread, through the bounce buffers
  (``PoolFeed``; with a budget, the budget's slots);
- an async save with ``staging="blocking"`` stages on the caller's thread (whole
  images from the staging arena, or, under ``max_staging_bytes``, the budget's slots),
  then hands the rest of the run to a writer thread; with ``"background"`` the writer
  thread runs all of it. The writer thread is a plain thread, not an I/O-pool worker
  (it waits for I/O-pool work, and a pool worker waiting for its own pool can deadlock).

Invariants:
- at most one save of a Saver is in flight; a new save first waits for it;
- a background failure reaches the caller: ``SaveHandle.result()``, else the next
  save raises it, else ``close()``; at interpreter exit pending saves are finished
  and failures nobody collected are logged as errors (the writer thread is a job of
  ``save.background``, the machinery of all background work).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..._gc_pause import paused as _gc_pause
from ...comm import Comm, ExternalRank, SingleProcessComm, get_comm
from ...errors import CheckpointError
from ...plan.flatten import TensorItem
from ...plan.localize import immutable
from .. import cuda
from ..buffers import BouncePool, StagingArena, round_up
from ..commit import Transaction
from ..commit.entries import Entries
from ..io_pool import io_threads
from . import background
from .ends import Commit, HandBack
from .feeds import ImageFeed, PoolFeed
from .handle import SaveHandle, SaveProgress
from .options import SaveOptions, sync_bounce
from .prepare import PreparedSave, prepare, prepare_part
from .replica import PreparedReplica, prepare_replica
from .request import Replica, SaveRequest
from .run import STAGED, End, Pipeline, run
from .units import BLOCK_SIZE

log = logging.getLogger("shardsafe")

SLOW_WAIT_S = 1.0  # a new save waiting longer than this for the previous one logs a warning
BACKGROUND_COPY_THREADS = 1  # background staging overlaps the caller's compute: one thread


@dataclass(frozen=True, slots=True)
class Submitted:
    """A save that was started: its handle and each replica's (in request order)."""

    handle: SaveHandle
    replicas: tuple[SaveHandle, ...]


class Saver:
    """Runs the saves of one ``Checkpointer`` (see the module docstring).

    Args:
        options: The validated options.
        comm: The group of every save (None: the initialised torch.distributed world).
    """

    def __init__(self, options: SaveOptions, comm: Comm | None = None) -> None:
        self.options, self.comm = options, comm
        self.arena = StagingArena(pin=cuda.available() if options.pin_memory is None else options.pin_memory)
        self._bounce = BouncePool(options.unit_size, io_threads(), pin=self.arena.pin)
        self._lock = threading.Lock()  # one save at a time, whichever thread calls
        self._inflight: list[SaveProgress] = []
        self._thread: threading.Thread | None = None
        self.closed = False
        _LIVE.add(self)

    @property
    def retained_bytes(self) -> int:
        """Host memory kept between saves: staging buffers plus bounce buffers."""
        return self.arena.nbytes + self._bounce.nbytes

    # ------------------------------------------------------------------ saves
    def submit(self, req: SaveRequest) -> Submitted:
        """Runs ``req``: returns once it is committed (sync) or staged (async).

        Raises:
            TypeError: a value cannot be saved (before anything is written).
            ValueError: an option is invalid.
            CheckpointError: the previous save failed and nobody collected the error, the
                path must not be overwritten, or (sync) the save failed.
            BaseException: (sync, or a failed blocking staging) what made the save fail.
        """
        opts = self.options.with_call(compression=req.compression,
                                      max_staging_bytes=req.max_staging_bytes if req.staging else None)
        with self._lock:
            self._check_open()
            self._wait_previous()
            with _gc_pause():  # per-tensor bookkeeping on the caller's thread (see shardsafe._gc_pause)
                prep = prepare(req, self._comm(req), opts.compression)
                replicas = self._replicas(prep, req.replicas)
            progress = SaveProgress(req.path, prep.nbytes)
            out = Submitted(progress.handle, tuple(r.progress.handle for r in req.replicas))
            # a JAX state's shards cannot change: staging them need not hold the caller
            background = req.staging == "background" or (
                req.staging is not None and immutable([it for p in prep.plans + prep.coded for it in p.items]))
            pipe = self._pipeline(prep, replicas, opts, Commit(prep), sync=req.staging is None,
                                  background=background)
            steps = run(pipe, threads=BACKGROUND_COPY_THREADS if background else None)
            if req.staging is None:
                for _ in steps:
                    pass
                progress.settle(None)
                return out
            everyone = [progress] + [r.progress for r in replicas]
            if background:
                self._start(steps, everyone, staged=False)
                return out
            try:
                next(steps)  # the caller's thread stages
            except BaseException as e:
                progress.collected = True  # the caller gets it right here
                progress.settle(e)
                raise
            for p in everyone:
                p.mark_staged()
            self._start(steps, everyone, staged=True)
            return out

    def write_part(self, items: Sequence[TensorItem], txn: Transaction, comm: ExternalRank,
                   compression: str | None, feed: PoolFeed | None = None) -> Entries:
        """Writes this rank's files of a save another system plans and commits
        (``shardsafe.dcp.Writer``, ``shardsafe cp --compression``), synchronously, into
        ``txn``'s working directory (which exists); returns the entries of what it wrote
        (durable). Commits nothing and removes nothing: on failure the files are closed
        and the error raised (the coordinator never commits then).

        ``feed`` brings the items' bytes from elsewhere than the items' values (a source
        checkpoint); its pool's buffers are the run's units. None: the bounce buffers.
        """
        with self._lock:
            self._check_open()
            self._wait_previous()
            prep = prepare_part(items, txn, comm, compression)
            end = HandBack(prep)
            for _ in run(self._pipeline(prep, [], self.options, end, sync=True, feed=feed)):
                pass
            assert end.entries is not None
            return end.entries

    def _comm(self, req: SaveRequest) -> Comm:
        if req.collective is False:
            return SingleProcessComm()
        if req.process_group is not None:
            return get_comm(req.process_group)
        return self.comm or get_comm()

    @staticmethod
    def _replicas(prep: PreparedSave, replicas: Sequence[Replica]) -> list[PreparedReplica]:
        out = []
        for r in replicas:
            try:
                out.append(prepare_replica(prep, r))
            except (TypeError, ValueError, OSError, CheckpointError) as e:
                r.progress.settle(e)  # the replica fails alone; the save goes on
        return out

    def _pipeline(self, prep: PreparedSave, replicas: list[PreparedReplica], opts: SaveOptions, end: End, *,
                  sync: bool, background: bool = False, feed: PoolFeed | None = None) -> Pipeline:
        """The pipeline of one run, with its feed: the caller's (``feed``); else the
        budget's slots; else for a sync save (or a part) bounce buffers, for an async one
        whole images in the arena.

        Runs on the caller's thread: the feed's ``cuda.Fence`` marks where the caller's
        streams are now, which is what every device copy of the save waits for.
        """
        window = opts.coding_window
        if feed is not None:
            size = feed.pool.size
            return Pipeline(prep, replicas, feed, end, unit_size=size, block_unit=size, window=window)
        unit = opts.unit_size
        fence = cuda.Fence.capture(it.value for it in prep.items)
        if opts.slots is not None:
            pool = self.arena.slots(unit, opts.slots)
            self._bounce.close()  # idle bounce buffers: the budget bounds every host buffer
            return Pipeline(prep, replicas, PoolFeed(pool, fence=fence), end, unit_size=unit, block_unit=unit,
                            window=window)
        if sync:
            size, count = sync_bounce(prep.nbytes, unit, prep.compression)
            if (self._bounce.size, self._bounce.count) != (size, count):  # another size class of state
                self._bounce.close()
                self._bounce = BouncePool(size, count, pin=self.arena.pin)
            return Pipeline(prep, replicas, PoolFeed(self._bounce, fence=fence), end, unit_size=size,
                            block_unit=size, window=window)
        images = ImageFeed(self.arena.get, pin=self.arena.pin, fence=fence)
        return Pipeline(prep, replicas, images, end, unit_size=unit, block_unit=round_up(unit, BLOCK_SIZE),
                        window=window, gated=not background and not opts.overlap_writes)

    def _start(self, steps: Iterator[str], everyone: list[SaveProgress], *, staged: bool) -> None:
        """Starts the writer thread that drives the rest of ``steps``: a background job
        settling the save's progress (its replicas' are settled by the run itself)."""
        self._inflight = everyone
        self._thread = background.start("writer", lambda: _drive(steps, everyone, staged), everyone[0],
                                        everyone[1:])

    # ------------------------------------------------------------------ waiting, closing
    def wait(self, timeout: float | None = None) -> None:
        """Waits for the save in flight (if any) and raises its error if it failed."""
        if self._inflight:
            self._inflight[0].handle.result(timeout)

    def settle(self) -> None:
        """Waits for the save in flight (if any) and raises its failure if nobody has seen
        it yet (once: a later call goes on), as the next save would."""
        with self._lock:
            self._wait_previous()

    def close(self) -> None:
        """Waits for the save in flight, frees the buffers, and raises an uncollected failure."""
        if self.closed:
            return
        with self._lock:
            try:
                self._wait_previous()
            finally:
                self.closed = True
                self.arena.release()
                self._bounce.close()

    def _check_open(self) -> None:
        if self.closed:
            raise CheckpointError("this Checkpointer is closed")

    def _wait_previous(self) -> None:
        """Waits for the save in flight; raises its failure (or a replica's) if nobody has
        seen it yet."""
        progresses = self._inflight
        if not progresses:
            return
        p = progresses[0]
        if not p.settled.wait(SLOW_WAIT_S):
            log.warning("save waits for the previous async save to %s, still in flight after %.0f s "
                        "(saving more often than the disk can absorb?)", p.path, SLOW_WAIT_S)
            p.settled.wait()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._inflight = []
        for p in progresses:
            err = p.take_failure()
            if err is not None:
                raise CheckpointError(f"the previous async save to {p.path!r} failed: "
                                      f"{type(err).__name__}: {err}") from err

    def reset_in_child(self) -> None:
        """After ``fork``: fresh locks and buffers, and no save in flight.

        The parent's writer thread, staging helpers and a save call of another thread do
        not exist in the child; their locks may be held and their saves never settle.
        The child's copies of the saves in flight are settled with an error (the save is
        the parent's), and the buffers are new (the parent may be using the inherited ones).
        """
        for p in self._inflight:
            p.orphan_in_child()
        self._lock = threading.Lock()
        self._inflight = []
        self._thread = None
        self.arena = StagingArena(pin=self.arena.pin)
        self._bounce = BouncePool(self.options.unit_size, io_threads(), pin=self.arena.pin)


def _drive(steps: Iterator[str], everyone: list[SaveProgress], staged: bool) -> None:
    """Body of the writer thread: the rest of the run (a failure raises, and
    ``background`` settles the save's progress with it)."""
    for step in steps:
        if step == STAGED and not staged:
            for p in everyone:
                p.mark_staged()


# Every Saver alive, so that a forked child can reset them.
_LIVE: weakref.WeakSet[Saver] = weakref.WeakSet()


def _reset_in_child() -> None:
    """``os.register_at_fork`` hook: the child of a fork can save and load at once.

    Without it a child forked after a save or load (multiprocessing's default start
    method on Linux) waits forever on the parent's pools, locks and in-flight save (the
    jobs themselves are settled by ``save.background``'s own hook).
    """
    for s in list(_LIVE):
        s.reset_in_child()


os.register_at_fork(after_in_child=_reset_in_child)


__all__ = ["Saver", "Submitted"]
