"""``CheckpointManager``: the object a training loop uses (Orbax's verbs, shardsafe's commit).

One writable manager owns a directory of ``step_<N>`` checkpoints (``lock``: a second
writable manager on it raises). ``save`` asks the save policy (``save_policy``) whether a
step is due, captures the state and returns (with ``async_save`` the write, the commit
and then retention continue on a background thread; without it all three are done when
``save`` returns). ``restore`` loads the newest step that verifies, or an explicit step,
optionally rolling the directory back to it. Every decision about which steps exist goes
through ``steps.StepDirectory`` and therefore through ``engine.commit.is_committed``.

Under torch.distributed every rank creates the manager and makes the same calls. Saves
and restores are collective; the ranks agree through ``comm.agreement`` (never by talking
to the store themselves) on decisions that could differ between them: a time-based
interval, a preemption signal that reached only some ranks, a step that fails
verification on one rank only. Rank 0 alone locks and deletes (retention, ``delete``,
leftovers, setting corrupt or rolled-back steps aside) and the others learn its outcome.

Threads: the caller's thread runs ``save``/``restore``/...; one worker thread per manager
waits for each asynchronous save to commit and then applies retention. At most one save
is in flight: a new save first waits for the previous one and raises its error, so no
background error is lost (``wait_until_finished`` and ``close`` raise it too).
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any

from ..comm import agreement
from ..engine.checkpointer import Checkpointer
from ..errors import CheckpointError, CheckpointNotFoundError
from ..plan.flatten import Stateful
from ..storage import storage_for
from . import recovery, saving
from .lock import DirectoryLock
from .options import ManagerOptions
from .policy import best_step, policy_from_options, steps_to_delete
from .preemption import PreemptionWatcher
from .records import StepRecords
from .save_policy import SaveContext, save_policy_from_options, varies_between_ranks
from .saving import Inflight, report_uncollected
from .steps import StepDirectory, encode_metrics, manager_metadata, step_name
from .tier_restore import RestoreInfo
from .tiers import Tiers

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
        **options: The fields of ``ManagerOptions`` (see there).

    Raises:
        ValueError: Invalid or contradictory options.
    """

    def __init__(self, directory: str | os.PathLike[str], **options: Any) -> None:
        self._opts = ManagerOptions(**options)
        self._url = os.fspath(directory)
        so = dict(self._opts.storage_options) if self._opts.storage_options is not None else None
        storage, spath = storage_for(self._url, so)
        self._dir = StepDirectory(storage, spath)
        self._policy = policy_from_options(self._opts)
        self._save_policy = save_policy_from_options(self._opts)
        self._records = StepRecords(self._dir, self._url, read_only=self._opts.read_only)
        self._inflight = Inflight()
        self._last_started: int | None = None
        self._saved_after_signal = False
        self._peer_preempted = False  # another rank received a preemption signal
        self._saves_started = 0
        self._closed = False
        self._worker: ThreadPoolExecutor | None = None
        self._saver: Checkpointer | None = None
        self._incr = saving.Incremental(self._opts.incremental and not self._opts.read_only)
        self._owner_lock: DirectoryLock | None = None
        self._tiers = Tiers(self._opts, writable=False)
        self._watcher = PreemptionWatcher(self._opts.preemption_signals)  # main thread check first
        built = False
        try:
            if not self._opts.read_only:
                storage.makedirs(spath)
                # rank 0 locks the directory and then cleans up (the others would race it over
                # the same files); every rank raises if another manager owns the directory
                agreement.leader_decides(self._take_directory, what=f"locking {self._url!r}")
                self._worker = ThreadPoolExecutor(1, thread_name_prefix="shardsafe-manager")
                # keeps its staging buffers from one save to the next
                self._saver = Checkpointer(max_staging_bytes=self._opts.max_staging_bytes)
                self._tiers = Tiers(self._opts, writable=True)  # the local tier, if any
            self._last_save_time = (time.time() if self._opts.save_interval_seconds is None or self._opts.read_only
                                    else self._records.newest_time())
            built = True
        finally:
            if not built:  # a constructor that raised must not leave handlers or a lock behind
                self._watcher.close()
                self._tiers.close()
                if self._owner_lock is not None:
                    self._owner_lock.release()
        self._finalizer = weakref.finalize(self, report_uncollected, self._inflight, self._owner_lock)

    def _take_directory(self) -> None:
        """Rank 0: takes the owner lock, then removes crash leftovers (now safely ours)."""
        self._owner_lock = DirectoryLock.acquire(self._dir.storage, self._dir.path, self._url)
        self._dir.remove_leftovers()

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

    # ------------------------------------------------------------------ saving
    def _preempted(self) -> bool:
        return self._watcher.received is not None or self._peer_preempted

    def _due(self, step: int) -> bool:
        """Is ``step`` due by the save policy? With several ranks, all of them agree.

        Step-based rules give every rank the same answer; a time interval and a
        preemption signal may not, so then the ranks OR their answers (one tiny
        all-reduce per call): if any rank is due, every rank saves.
        """
        # the listing costs a request per call on object stores: read it only when needed
        latest = self._latest_known() if self._opts.initial_save else None
        ctx = SaveContext(step=step, now=time.time(), last_save_time=self._last_save_time,
                          latest_step=latest, preempted=self._due_by_preemption())
        due = self._save_policy.should_save(ctx) or self._tiers.due(step)
        if agreement.world_size() > 1 and varies_between_ranks(self._opts):
            due, peer_signal = agreement.any_rank([due, self._preempted()])
            if peer_signal and not self._preempted():
                self._peer_preempted = True
        return due

    def _due_by_preemption(self) -> bool:
        """A signal arrived and no save has started since (one save answers one signal)."""
        return self._preempted() and not self._saved_after_signal

    def _latest_known(self) -> int | None:
        """Newest committed step, or the step being saved if that is newer."""
        latest = self.latest_step()
        fut, step = self._inflight.future, self._inflight.step
        if step is not None and fut is not None and (not fut.done() or fut.exception() is None):
            latest = step if latest is None else max(latest, step)
        return latest

    def should_save(self, step: int) -> bool:
        """True when ``step`` is due: by interval, ``save_on_steps``, time, or preemption.

        Always False for a read-only or closed manager and for steps not newer than the
        newest saved step.
        """
        if self._opts.read_only or self._closed:
            return False
        if not self._due(step):
            return False
        latest = self._latest_known()
        return latest is None or step > latest

    def save(self, step: int, state: Mapping[str, Any] | Stateful, *,
             metrics: Mapping[str, Any] | None = None, force: bool = False) -> bool:
        """Saves ``state`` as ``step`` if it is due (or ``force``); returns whether it saved.

        With ``async_save`` this returns once ``state`` has been captured (the caller may
        change its tensors at once) and the write, the commit and retention continue in
        the background. With ``async_save=False`` the commit *and* retention are done when
        it returns, so ``all_steps()`` lists exactly the retained steps.

        A step at or below the newest saved step is not due: without ``force`` that
        returns False, like ``should_save`` (to continue from an older step, restore it
        with ``rollback=True`` first).

        Args:
            step: The training step (a non-negative int).
            state: What to save (tensors, containers, plain values, Stateful objects), or
                a single Stateful object (e.g. ``training_state(accelerator)``).
            metrics: Numbers stored with the step (for ``best_fn`` and ``metrics(step)``).
            force: Save even if the step is not due.

        Raises:
            CheckpointError: ``force`` and ``step`` exists or is older than the newest step,
                the manager is read-only or closed, or the previous background save failed
                (its error); also the previous local-tier save's error, raised after this
                step's saves have started.
            TypeError: A value in ``state`` or ``metrics`` cannot be saved (names the key).
        """
        t0 = time.monotonic()
        saved = self._save_persistent(step, state, metrics=metrics, force=force)
        self._tiers.after_save(step, state, saved, time.monotonic() - t0)
        return saved

    def _save_persistent(self, step: int, state: Mapping[str, Any], *,
                         metrics: Mapping[str, Any] | None, force: bool) -> bool:
        self._check_writable("save")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        if not force and not self._due(step):
            return False
        encode_metrics(metrics)  # fail on bad metrics before waiting or writing anything
        self._wait_persistent()  # a local-tier error is raised after this step's saves started
        if not self._dir.is_new(step, force, self._url):
            return False
        self._incr.keep_only_if(self._dir.committed().values(), self._url)
        now = time.time()
        url = self._dir.storage.join(self._url, step_name(step))
        assert self._worker is not None and self._saver is not None
        try:
            job = saving.start_save(self._saver, state, url,
                                    metadata=manager_metadata(step, now, metrics),
                                    storage_options=self._opts.storage_options,
                                    background=self._opts.async_save, baseline=self._incr.baseline,
                                    compression=self._opts.compression)
        except OSError as e:
            raise CheckpointError(f"saving step {step} to {url!r} failed: {e}") from e
        self._last_started, self._last_save_time = step, now
        self._saved_after_signal = self._preempted()
        self._saves_started += 1  # the same count on every rank: names the save's store keys
        if not self._opts.async_save:  # synchronous means finished: commit and retention
            self._after_save(step, url, job, self._saves_started)
            return True
        self._inflight.step = step
        self._inflight.future = self._worker.submit(self._after_save, step, url, job,
                                                    self._saves_started)
        return True

    def _after_save(self, step: int, url: str, job: saving.SaveJob, seq: int) -> None:
        """Wait for the commit, then apply retention (worker thread, or the caller's)."""
        try:
            job.result()
        except (OSError, CheckpointError) as e:
            raise CheckpointError(f"saving step {step} to {url!r} failed: {e}") from e
        log.info("committed step %d in %s", step, self._url)
        # rank 0 applies retention; the others return once it has (through the store, never
        # the training process group: this may be a background thread), so that every
        # rank's wait_until_finished() returns after retention, as it does on one rank
        try:
            agreement.leader_acts_in_background(
                f"manager/{self._url}/{seq}", self._apply_retention,
                what=f"retention after step {step}", errors=(OSError, CheckpointError, ValueError))
        except (OSError, CheckpointError, ValueError) as e:
            raise CheckpointError(f"step {step} was saved, but retention failed: {e}") from e

    def _apply_retention(self) -> None:
        """Rank 0: un-commits the steps the retention policy drops, then sweeps their data
        (``engine.sweep``: what a kept step references stays)."""
        committed = self._dir.committed()
        dropped = steps_to_delete(self._records.of(committed), self._policy)
        for s in dropped:
            self._dir.uncommit(s, committed[s])
            self._records.forget(s)
            log.info("retention deleted step %d in %s", s, self._url)
        if dropped:
            self._dir.sweep(self._incr.pinned())

    def wait_until_finished(self) -> None:
        """Blocks until the save in flight is committed and retention has run.

        Raises:
            CheckpointError: The background save (or its retention) failed, or the last
                local-tier save did.
        """
        try:
            self._wait_persistent()
        finally:
            self._tiers.wait()

    def _wait_persistent(self) -> None:
        fut = self._inflight.future
        if fut is None:
            return
        try:
            fut.result()  # errors of the write and of retention arrive wrapped, naming the step
        finally:
            self._inflight.future = None
            self._inflight.step = None

    def reached_preemption(self, step: int) -> bool:
        """True once a preemption signal has arrived and a checkpoint answers it.

        That is: ``step`` itself was saved, or a save has started since the signal. The
        loop then calls ``wait_until_finished()`` (or ``close()``) and exits. A signal that
        arrives after ``save(step)`` decided not to save yields False for that step, so the
        loop runs one more step, whose ``save`` is then due.
        """
        if not self._preempted() or self._last_started is None:
            return False
        return self._saved_after_signal or step <= self._last_started

    def delete(self, step: int) -> None:
        """Deletes ``step`` crash-safely (its index first, then its data).

        Raises:
            CheckpointNotFoundError: There is no such step.
        """
        self._check_writable("delete")
        if step == self._inflight.step or self._incr.baseline is not None:
            self.wait_until_finished()  # (incremental: its references are not committed yet)
        name = self._dir.committed().get(step)
        if name is None and step_name(step) not in self._dir.leftovers():
            raise CheckpointNotFoundError(f"step {step} does not exist in {self._url!r}")
        self._incr.keep_only_if([n for s, n in self._dir.committed().items() if s != step], self._url)
        if agreement.is_leader():  # with several ranks, rank 0 deletes for all of them
            inflight = self._inflight.step
            self._dir.delete(step, name, self._incr.pinned(),
                             exclude=[step_name(inflight)] if inflight is not None else [])
        self._records.forget(step)

    def _check_writable(self, what: str) -> None:
        if self._closed:
            raise CheckpointError(f"cannot {what}: the CheckpointManager for {self._url!r} is closed")
        if self._opts.read_only:
            raise CheckpointError(f"cannot {what}: the CheckpointManager for {self._url!r} is read-only")

    # ------------------------------------------------------------------ restoring
    def restore(self, state: MutableMapping[str, Any] | Stateful, step: int | None = None, *,
                rollback: bool = False) -> int | None:
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
        each can get from its node or a peer (``tier_restore``); the persistent tier is read
        only if that is older than its newest step. ``last_restore`` says which.

        Returns:
            The restored step, or None when there is no committed step.

        Raises:
            CorruptCheckpointError: The step failed verification and fallback is off, or no
                committed step verifies.
            CheckpointNotFoundError: An explicit ``step`` does not exist.
            StateMismatchError: ``state`` does not match the checkpoint's structure.
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
        if step is None and (got := self._tiers.restore_local(state, self.latest_step())) is not None:
            return got  # the newest step every rank could get from its node or a peer
        if step is not None:
            name = self._dir.committed().get(step, step_name(step))
            recovery.load_step(self._dir, self._url, step, name, state, self._opts.storage_options,
                               agree=agreement.worst)
            if rollback:
                agreement.leader_decides(lambda: recovery.roll_back_after(self._dir, self._url, step),
                                         what=f"rolling back {self._url!r} to step {step}")
                self._records.forget(step, and_newer=True)
                if self._last_started is not None and self._last_started > step:
                    self._last_started = step
            self._tiers.restored(step, t0, forget=rollback)
            return step
        out = recovery.restore_newest(self._dir, self._url, state, fallback=self._opts.restore_fallback,
                                      storage_options=self._opts.storage_options, agree=agreement.worst)
        if out.step is not None:
            self._set_aside(out.corrupt, out.step)
        self._tiers.restored(out.step, t0, forget=True)
        return out.step

    def _set_aside(self, corrupt: Mapping[int, tuple[str, str]], restored: int) -> None:
        if self._opts.read_only or not agreement.is_leader():
            return
        for s, (name, _) in sorted(corrupt.items()):
            if s > restored:
                new = self._dir.set_aside(s, name)
                self._records.forget(s)
                where = f"moved aside to {new}" if new else "deleted"
                log.warning("corrupt step %d in %s %s so that training can continue from step %d",
                            s, self._url, where, restored)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Waits for the save in flight, restores signal handlers and stops the worker.

        Raises:
            CheckpointError: The last background save failed.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self.wait_until_finished()
        finally:
            self._watcher.close()
            if self._worker is not None:
                self._worker.shutdown(wait=True)
            if self._saver is not None:
                self._saver.close()  # frees the staging buffers; its saves were collected above
            self._tiers.close()
            self._finalizer.detach()
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

    # ------------------------------------------------------------------ tiers
    def local_steps(self) -> list[int]:
        """This rank's local-tier steps, oldest first (never listed by ``all_steps()``)."""
        return self._tiers.local_steps()

    @property
    def last_restore(self) -> RestoreInfo | None:
        """Step, tier (local, peer or persistent) and seconds of the last ``restore``."""
        return self._tiers.last_restore

    @property
    def current_interval_steps(self) -> int | None:
        """The persistent save interval in force (with ``"auto"``: Young/Daly's, None
        until the first save has been measured)."""
        return self._tiers.current_interval()
