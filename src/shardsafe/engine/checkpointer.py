"""Checkpointer: a reusable saver that owns staging buffers and runs one save at a time.

Sync saves stream: each write unit is copied into one of a few aligned bounce buffers
and written with direct I/O, so they need no full copy of the state. Async saves
stage the whole state into buffers the Checkpointer keeps (allocated once per layout,
pre-faulted), then checksum, write and commit on a background thread while the
caller goes on. With ``max_staging_bytes`` an async save streams instead: units are
staged in order into at most that many bytes of unit-sized buffers, each written and
given back while later units are staged; the call returns once the last unit is staged. The background thread is a plain thread, not an I/O-pool worker: it
waits for I/O-pool jobs, and a pool worker waiting for its own pool can deadlock.

With ``compression=`` the larger items go to a block file (``engine.block_writer``): a
sync save codes them on the I/O pool from per-block copies; an async save stages them
like everything else and codes them from the staging buffers once staged, so the
caller's stall is the copy alone.

Invariants:
- at most one save of a Checkpointer is in flight; a new save first waits for it;
- a background failure reaches the caller: ``SaveHandle.result()``, else the next
  save raises it, else ``close()``; at interpreter exit pending saves are finished
  and failures nobody collected are logged as errors.
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401 - registers its exit hook before ours (see _drain_at_exit)
import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args

from ..comm import Comm, SingleProcessComm, get_comm
from ..errors import CheckpointError
from ..format.codec import Compression, check_compression
from ..plan.flatten import Stateful
from .io_pool import io_threads
from . import async_jobs, cuda, pipeline
from .async_jobs import JobMaker, Stager, Write
from .buffers import BouncePool, HostBuffer, StagingArena, slot_count
from .handle import SaveHandle
from .incremental import Baseline
from .prepared import BLOCK_SIZE, UNIT_SIZE, PreparedSave
from .staging import StageTask, host_sources, stage_files
from .units import FileUnits
from .writer import FileWrite

log = logging.getLogger("shardsafe")

StagingMode = Literal["blocking", "background"]
"""How ``async_save`` copies the state: on the caller's thread, or in the background."""
STAGING_MODES: tuple[StagingMode, ...] = get_args(StagingMode)
BACKGROUND_COPY_THREADS = 1
SLOW_WAIT_S = 1.0  # a new save waiting longer than this for the previous one logs a warning


class Checkpointer:
    """Saves training states, synchronously or in the background, reusing its buffers.

    Args:
        comm: The group of ranks taking part in each save (default: this process alone).
        unit_size: Bytes per staging/write unit (a multiple of 4096).
        pin_memory: Page-lock staging buffers for CUDA copies (default: when CUDA is present).
        overlap_writes: With ``staging="blocking"``, start writing units while later units
            are still being copied (shorter time to durable, but the writes compete with
            the caller's copy for CPU and memory bandwidth, lengthening the stall).
        max_staging_bytes: Host memory an async save may stage into (None: a copy of the
            whole state, kept for the next save). A smaller state is staged as usual; a
            larger one streams through ``max_staging_bytes // unit_size`` unit buffers,
            and ``async_save`` blocks until the rest of the state fits (at least one
            unit). Sync saves bounce through the same buffers. ``async_save`` may
            override it per call.

    Example::

        ckpt = shardsafe.Checkpointer()
        for step in range(steps):
            train_step()
            if step % 100 == 0:
                ckpt.async_save({"model": model, "optim": opt, "step": step}, f"ckpt/{step}")
        ckpt.close()  # waits for the last save; raises its error if it failed
    """

    def __init__(self, *, comm: Comm | None = None, unit_size: int = UNIT_SIZE,
                 pin_memory: bool | None = None, overlap_writes: bool = False,
                 max_staging_bytes: int | None = None) -> None:
        if max_staging_bytes is not None:
            slot_count(max_staging_bytes, unit_size)
        self.max_staging_bytes = max_staging_bytes
        self.comm = comm
        self.unit_size = unit_size
        self.overlap_writes = overlap_writes
        self.arena = StagingArena(pin=cuda.available() if pin_memory is None else pin_memory)
        self._bounce = BouncePool(unit_size, io_threads())
        self._lock = threading.Lock()  # serialises save calls made from several threads
        self._inflight: SaveHandle | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        _LIVE.add(self)

    # ------------------------------------------------------------------ public
    def save(self, state: Mapping[str, Any] | Stateful, path: str, *, overwrite: bool = False,
             metadata: Mapping[str, Any] | None = None, storage_options: dict | None = None,
             process_group: Any = None, timeout: float | None = None,
             collective: bool | None = None, compression: Compression | None = None,
             baseline: Baseline | None = None) -> None:
        """Saves ``state`` and returns once the checkpoint is committed and durable.

        Waits for an async save still in flight first (and raises its error if it failed
        and nobody collected it). Arguments as for ``shardsafe.save``; ``baseline``
        (incremental saves, ``engine.incremental``) references unchanged chunks.
        """
        with self._lock:
            prep = self._prepare(state, path, overwrite=overwrite, metadata=metadata,
                                 storage_options=storage_options, process_group=process_group,
                                 timeout=timeout, collective=collective, compression=compression,
                                 baseline=baseline)
            self._save_streamed(prep)

    def _prepare(self, state: Mapping[str, Any] | Stateful, path: str, *, overwrite: bool,
                 metadata: Mapping[str, Any] | None, storage_options: dict | None,
                 process_group: Any, timeout: float | None,
                 collective: bool | None, compression: Compression | None,
                 baseline: Baseline | None = None) -> PreparedSave:
        """With the lock held: waits for the save in flight, then flattens and plans."""
        compression = check_compression(compression)  # before anything waits or is written
        self._check_open()
        self._wait_previous()
        comm = SingleProcessComm() if collective is False else self._comm(process_group)
        return pipeline.prepare(state, path, overwrite=overwrite, metadata=metadata,
                                storage_options=storage_options, comm=comm, timeout=timeout,
                                compression=compression, baseline=baseline)

    def async_save(self, state: Mapping[str, Any] | Stateful, path: str, *,
                   staging: StagingMode = "blocking", overwrite: bool = False, metadata: Mapping[str, Any] | None = None,
                   storage_options: dict | None = None, process_group: Any = None,
                   timeout: float | None = None, collective: bool | None = None,
                   compression: Compression | None = None,
                   baseline: Baseline | None = None,
                   max_staging_bytes: int | None = None) -> SaveHandle:
        """Starts saving ``state``; checksums, writes and commit run in the background.

        Args:
            state: As for ``shardsafe.save``.
            path: Checkpoint directory (or fsspec URL).
            staging: ``"blocking"``: returns once the state is copied into host buffers;
                the caller may change its tensors immediately. ``"background"``: returns
                at once and copies in the background; call ``handle.wait_staged()``
                before changing any tensor of ``state`` (e.g. before ``optimizer.step()``).
            overwrite: Replace an existing committed checkpoint.
            metadata: JSON-serialisable user metadata.
            storage_options: Passed to fsspec for URLs.
            process_group: As for ``shardsafe.save``: the group of a collective save.
            timeout: As for ``shardsafe.save``: how long ranks wait for each other.
            collective: As for ``shardsafe.save``: ``False`` saves this rank's state alone.
            compression: As for ``shardsafe.save``. Compression runs in the background,
                after staging: it does not lengthen the caller's stall.
            baseline: Incremental saves (``engine.incremental``): reference the chunks
                unchanged since the baseline's save instead of writing them.
            max_staging_bytes: Host staging memory of this save (default: the
                Checkpointer's). When the state is larger, units stream through that many
                bytes of buffers while they are written, and the call (or, with
                ``"background"``, ``wait_staged()``) returns once the last unit is staged.

        Returns:
            A SaveHandle; ``result()`` waits for the commit and re-raises any failure.

        Raises:
            TypeError: a value cannot be saved (raised here, before anything is written).
            CheckpointError: the previous async save failed and nobody collected the error,
                or the path must not be overwritten.
            ValueError: ``staging`` or ``max_staging_bytes`` is invalid.
            BaseException: with a budget, a write that failed while the call was staging.
        """
        if staging not in STAGING_MODES:
            raise ValueError(f"staging must be one of {STAGING_MODES}, got {staging!r}")
        budget = self.max_staging_bytes if max_staging_bytes is None else max_staging_bytes
        slots = None if budget is None else slot_count(budget, self.unit_size)
        if slots is not None and compression is not None:
            # block files are coded from whole staged images, which a budget does not hold
            raise ValueError("an async save cannot combine max_staging_bytes with compression "
                             "(yet): drop one of them, or save synchronously")
        with self._lock:
            prep = self._prepare(state, path, overwrite=overwrite, metadata=metadata,
                                 storage_options=storage_options, process_group=process_group,
                                 timeout=timeout, collective=collective, compression=compression,
                                 baseline=baseline)
            handle = SaveHandle(path, prep.nbytes)
            if slots is not None:
                jobs = self._slotted_jobs(prep, handle, slots)
            else:
                sizes = [p.layout.size for p in prep.plans + prep.coded]
                # Even the buffers are got (and, for a new layout, allocated and
                # pre-faulted) in the writer thread with "background".
                jobs = lambda: self._staged_jobs(prep, self.arena.get(sizes))  # noqa: E731
            if staging == "background":
                self._start(prep, handle, jobs, stage=True)
            else:
                # Under a budget the writes must run while the caller stages: they free
                # the buffers the later units are staged into.
                self._stage_blocking(prep, handle, jobs(), overlap=self.overlap_writes or slots is not None)
            return handle

    def _stage_blocking(self, prep: PreparedSave, handle: SaveHandle,
                        jobs: tuple[list[Write], Stager], *, overlap: bool) -> None:
        """Copies the state on the caller's thread, then hands the writes to the writer thread.

        With ``overlap`` the writer thread starts first and writes units as they are staged.
        """
        writes, stage = jobs
        if overlap:
            self._start(prep, handle, lambda: jobs, stage=False)
        try:
            stage(None)
        except BaseException as e:  # noqa: BLE001 - handed to the writer, then re-raised
            for fw in writes:
                fw.fail(e)
            if self._thread is not None:
                self._thread.join()
                self._thread = None
            else:  # no writer thread to abort: tell the other ranks ourselves
                pipeline.abort(prep, e)
            handle.mark_collected()  # the caller gets it right here
            self._inflight = None
            raise
        handle.mark_staged()
        if not overlap:
            self._start(prep, handle, lambda: jobs, stage=False)

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called (a closed Checkpointer refuses new saves)."""
        return self._closed

    @property
    def retained_bytes(self) -> int:
        """Host memory kept between saves: staging buffers plus sync-save bounce buffers."""
        return self.arena.nbytes + self._bounce.nbytes

    def wait(self, timeout: float | None = None) -> None:
        """Waits for the save in flight (if any) and raises its error if it failed."""
        h = self._inflight
        if h is not None:
            h.result(timeout)

    def close(self) -> None:
        """Waits for the save in flight, frees the buffers, and raises an uncollected failure."""
        if self._closed:
            return
        with self._lock:
            try:
                self._wait_previous()
            finally:
                self._closed = True
                self.arena.release()
                self._bounce.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _reset_in_child(self) -> None:
        """After ``fork``: fresh locks and buffers, and no save in flight.

        The parent's writer thread, staging helpers and a save call of another thread do
        not exist in the child; their locks may be held and their handle never settles.
        The child's copy of the in-flight handle is settled with an error (the save is the
        parent's), and the buffers are new (the parent may be using the inherited ones).
        """
        if self._inflight is not None:
            self._inflight.orphan_in_child()
        self._lock = threading.Lock()
        self._inflight = None
        self._thread = None
        self.arena = StagingArena(pin=self.arena.pin)
        self._bounce = BouncePool(self.unit_size, io_threads())

    def _comm(self, process_group: Any) -> Comm | None:
        """The group of one save: ``process_group`` if given, else this Checkpointer's."""
        return get_comm(process_group) if process_group is not None else self.comm

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("this Checkpointer is closed")

    def _wait_previous(self) -> None:
        """Waits for the save in flight; raises its failure if nobody has seen it yet."""
        h = self._inflight
        if h is None:
            return
        if not h.wait_settled(SLOW_WAIT_S):
            log.warning("save waits for the previous async save to %s, still in flight after %.0f s "
                        "(saving more often than the disk can absorb?)", h.path, SLOW_WAIT_S)
            h.wait_settled()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._inflight = None
        err = h.take_failure()
        if err is not None:
            raise CheckpointError(f"the previous async save to {h.path!r} failed: "
                                  f"{type(err).__name__}: {err}") from err

    def _staged_jobs(self, prep: PreparedSave, buffers: list[HostBuffer]) -> tuple[list[Write], Stager]:
        return async_jobs.staged(prep, buffers, self.unit_size)

    def _slotted_jobs(self, prep: PreparedSave, handle: SaveHandle, count: int) -> JobMaker:
        """Jobs streaming through ``count`` unit buffers of the arena (``async_jobs.slotted``)."""
        slots = self.arena.slots(self.unit_size, count)
        self._bounce.close()  # idle sync-save buffers: the budget bounds every host buffer
        writes, stage = async_jobs.slotted(prep, handle, slots, self.unit_size)
        return lambda: (writes, stage)

    def _sync_bounce(self, nbytes: int) -> BouncePool:
        """Bounce buffers of a sync save of ``nbytes``: the budget's slots when there is a
        budget, else ``io_threads()`` buffers of ``sync_unit(nbytes)`` bytes each."""
        if self.max_staging_bytes is not None:
            count = slot_count(self.max_staging_bytes, self.unit_size)
            return self.arena.slots(self.unit_size, count)
        size = sync_unit(nbytes, self.unit_size)
        if self._bounce.size != size:  # another size class of state: buffers of its size
            self._bounce.close()
            self._bounce = BouncePool(size, io_threads())
        return self._bounce

    def _start(self, prep: PreparedSave, handle: SaveHandle, jobs: JobMaker, *, stage: bool) -> None:
        self._inflight = handle
        self._thread = threading.Thread(target=_background, args=(prep, handle, jobs, stage),
                                        name="shardsafe-writer", daemon=False)
        with _UNSETTLED_LOCK:
            _UNSETTLED.add(handle)
        self._thread.start()

    def _save_streamed(self, prep: PreparedSave) -> None:
        """Sync save: stage per unit through bounce buffers (or gather), write, commit."""
        pipeline.begin(prep)
        writes: list[Write] = []
        scratch: list[HostBuffer] = []
        try:
            for plan in prep.plans:
                bounce = self._sync_bounce(prep.nbytes)
                units = FileUnits(plan, bounce.size, BLOCK_SIZE)
                path = prep.file_path(plan)
                writes.append(self._file_write(prep, units, path, scratch, bounce))
            for plan in prep.coded:  # compressed on the I/O pool from per-block copies
                bw = pipeline.block_file_write(prep, plan, sources=host_sources(plan, device=False))
                writes.append(bw)
                bw.all_ready()
            pipeline.finish_and_commit(prep, writes)
        except BaseException as e:
            for fw in writes:
                fw.cancel()
            pipeline.abort(prep, e)
            raise
        finally:
            for b in scratch:
                b.close()

    def _file_write(self, prep: PreparedSave, units: FileUnits, path: str,
                    scratch: list[HostBuffer], bounce: BouncePool) -> FileWrite:
        """A started sync-save FileWrite of one data file, all of it ready to be written.

        Streamed through the bounce buffers when the backend writes ranges; object stores
        (``open_writer`` gives None) take whole files, so the file is staged into scratch
        memory (appended to ``scratch``) first.
        """
        writer = prep.storage.open_writer(path, units.size)
        if writer is not None:
            try:
                sources = host_sources(units.plan, device=False)
            except BaseException:
                writer.abort()
                raise
            fw = FileWrite(units, prep.storage, path, sources=sources, bounce=bounce, writer=writer)
            try:
                fw.start()
                fw.all_ready()
            except BaseException:
                fw.cancel()  # waits for the jobs already submitted, closes the file
                raise
            return fw
        buf = HostBuffer(units.plan.layout.size)
        scratch.append(buf)
        fw = FileWrite(units, prep.storage, path, staged=buf)
        stage_files([StageTask(units, buf.array, fw.unit_ready)])
        fw.start()
        return fw


SYNC_UNIT_MAX = 64 << 20


def sync_unit(nbytes: int, unit_size: int) -> int:
    """Bytes per write request (and bounce buffer) of a sync save of ``nbytes``: a multiple
    of ``unit_size`` up to ``SYNC_UNIT_MAX``, with the ``io_threads()`` buffers together
    at most a quarter of the state (they are kept between saves).

    Measured on the project VM: direct writes of 64 MiB requests from 4 threads reach
    ~1.3x the throughput of 16 MiB requests (more bytes in flight).
    """
    want = nbytes // (4 * io_threads())
    units = max(1, min(SYNC_UNIT_MAX // unit_size, want // unit_size))
    return units * unit_size


def _background(prep: PreparedSave, handle: SaveHandle, jobs: JobMaker, stage: bool) -> None:
    """Body of the writer thread: [stage,] write, commit; the outcome goes to ``handle``."""
    writes: list[Write] = []
    try:
        writes, stage_state = jobs()
        pipeline.begin(prep)
        for fw in writes:
            fw.start()
        if stage:
            try:
                # One copying thread: background staging overlaps the caller's compute,
                # and more copy threads would take cores from it (the copy only has to
                # finish before the caller's next wait_staged()).
                stage_state(BACKGROUND_COPY_THREADS)
            except BaseException as e:  # noqa: BLE001 - forwarded to the waiting writers
                for fw in writes:
                    fw.fail(e)
                raise
            handle.mark_staged()
        pipeline.finish_and_commit(prep, writes)
    # Everything the save raises is delivered to the caller through the handle (result(),
    # the next save, close(), or the exit hook); nothing here swallows it.
    except BaseException as e:  # noqa: BLE001
        for fw in writes:
            fw.cancel()
        pipeline.abort(prep, e)
        handle.settle(e)
        log.debug("async save to %s failed: %s", handle.path, e)
        return
    handle.settle(None)
    with _UNSETTLED_LOCK:
        _UNSETTLED.discard(handle)


# Every Checkpointer alive, so that a forked child can reset them (see _reset_all_in_child).
_LIVE: weakref.WeakSet[Checkpointer] = weakref.WeakSet()


def _reset_all_in_child() -> None:
    """``os.register_at_fork`` hook: the child of a fork can save and load at once.

    Without it a child forked after a save or load (multiprocessing's default start
    method on Linux) waits forever on the parent's pools, locks and in-flight save.
    """
    global _UNSETTLED_LOCK
    _UNSETTLED_LOCK = threading.Lock()
    for h in list(_UNSETTLED):
        h.orphan_in_child()
    _UNSETTLED.clear()  # the parent's saves: the child's exit must not wait for them
    for c in list(_LIVE):
        c._reset_in_child()


os.register_at_fork(after_in_child=_reset_all_in_child)


# Saves started and not yet known to be fine: the exit hook finishes them (even when their
# Checkpointer is gone) and logs the failures nobody collected.
_UNSETTLED: set[SaveHandle] = set()
_UNSETTLED_LOCK = threading.Lock()


def _drain_at_exit() -> None:
    """Finishes saves still in flight when the main thread ends; logs uncollected failures.

    Registered with ``threading._register_atexit`` so it runs before the I/O pool's own
    exit hook (hooks run newest first) and the pool still accepts the save's jobs.
    """
    with _UNSETTLED_LOCK:
        pending = list(_UNSETTLED)
        _UNSETTLED.clear()
    for h in pending:
        if not h.done():
            log.info("waiting for the async save to %s to finish before exit", h.path)
            h.wait_settled()
        err = h.take_failure()
        if err is not None:
            log.error("async save to %s failed and nobody called result(): %s: %s", h.path,
                      type(err).__name__, err)


_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_drain_at_exit)
else:  # pragma: no cover - CPython always has it (3.9+)
    import atexit

    atexit.register(_drain_at_exit)
