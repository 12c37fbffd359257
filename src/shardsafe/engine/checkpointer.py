"""Checkpointer: a reusable saver that owns staging buffers and runs one save at a time.

Sync saves stream: each write unit is copied into one of a few aligned bounce buffers
and written with direct I/O, so they need no full copy of the state. Async saves
stage the whole state into buffers the Checkpointer keeps (one slab, reused while the
layout's size stays about the same, pre-faulted), then checksum, write and commit on a
background thread while the caller goes on. With ``max_staging_bytes`` an async save
streams instead: units are staged in order into at most that many bytes of unit-sized
buffers, each written and given back while later units are staged; the call returns
once the last unit is staged. The background thread is a plain thread, not an I/O-pool
worker: it waits for I/O-pool jobs, and a pool worker waiting for its own pool can
deadlock.

With ``compression=`` the larger items go to a block file: a sync save codes them on
the I/O pool from per-block copies (``engine.block_writer``); an async save stages
them like everything else and codes them from the staging buffers once staged, or,
under a budget, from each unit as it streams through (``engine.block_stream``), so the
caller's stall is the copy alone and the budget bounds the memory.

A save may carry copies (``engine.copies``): this rank's own checkpoint of a view of
the state, written from the same staged bytes, committed on its own, with a handle of
its own (``Copy.handle``). The options are validated once, when the Checkpointer is
built (``engine.save_options``); a call's overrides go through the same checks.

Invariants:
- at most one save of a Checkpointer is in flight; a new save first waits for it;
- a background failure reaches the caller: ``SaveHandle.result()``, else the next
  save raises it, else ``close()``; at interpreter exit pending saves are finished
  and failures nobody collected are logged as errors.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from ..comm import Comm, SingleProcessComm, get_comm
from ..errors import CheckpointError
from ..format.codec import Compression
from ..plan.flatten import Stateful
from ..plan.jax_shards import immutable
from ..storage.base import Storage
from .io_pool import io_threads
from . import async_jobs, background, cuda, pipeline
from .async_jobs import Jobs
from .background import JobMaker
from .buffers import BouncePool, HostBuffer, StagingArena
from .copies import Copy, PreparedCopy, begin_copy, fail_copy, prepare_copy
from .handle import SaveHandle
from .incremental import Baseline
from .entries import Entries
from .prepared import UNIT_SIZE, PreparedSave, local_entries
from .save_options import SaveOptions
from .staging import StageTask, host_sources, stage_files
from .units import FileUnits
from .writer import FileWrite, UnitMirror

log = logging.getLogger("shardsafe")

StagingMode = Literal["blocking", "background"]
"""How ``async_save`` copies the state: on the caller's thread, or in the background."""
STAGING_MODES: tuple[StagingMode, ...] = get_args(StagingMode)
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
            override it per call. Combines with ``compression`` (then ``unit_size`` must
            be a multiple of the 16 MiB checksum block, as by default).
        compression: The default ``compression`` of every save (see ``shardsafe.save``);
            a call may override it.

    Raises:
        ValueError: an invalid option or combination (``engine.save_options``).

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
                 max_staging_bytes: int | None = None, compression: Compression | None = None) -> None:
        self.options = SaveOptions(unit_size=unit_size, pin_memory=pin_memory, overlap_writes=overlap_writes,
                                   max_staging_bytes=max_staging_bytes, compression=compression)
        self.comm = comm
        self.arena = StagingArena(pin=cuda.available() if pin_memory is None else pin_memory)
        self._bounce = BouncePool(unit_size, io_threads())
        self._lock = threading.Lock()  # serialises save calls made from several threads
        self._inflight: list[SaveHandle] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        _LIVE.add(self)

    @property
    def unit_size(self) -> int:
        """Bytes per staging/write unit (``options.unit_size``)."""
        return self.options.unit_size

    @property
    def max_staging_bytes(self) -> int | None:
        """The default host staging budget of async saves (``options.max_staging_bytes``)."""
        return self.options.max_staging_bytes

    # ------------------------------------------------------------------ public
    def save(self, state: Mapping[str, Any] | Stateful, path: str, *, overwrite: bool = False,
             metadata: Mapping[str, Any] | None = None, storage_options: dict | None = None,
             process_group: Any = None, timeout: float | None = None,
             collective: bool | None = None, compression: Compression | None = None,
             baseline: Baseline | None = None, copies: Sequence[Copy] = ()) -> None:
        """Saves ``state`` and returns once the checkpoint is committed and durable.

        Waits for an async save still in flight first (and raises its error if it failed
        and nobody collected it). Arguments as for ``shardsafe.save``; ``baseline``
        (incremental saves, ``engine.incremental``) references unchanged chunks; each of
        ``copies`` is committed (or has failed) on return too, as its ``handle`` says.
        """
        with self._lock:
            opts = self.options.with_call(compression=compression)
            prep, prepared = self._prepare(state, path, opts, overwrite=overwrite, metadata=metadata,
                                           storage_options=storage_options, process_group=process_group,
                                           timeout=timeout, collective=collective, baseline=baseline,
                                           copies=copies)
            self._save_streamed(prep, prepared)

    def _prepare(self, state: Mapping[str, Any] | Stateful, path: str, opts: SaveOptions, *, overwrite: bool,
                 metadata: Mapping[str, Any] | None, storage_options: dict | None,
                 process_group: Any, timeout: float | None, collective: bool | None,
                 baseline: Baseline | None, copies: Sequence[Copy]) -> tuple[PreparedSave, list[PreparedCopy]]:
        """With the lock held: waits for the save in flight, then flattens and plans."""
        self._check_open()
        self._wait_previous()
        comm = SingleProcessComm() if collective is False else self._comm(process_group)
        prep = pipeline.prepare(state, path, overwrite=overwrite, metadata=metadata,
                                storage_options=storage_options, comm=comm, timeout=timeout,
                                compression=opts.compression, baseline=baseline)
        prepared = []
        for c in copies:
            c.handle = SaveHandle(c.path)
            try:
                prepared.append(prepare_copy(prep, c))
            except (TypeError, ValueError, OSError, CheckpointError) as e:
                c.handle.settle(e)  # the copy fails alone; the save goes on
        return prep, prepared

    def async_save(self, state: Mapping[str, Any] | Stateful, path: str, *,
                   staging: StagingMode = "blocking", overwrite: bool = False, metadata: Mapping[str, Any] | None = None,
                   storage_options: dict | None = None, process_group: Any = None,
                   timeout: float | None = None, collective: bool | None = None,
                   compression: Compression | None = None,
                   baseline: Baseline | None = None,
                   max_staging_bytes: int | None = None, copies: Sequence[Copy] = ()) -> SaveHandle:
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
            compression: As for ``shardsafe.save`` (default: the Checkpointer's).
                Compression runs in the background, after staging (under a budget, as
                units stream through): it does not lengthen the caller's stall.
            baseline: Incremental saves (``engine.incremental``): reference the chunks
                unchanged since the baseline's save instead of writing them.
            max_staging_bytes: Host staging memory of this save (default: the
                Checkpointer's). When the state is larger, units stream through that many
                bytes of buffers while they are written, and the call (or, with
                ``"background"``, ``wait_staged()``) returns once the last unit is staged.
            copies: This rank's own checkpoints of views of ``state`` (``engine.copies``),
                written from the same staged bytes; each ``Copy.handle`` settles when that
                copy commits or fails, independently of this save.

        Returns:
            A SaveHandle; ``result()`` waits for the commit and re-raises any failure.

        Raises:
            TypeError: a value cannot be saved (raised here, before anything is written).
            CheckpointError: the previous async save failed and nobody collected the error,
                or the path must not be overwritten.
            ValueError: ``staging``, ``max_staging_bytes`` or ``compression`` is invalid.
            BaseException: with a budget, a write that failed while the call was staging.
        """
        if staging not in STAGING_MODES:
            raise ValueError(f"staging must be one of {STAGING_MODES}, got {staging!r}")
        opts = self.options.with_call(max_staging_bytes=max_staging_bytes, compression=compression)
        with self._lock:
            prep, prepared = self._prepare(state, path, opts, overwrite=overwrite, metadata=metadata,
                                           storage_options=storage_options, process_group=process_group,
                                           timeout=timeout, collective=collective, baseline=baseline,
                                           copies=copies)
            handle = SaveHandle(path, prep.nbytes)
            jobs: JobMaker
            if opts.slots is not None:
                slotted = self._slotted_jobs(prep, prepared, handle, opts)
                jobs = lambda: slotted  # noqa: E731
            else:
                sizes = async_jobs.staged_sizes(prep, prepared)
                # Even the buffers are got (and, for a new layout, allocated and
                # pre-faulted) in the writer thread with "background".
                jobs = lambda: async_jobs.staged(prep, prepared, self.arena.get(sizes), self.unit_size)  # noqa: E731
            if staging == "background" or immutable([it for p in prep.plans + prep.coded for it in p.items]):
                # (a JAX state's shards cannot change: staging them need not hold the caller)
                self._start(prep, prepared, handle, jobs, stage=True)
            else:
                # Under a budget the writes must run while the caller stages: they free
                # the buffers the later units are staged into.
                self._stage_blocking(prep, prepared, handle, jobs(),
                                     overlap=opts.overlap_writes or opts.slots is not None)
            return handle

    def _stage_blocking(self, prep: PreparedSave, copies: list[PreparedCopy], handle: SaveHandle,
                        jobs: Jobs, *, overlap: bool) -> None:
        """Copies the state on the caller's thread, then hands the writes to the writer thread.

        With ``overlap`` the writer thread starts first and writes units as they are staged.
        """
        if overlap:
            self._start(prep, copies, handle, lambda: jobs, stage=False)
        try:
            jobs.stage(None)
        except BaseException as e:  # noqa: BLE001 - handed to the writer, then re-raised
            for w in jobs.all_writes():
                w.fail(e)
            if self._thread is not None:
                self._thread.join()
                self._thread = None
            else:  # no writer thread to abort: tell the other ranks ourselves
                pipeline.abort(prep, e)
                for c in copies:
                    fail_copy(c, e)
            handle.mark_collected()  # the caller gets it right here
            self._inflight = []
            raise
        background.mark_staged(handle, copies)
        if not overlap:
            self._start(prep, copies, handle, lambda: jobs, stage=False)

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
        if self._inflight:
            self._inflight[0].result(timeout)

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
        not exist in the child; their locks may be held and their handles never settle.
        The child's copies of the in-flight handles are settled with an error (the save is
        the parent's), and the buffers are new (the parent may be using the inherited ones).
        """
        for h in self._inflight:
            h.orphan_in_child()
        self._lock = threading.Lock()
        self._inflight = []
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
        """Waits for the save in flight; raises its failure (or a copy's) if nobody has
        seen it yet."""
        handles = self._inflight
        if not handles:
            return
        h = handles[0]
        if not h.wait_settled(SLOW_WAIT_S):
            log.warning("save waits for the previous async save to %s, still in flight after %.0f s "
                        "(saving more often than the disk can absorb?)", h.path, SLOW_WAIT_S)
            h.wait_settled()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._inflight = []
        for h in handles:
            err = h.take_failure()
            if err is not None:
                raise CheckpointError(f"the previous async save to {h.path!r} failed: "
                                      f"{type(err).__name__}: {err}") from err

    def _slotted_jobs(self, prep: PreparedSave, copies: list[PreparedCopy], handle: SaveHandle,
                      opts: SaveOptions) -> Jobs:
        """Jobs streaming through the budget's unit buffers of the arena (``async_jobs.slotted``)."""
        assert opts.slots is not None
        slots = self.arena.slots(self.unit_size, opts.slots)
        self._bounce.close()  # idle sync-save buffers: the budget bounds every host buffer
        return async_jobs.slotted(prep, copies, handle, slots, self.unit_size, opts.coding_window)

    def _sync_bounce(self, nbytes: int) -> BouncePool:
        """Bounce buffers of a sync save of ``nbytes``: the budget's slots when there is a
        budget, else ``io_threads()`` buffers of ``sync_unit(nbytes)`` bytes each."""
        count = self.options.slots
        if count is not None:
            return self.arena.slots(self.unit_size, count)
        size = sync_unit(nbytes, self.unit_size)
        if self._bounce.size != size:  # another size class of state: buffers of its size
            self._bounce.close()
            self._bounce = BouncePool(size, io_threads())
        return self._bounce

    def _start(self, prep: PreparedSave, copies: list[PreparedCopy], handle: SaveHandle, jobs: JobMaker,
               *, stage: bool) -> None:
        self._inflight = [handle] + [c.handle for c in copies]
        self._thread = background.start(prep, copies, handle, jobs, stage=stage)

    def write_part(self, prep: PreparedSave) -> Entries:
        """Writes this rank's files of a save planned and committed elsewhere, synchronously.

        ``prep`` comes from ``pipeline.prepare_part``; its working directory exists. Returns
        the entries of what this rank wrote (durable), for the coordinator's
        ``pipeline.commit_parts``. Commits nothing and removes nothing: on failure the files
        are closed and the error raised (the caller's coordinator never commits then).
        """
        with self._lock:
            self._check_open()
            self._wait_previous()
            scratch: list[HostBuffer] = []
            jobs = Jobs([], [], lambda threads: None)
            try:
                jobs = self._streamed_jobs(prep, [], scratch)
                return local_entries(prep, *pipeline.finish_writes(prep, jobs.writes))
            except BaseException:
                for w in jobs.all_writes():
                    w.cancel()
                raise
            finally:
                for b in scratch:
                    b.close()

    def _streamed_jobs(self, prep: PreparedSave, copies: list[PreparedCopy], scratch: list[HostBuffer]) -> Jobs:
        """The started writes of a sync save (``async_jobs.streamed``); ``scratch`` collects
        the whole-file buffers of object stores."""
        bounce = self._sync_bounce(prep.nbytes)  # its buffers are the write units
        return async_jobs.streamed(prep, copies, bounce.size,
                                   lambda storage, path, units, mirrors: self._file_write(
                                       storage, path, units, mirrors, scratch, bounce))

    def _save_streamed(self, prep: PreparedSave, copies: list[PreparedCopy]) -> None:
        """Sync save: stage per unit through bounce buffers (or gather), write, commit."""
        scratch: list[HostBuffer] = []
        jobs = Jobs([], [], lambda threads: None)
        try:
            pipeline.begin(prep)
            for c in copies:
                begin_copy(c)
            jobs = self._streamed_jobs(prep, copies, scratch)
            pipeline.finish_all(prep, jobs.writes, copies, jobs.copy_writes)
        except BaseException as e:
            pipeline.abort_all(prep, jobs.all_writes(), copies, e)
            raise
        finally:
            for b in scratch:
                b.close()

    def _file_write(self, storage: Storage, path: str, units: FileUnits, mirrors: list[UnitMirror],
                    scratch: list[HostBuffer], bounce: BouncePool) -> FileWrite:
        """A started sync-save FileWrite of one data file, all of it ready to be written.

        Streamed through the bounce buffers when the backend writes ranges; object stores
        (``open_writer`` gives None) take whole files, so the file is staged into scratch
        memory (appended to ``scratch``) first.
        """
        writer = storage.open_writer(path, units.size)
        if writer is not None:
            try:
                sources = host_sources(units.plan, device=False)
            except BaseException:
                writer.abort()
                raise
            fw = FileWrite(units, storage, path, sources=sources, bounce=bounce, writer=writer,
                           mirrors=mirrors)
            try:
                fw.start()
                fw.all_ready()
            except BaseException:
                fw.cancel()  # waits for the jobs already submitted, closes the file
                raise
            return fw
        buf = HostBuffer(units.plan.layout.size)
        scratch.append(buf)
        fw = FileWrite(units, storage, path, staged=buf, mirrors=mirrors)
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


# Every Checkpointer alive, so that a forked child can reset them (see _reset_all_in_child).
_LIVE: weakref.WeakSet[Checkpointer] = weakref.WeakSet()


def _reset_all_in_child() -> None:
    """``os.register_at_fork`` hook: the child of a fork can save and load at once.

    Without it a child forked after a save or load (multiprocessing's default start
    method on Linux) waits forever on the parent's pools, locks and in-flight save.
    """
    for c in list(_LIVE):
        c._reset_in_child()


os.register_at_fork(after_in_child=_reset_all_in_child)
