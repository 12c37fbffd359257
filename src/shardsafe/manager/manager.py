"""``CheckpointManager``: the object a training loop uses (Orbax's verbs, shardsafe's commit).

One writable manager owns a directory of ``step_<N>`` checkpoints (``lock``: a second
writable manager on it raises), and optionally a local tier on each node
(``local_tier``). ``save`` asks the save policy (``save_policy``) whether a step is due
for the persistent tier and the local tier's interval whether it is due there, then
starts one save for every due tier (``tier_save``: the state is staged once) and
returns once the state is captured; each tier's ``TierWriter`` (``tier_writer``) waits
for its commit and applies its retention, in the background with ``async_save``, before
``save`` returns without. ``restore`` loads the newest step every rank can get, from the
fastest tier that has it (``tier_restore``), else the newest persistent step that
verifies (``recovery``), or an explicit step, optionally rolling the directory back to
it. Every decision about which steps exist goes through ``steps.StepDirectory`` and
therefore through ``engine.commit.is_committed``.

Under torch.distributed every rank creates the manager and makes the same calls. Saves
and restores are collective; the ranks agree through ``comm.agreement`` (never by talking
to the store themselves), every question bounded by the manager's ``timeout``: a rank
that stops calling the manager turns into ``CheckpointTimeoutError`` naming it. Rank 0
alone locks and deletes (retention, ``delete``, leftovers, setting corrupt or
rolled-back steps aside) and the others learn its outcome.

Errors: at most one save per tier is in flight. A step due on the persistent tier waits
for the persistent save in flight and raises its failure before anything of the new step
is saved; every step waits for the local save in flight (a local write is fast) and
raises its failure only once the new step's saves have started (the local tier never
stops the persistent one). A step due on the local tier alone does not wait for a
persistent save still writing (``tier_save``). ``wait_until_finished`` and ``close``
raise them too; none is lost.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Iterable, Mapping, MutableMapping
from types import TracebackType
from typing import Any, Literal

from ..comm.agreement import Agreement
from ..errors import CheckpointError, CheckpointNotFoundError
from ..format.codec import Compression
from ..plan.flatten import Stateful
from ..storage import storage_for
from . import recovery
from .local_tier import LocalTier
from .lock import DirectoryLock
from .options import BestFn, BestMode, ManagerOptions, Seconds, check_directory, options_section
from .persistent_tier import PersistentTier
from .records import StepRecords
from .retention import best_step, policy_from_options
from .run_identity import ensure_run_id, read_run_id
from .save_policy import is_new_step
from .schedule import SaveSchedule
from .steps import StepDirectory, encode_metrics, step_name
from .tier_restore import RestoreInfo, restore_local
from .tier_save import TierSaver
from .tier_writer import TierWriter, report_uncollected

log = logging.getLogger("shardsafe")


class CheckpointManager:
    """Saves, retains and restores the checkpoints of a training run in one directory.

    Example::

        with shardsafe.CheckpointManager("ckpt", save_interval_steps=100, max_to_keep=3,
                                         preemption_signals=(signal.SIGTERM,)) as mgr:
            start = (mgr.restore(state) or -1) + 1
            for step in range(start, num_steps):
                train_step()
                mgr.save(step, state, metrics={"loss": loss})
                if mgr.reached_preemption(step):
                    break

    Args:
        directory: Where the ``step_<N>`` checkpoints live (a local path or URL).

    The keyword options, ``save_interval_steps`` to ``compression``, are the fields of
    ``ManagerOptions``: each has the same name, type and default there, where it is
    documented (and listed below).

    Raises:
        ValueError: Invalid or contradictory options (the message names them).
    """

    def __init__(self, directory: str | os.PathLike[str], *,
                 save_interval_steps: int | Literal["auto"] | None = 1,
                 save_on_steps: Iterable[int] = frozenset(),
                 save_interval_seconds: Seconds | None = None,
                 initial_save: bool = False,
                 max_to_keep: int | None = None,
                 keep_period: int | None = None,
                 keep_time_interval: Seconds | None = None,
                 best_fn: BestFn | None = None,
                 best_mode: BestMode = "max",
                 keep_checkpoints_without_metrics: bool = True,
                 async_save: bool = True,
                 max_staging_bytes: int | None = None,
                 preemption_signals: Iterable[int] = (),
                 read_only: bool = False,
                 restore_fallback: bool = True,
                 storage_options: Mapping[str, Any] | None = None,
                 incremental: bool = False,
                 local_directory: str | os.PathLike[str] | None = None,
                 local_save_interval_steps: int | None = None,
                 local_max_to_keep: int = 2,
                 local_replication: bool = False,
                 expected_mtbf_seconds: Seconds | None = None,
                 timeout: Seconds | None = None,
                 compression: Compression | None = None) -> None:
        given = locals()
        options = {name: given[name] for name in ManagerOptions.__dataclass_fields__}
        self._opts = opts = ManagerOptions(**options)
        self._url = os.fspath(directory)
        check_directory(opts, self._url)
        so = dict(opts.storage_options) if opts.storage_options is not None else None
        storage, spath = storage_for(self._url, so)
        self._dir = StepDirectory(storage, spath)
        self._agree = Agreement(opts.timeout)
        self._records = StepRecords(self._dir, self._url, read_only=opts.read_only)
        self._persistent = PersistentTier(self._dir, self._url, self._records, policy_from_options(opts),
                                          self._agree, incremental=opts.incremental)
        self._saves_started = 0
        self._closed = False
        self._owner_lock: DirectoryLock | None = None
        self._local: LocalTier | None = None
        self._last_restore: RestoreInfo | None = None
        self._writers: list[TierWriter] = []
        self._saver: TierSaver | None = None
        self._schedule = SaveSchedule(opts, self._agree, lambda: self._agree.leader_decides(
            self._records.newest_time, what="reading the newest step's save time"))  # signals: main thread first
        built = False
        try:
            run = self._open_directory()
            if opts.local_directory is not None:  # collective with replication
                self._local = LocalTier(opts.local_directory, run=run, interval=opts.local_save_interval_steps or 1,
                                        max_to_keep=opts.local_max_to_keep, replication=opts.local_replication,
                                        agreement=self._agree, writable=not opts.read_only)
            if not opts.read_only:
                self._writers = [TierWriter(self._persistent, "persistent", background=opts.async_save)]
                if self._local is not None:
                    self._writers.append(TierWriter(self._local, "local", background=opts.async_save))
                self._saver = TierSaver(opts)  # keeps its staging buffers from one save to the next
            built = True
        finally:
            if not built:  # a constructor that raised must not leave handlers or a lock behind
                self._release()
        self._finalizer = weakref.finalize(self, report_uncollected, [w.slot for w in self._writers],
                                           self._owner_lock)

    def _open_directory(self) -> str | None:
        """Locks and cleans the directory (writable), and returns its run id (local tier)."""
        storage, spath = self._dir.storage, self._dir.path
        if self._opts.read_only:
            return read_run_id(storage, spath) if self._opts.local_directory is not None else None
        storage.makedirs(spath)
        # rank 0 locks the directory and then cleans up (the others would race it over the
        # same files); every rank raises if another manager owns the directory
        return self._agree.leader_decides(self._take_directory, what=f"locking {self._url!r}")

    def _take_directory(self) -> str | None:
        """Rank 0: takes the owner lock, removes crash leftovers (now safely ours) and, with a
        local tier, returns the directory's run id (``run_identity``)."""
        self._owner_lock = DirectoryLock.acquire(self._dir.storage, self._dir.path, self._url)
        self._dir.remove_leftovers()
        if self._opts.local_directory is None:
            return None
        return ensure_run_id(self._dir.storage, self._dir.path)

    @classmethod
    def from_options(cls, directory: str | os.PathLike[str], options: ManagerOptions) -> CheckpointManager:
        """A manager configured by a ``ManagerOptions`` value."""
        fields = {name: getattr(options, name) for name in ManagerOptions.__dataclass_fields__}
        return cls(directory, **fields)

    @property
    def directory(self) -> str:
        """The directory (or URL) this manager was given."""
        return self._url

    @property
    def options(self) -> ManagerOptions:
        """The validated options."""
        return self._opts

    # ------------------------------------------------------------------ listing
    def all_steps(self) -> list[int]:
        """Committed steps, oldest first (steps still being written are not listed)."""
        return list(self._dir.committed())

    def latest_step(self) -> int | None:
        """The newest committed step, or None."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def metrics(self, step: int) -> dict[str, Any] | None:
        """The metrics saved with ``step`` (None if it was saved without metrics).

        Raises:
            CheckpointNotFoundError: ``step`` is not a committed checkpoint.
        """
        name = self._dir.committed().get(step)
        if name is None:
            raise CheckpointNotFoundError(f"step {step} is not a committed checkpoint in {self._url!r}")
        m = self._records.get(step, name).metrics
        return dict(m) if m is not None else None

    def best_step(self) -> int | None:
        """The committed step with the best ``best_fn`` (the latest step without ``best_fn``)."""
        if self._opts.best_fn is None:
            return self.latest_step()
        return best_step(self._records.of(self._dir.committed()), self._opts.best_fn,
                         self._opts.best_mode)

    def local_steps(self) -> list[int]:
        """This rank's local-tier steps, oldest first (never listed by ``all_steps()``)."""
        return self._local.steps() if self._local is not None else []

    # ------------------------------------------------------------------ saving
    def _latest_known(self) -> int | None:
        """Newest committed step, or the step being saved if that is newer."""
        latest = self.latest_step()
        step = self._writers[0].step if self._writers else None
        if step is not None:
            latest = step if latest is None else max(latest, step)
        return latest

    def should_save(self, step: int) -> bool:
        """True when ``step`` is due: by interval, ``save_on_steps``, time, or preemption.

        Always False for a read-only or closed manager and for steps not newer than the
        newest saved step.
        """
        if self._opts.read_only or self._closed:
            return False
        if not self._schedule.due(step, self._latest_known):
            return False
        latest = self._latest_known()
        return latest is None or step > latest

    def save(self, step: int, state: Mapping[str, Any] | Stateful, *,
             metrics: Mapping[str, Any] | None = None, force: bool = False) -> bool:
        """Saves ``state`` as ``step`` if it is due (or ``force``); returns whether it saved.

        With ``async_save`` this returns once ``state`` has been captured (the caller may
        change its tensors at once) and the write, the commit and retention continue in
        the background. With ``async_save=False`` the commit *and* retention are done when
        it returns, so ``all_steps()`` lists exactly the retained steps. A step due on both
        tiers is copied out of training memory once; the local tier is saved whenever its
        interval says so, whatever the persistent tier decided.

        A step at or below the newest saved step is not due: without ``force`` that
        returns False, like ``should_save`` (to continue from an older step, restore it
        with ``rollback=True`` first).

        Args:
            step: The training step (a non-negative int).
            state: What to save (tensors, containers, plain values, Stateful objects), or
                a single Stateful object (e.g. ``training_state(accelerator)``).
            metrics: Numbers stored with the step (for ``best_fn`` and ``metrics(step)``).
            force: Save even if the step is not due.

        Returns:
            Whether ``step`` was saved to the persistent tier.

        Raises:
            CheckpointError: ``force`` and ``step`` exists or is older than the newest step,
                the manager is read-only or closed, or the previous background save failed
                (its error); also the previous local-tier save's error, raised after this
                step's saves have started.
            CheckpointTimeoutError: another rank did not take part within ``timeout``.
            TypeError: A value in ``state`` or ``metrics`` cannot be saved (names the key).
        """
        self._check_writable("save")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        t0 = time.monotonic()
        persistent = self._schedule.due(step, self._latest_known) or force
        local = self._local is not None and self._local.due(step)
        if not (persistent or local):
            return False
        encode_metrics(metrics)  # fail on bad metrics before waiting or writing anything
        if persistent:
            self._writers[0].wait()  # a persistent failure: nothing of this step is saved
        # the local save in flight ends first (raised once this step's saves have started)
        local_error = self._writers[1].take_error() if self._local is not None else None
        if persistent:
            committed = self._dir.committed()
            persistent = is_new_step(step, committed, force=force, where=self._url)
            self._persistent.keep_baseline_only_if(list(committed.values()))
        if persistent:
            self._saves_started += 1  # the same count on every rank: names the save's store keys
        assert self._saver is not None
        self._saver.save(step, state, metrics=metrics, persistent=self._persistent if persistent else None,
                         local=self._local if local else None, writers=self._writers, seq=self._saves_started)
        if persistent:
            self._schedule.started(step, time.monotonic() - t0)
        if local_error is not None:
            raise local_error
        return persistent

    def wait_until_finished(self) -> None:
        """Blocks until the saves in flight are committed and retention has run.

        Raises:
            CheckpointError: A background save (or its retention, or its peer copy) failed.
        """
        errors = [e for w in self._writers if (e := w.take_error()) is not None]
        if errors:
            raise errors[0]

    def reached_preemption(self, step: int) -> bool:
        """True once a preemption signal has arrived and a checkpoint answers it.

        That is: ``step`` itself was saved, or a save has started since the signal. The
        loop then calls ``wait_until_finished()`` (or ``close()``) and exits. A signal that
        arrives after ``save(step)`` decided not to save yields False for that step, so the
        loop runs one more step, whose ``save`` is then due.
        """
        return self._schedule.reached_preemption(step)

    def delete(self, step: int) -> None:
        """Deletes ``step`` crash-safely (its index first, then its data).

        Raises:
            CheckpointNotFoundError: There is no such step.
        """
        self._check_writable("delete")
        inflight = self._writers[0].step
        if step == inflight or self._persistent.baseline is not None:
            self.wait_until_finished()  # (incremental: its references are not committed yet)
            inflight = None
        name = self._dir.committed().get(step)
        if name is None and step_name(step) not in self._dir.leftovers():
            raise CheckpointNotFoundError(f"step {step} does not exist in {self._url!r}")
        self._persistent.keep_baseline_only_if([n for s, n in self._dir.committed().items() if s != step])
        if self._agree.is_leader:  # with several ranks, rank 0 deletes for all of them
            self._dir.delete(step, name, self._persistent.pinned(),
                             exclude=[step_name(inflight)] if inflight is not None else [])
        self._records.forget(step)

    def _check_writable(self, what: str) -> None:
        if self._closed:
            raise CheckpointError(f"cannot {what}: the CheckpointManager for {self._url!r} is closed")
        if self._opts.read_only:
            raise CheckpointError(f"cannot {what}: the CheckpointManager for {self._url!r} is read-only")

    # ------------------------------------------------------------------ restoring
    def restore(self, state: MutableMapping[str, Any] | Stateful, step: int | None = None, *,
                rollback: bool = False, cast: bool = False) -> int | None:
        """Loads a checkpoint into ``state`` in place and returns its step.

        With ``step=None`` the newest committed step is loaded; if it fails verification
        (a checksum, a truncated or missing file) a warning names the step and the reason
        and the next older step is tried, unless ``restore_fallback=False``. A writable
        manager then moves the corrupt newer steps aside (``step_N.corrupt``) so training
        can continue saving from the restored step.

        With ``rollback=True`` (an explicit ``step``, a writable manager) training
        continues from ``step`` (e.g. after a loss spike): once it has loaded, every
        newer step is moved aside as ``step_N.rolled-back-<UTC time>``. Nothing is
        deleted; moved steps are no longer listed by ``all_steps()``, ``shardsafe ls``
        shows them, and renaming one back restores it.

        With ``local_directory`` and ``step=None`` the ranks first agree on the newest step
        each can get from its node or a peer (``tier_restore``; a read-only manager too);
        the persistent tier is read only if that is older than its newest step.
        ``last_restore`` says which tier was used.

        ``cast=True`` converts floating-point values saved in another floating-point dtype
        than ``state``'s (as ``shardsafe.load(..., cast=True)``).

        Returns:
            The restored step, or None when there is no committed step.

        Raises:
            CorruptCheckpointError: The step failed verification and fallback is off, or no
                committed step verifies.
            CheckpointNotFoundError: An explicit ``step`` does not exist.
            StateMismatchError: ``state`` does not match the checkpoint's structure.
            CheckpointTimeoutError: another rank did not take part within ``timeout``.
            CheckpointError: ``rollback`` without ``step``, on a read-only manager, or on
                storage that cannot rename (object stores).
        """
        if self._closed:
            raise CheckpointError(f"cannot restore: the CheckpointManager for {self._url!r} is closed")
        if rollback:
            self._check_writable("roll back")
            recovery.check_rollback(self._dir, self._url, step)
        if not self._opts.read_only:
            self.wait_until_finished()
        t0 = time.monotonic()
        listing = lambda: recovery.listed_once(self._dir, self._agree)  # noqa: E731 - one rank lists
        if step is None and self._local is not None:
            got = restore_local(self._local, self._agree, state, max(listing(), default=None), cast)
            if got is not None:  # the newest step every rank could get from its node or a peer
                self._last_restore = got
                return got.step
        if step is not None:
            self._restore_step(state, step, rollback, listing().get(step, step_name(step)), cast)
        else:
            out = recovery.restore_newest(self._dir, self._url, state, fallback=self._opts.restore_fallback,
                                          storage_options=self._opts.storage_options, agree=self._agree.worst,
                                          timeout=self._agree.timeout, listing=listing, cast=cast)
            if out.step is not None:
                self._set_aside(out.corrupt, out.step)
            else:
                log.info("no committed step in %s: starting fresh", self._url)
            step, rollback = out.step, True
        self._last_restore = RestoreInfo(step, "persistent", time.monotonic() - t0)
        if rollback and self._local is not None and step is not None:
            self._local.forget_newer(step)  # training continues from ``step``
        return step

    def _restore_step(self, state: MutableMapping[str, Any], step: int, rollback: bool, name: str,
                      cast: bool) -> None:
        recovery.load_step(self._dir, self._url, step, name, state, self._opts.storage_options,
                           agree=self._agree.worst, timeout=self._agree.timeout, cast=cast)
        if rollback:
            self._agree.leader_decides(lambda: recovery.roll_back_after(self._dir, self._url, step),
                                       what=f"rolling back {self._url!r} to step {step}")
            self._records.forget(step, and_newer=True)
            self._schedule.rolled_back(step)

    def _set_aside(self, corrupt: Mapping[int, tuple[str, str]], restored: int) -> None:
        if self._opts.read_only or not self._agree.is_leader:
            return
        for s, (name, _) in sorted(corrupt.items()):
            if s > restored:
                new = self._dir.set_aside(s, name)
                self._records.forget(s)
                where = f"moved aside to {new}" if new else "deleted"
                log.warning("corrupt step %d in %s %s so that training can continue from step %d",
                            s, self._url, where, restored)

    @property
    def last_restore(self) -> RestoreInfo | None:
        """Step, tier (local, peer or persistent) and seconds of the last ``restore``."""
        return self._last_restore

    @property
    def current_interval_steps(self) -> int | None:
        """The persistent save interval in force (with ``"auto"``: Young/Daly's, None
        until the first save has been measured)."""
        return self._schedule.interval

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Waits for the saves in flight, restores signal handlers and stops the workers.

        Raises:
            CheckpointError: The last background save failed.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self.wait_until_finished()
        finally:
            self._release()
            self._finalizer.detach()

    def _release(self) -> None:
        """Frees buffers and handlers, closes the peers' link, unlocks."""
        self._schedule.close()
        if self._saver is not None:
            self._saver.close()  # frees the staging buffers; its saves were collected above
        if self._local is not None:
            self._local.close()
        if self._owner_lock is not None:
            self._owner_lock.release_quietly()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except (CheckpointError, OSError) as e:
            # the body's exception wins; the save failure travels with it
            exc.add_note(f"shardsafe: also, closing the CheckpointManager failed: {e!r}")

    def __repr__(self) -> str:
        mode = "read-only" if self._opts.read_only else "writable"
        return f"CheckpointManager({self._url!r}, {mode})"


CheckpointManager.__doc__ = (CheckpointManager.__doc__ or "") + options_section()
