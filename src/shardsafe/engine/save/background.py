"""Work that outlives the call that started it, and how its outcome reaches the caller.

Every background job of the library runs through ``start``: an async save's writer
thread (``save.saver``) and a manager tier's work after a save (``manager.tier_writer``:
retention, the local tier's peer copy). A job is a plain, non-daemon thread whose outcome
settles a ``SaveProgress``, so it reaches the caller the same way whatever the job:

- ``progress.handle.result()`` waits for it and raises its error (once seen, it is not
  reported again);
- a job still running when the main thread ends is finished first, and a failure nobody
  collected is logged as an error (``_drain_at_exit``);
- in a child forked while jobs run (their threads do not exist there), their progresses
  are settled with an error instead of waiting forever (``_orphan_in_child``).

A job is registered until it is known to be fine; the registry holds only jobs, never
their owners (a Saver or a manager may be garbage-collected while its job runs).
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401 - registers its exit hook before ours (see _drain_at_exit)
import logging
import os
import threading
from collections.abc import Callable, Sequence

from .handle import SaveProgress

log = logging.getLogger("shardsafe")


def start(name: str, work: Callable[[], None], progress: SaveProgress,
          others: Sequence[SaveProgress] = ()) -> threading.Thread:
    """Runs ``work()`` on a new thread ``shardsafe-<name>`` and settles ``progress`` with its
    outcome (its error, or None). ``others`` are progresses ``work`` settles itself (an
    async save's replicas): registered alike until known to be fine."""
    with _LOCK:
        _UNSETTLED.add(progress)
        _UNSETTLED.update(others)
    thread = threading.Thread(target=_run, args=(work, progress, list(others)), name=f"shardsafe-{name}",
                              daemon=False)
    thread.start()
    return thread


def _run(work: Callable[[], None], progress: SaveProgress, others: list[SaveProgress]) -> None:
    try:
        work()
    # Everything the job raises is delivered to the caller through its progress (result(),
    # the owner's next call, close(), or the exit hook); nothing here swallows it.
    except BaseException as e:  # noqa: BLE001
        progress.settle(e)
        log.debug("%s failed: %s", progress.label, e)
        return
    progress.settle(None)
    with _LOCK:
        for p in [progress, *others]:
            if p.error is None:
                _UNSETTLED.discard(p)


# Jobs started and not yet known to be fine.
_UNSETTLED: set[SaveProgress] = set()
_LOCK = threading.Lock()


def _orphan_in_child() -> None:
    """``os.register_at_fork`` hook: the parent's jobs do not run in the child."""
    global _LOCK
    _LOCK = threading.Lock()
    for p in list(_UNSETTLED):
        p.orphan_in_child()
    _UNSETTLED.clear()


os.register_at_fork(after_in_child=_orphan_in_child)


def _drain_at_exit() -> None:
    """Finishes the jobs still running when the main thread ends; logs uncollected failures.

    Registered with ``threading._register_atexit`` so it runs before the I/O pool's own
    exit hook (hooks run newest first) and the pool still accepts the jobs' work.
    """
    with _LOCK:
        pending = list(_UNSETTLED)
        _UNSETTLED.clear()
    for p in pending:
        if not p.settled.is_set():
            log.info("waiting for %s to finish before exit", p.label)
            p.settled.wait()
        err = p.take_failure()
        if err is not None:
            log.error("%s failed and nobody called result(): %s: %s", p.label, type(err).__name__, err)


_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_drain_at_exit)
else:  # pragma: no cover - CPython always has it (3.9+)
    import atexit

    atexit.register(_drain_at_exit)


__all__ = ["start"]
