"""The writer thread of an async save, and the saves nobody has collected yet.

``start`` runs a save's background part on a plain thread (not an I/O-pool worker: it
waits for I/O-pool jobs, and a pool worker waiting for its own pool can deadlock):
[stage,] write, commit each copy, commit the save; every outcome goes to its handle.

Saves started and not yet known to be fine are registered: at interpreter exit
``_drain_at_exit`` finishes them (even when their Checkpointer is gone) and logs the
failures nobody collected; in a forked child they are settled as the parent's
(``orphan_in_child``), so the child's exit does not wait for them.
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401 - registers its exit hook before ours (see _drain_at_exit)
import logging
import os
import threading
from collections.abc import Callable, Sequence

from . import pipeline
from .async_jobs import Jobs
from .copies import PreparedCopy, begin_copy
from .handle import SaveHandle
from .prepared import PreparedSave

log = logging.getLogger("shardsafe")

BACKGROUND_COPY_THREADS = 1
JobMaker = Callable[[], Jobs]


def mark_staged(handle: SaveHandle, copies: Sequence[PreparedCopy]) -> None:
    """The state is copied: the save's and its copies' ``wait_staged()`` return."""
    handle.mark_staged()
    for c in copies:
        c.handle.mark_staged()


def start(prep: PreparedSave, copies: list[PreparedCopy], handle: SaveHandle, jobs: JobMaker, *,
          stage: bool) -> threading.Thread:
    """Starts the writer thread of a save (registered until it is known to be fine)."""
    with _UNSETTLED_LOCK:
        _UNSETTLED.update([handle] + [c.handle for c in copies])
    t = threading.Thread(target=_run, args=(prep, copies, handle, jobs, stage),
                         name="shardsafe-writer", daemon=False)
    t.start()
    return t


def _run(prep: PreparedSave, copies: list[PreparedCopy], handle: SaveHandle, jobs: JobMaker,
         stage: bool) -> None:
    """Body of the writer thread: [stage,] write, commit (copies first); the outcomes go to
    the handles."""
    work = Jobs([], [], lambda threads: None)
    try:
        work = jobs()
        for c in copies:  # (the save's writes start its mirrors, inside the copies)
            begin_copy(c)
        pipeline.begin(prep)
        for w in work.writes:
            w.start()
        for c, own in zip(copies, work.copy_writes):
            try:
                if c.error is None:
                    for w in own:
                        w.start()
            except (OSError, ValueError) as e:  # this copy fails alone
                c.error = e
        if stage:
            try:
                # One copying thread: background staging overlaps the caller's compute,
                # and more copy threads would take cores from it (the copy only has to
                # finish before the caller's next wait_staged()).
                work.stage(BACKGROUND_COPY_THREADS)
            except BaseException as e:  # noqa: BLE001 - forwarded to the waiting writers
                for w in work.all_writes():
                    w.fail(e)
                raise
            mark_staged(handle, copies)
        pipeline.finish_all(prep, work.writes, copies, work.copy_writes)
    # Everything the save raises is delivered to the caller through the handles (result(),
    # the next save, close(), or the exit hook); nothing here swallows it.
    except BaseException as e:  # noqa: BLE001
        pipeline.abort_all(prep, work.all_writes(), copies, e)
        handle.settle(e)
        log.debug("async save to %s failed: %s", handle.path, e)
        return
    handle.settle(None)
    with _UNSETTLED_LOCK:
        _UNSETTLED.discard(handle)
        for c in copies:
            if not c.handle.failed:
                _UNSETTLED.discard(c.handle)


# Saves started and not yet known to be fine: the exit hook finishes them (even when their
# Checkpointer is gone) and logs the failures nobody collected.
_UNSETTLED: set[SaveHandle] = set()
_UNSETTLED_LOCK = threading.Lock()


def _reset_in_child() -> None:
    """After ``fork``: the parent's saves are not the child's (see the module docstring)."""
    global _UNSETTLED_LOCK
    _UNSETTLED_LOCK = threading.Lock()
    for h in list(_UNSETTLED):
        h.orphan_in_child()
    _UNSETTLED.clear()


os.register_at_fork(after_in_child=_reset_in_child)


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
