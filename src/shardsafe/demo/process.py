"""A training process of the demo, started ahead of its turn and followed through its events."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from ..harness.processes import child_env
from .events import WorkerLog


class DemoError(RuntimeError):
    """The demo could not run as planned (a worker failed or the options do not fit)."""


class TrainingProcess:
    """One training process (``python -m shardsafe.demo.worker``), started ahead of its turn.

    The process imports torch and builds its model at once, then waits until ``go()``
    before it opens the checkpoint directory; so its start-up overlaps the previous
    phase (each start costs seconds on a small machine) without touching the directory
    that the previous process is still writing.

    Args:
        name: Its name in the report.
        args: Worker arguments (``--wait-for-go`` is added).
        timeout_s: Kill it this many seconds after the start.
    """

    def __init__(self, name: str, args: list[str], timeout_s: float) -> None:
        self.log = WorkerLog(name)
        self.timeout_s = timeout_s
        self._started = time.perf_counter()
        self._go: float | None = None
        self._err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shardsafe.demo.worker", *args, "--wait-for-go"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True,
            env=child_env())
        self._watchdog = threading.Timer(timeout_s, self.proc.kill)
        self._watchdog.start()

    def go(self) -> None:
        """Lets the process open the directory and train."""
        assert self.proc.stdin is not None
        self._go = time.perf_counter()
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # it died during start-up; follow() reports how

    def follow(self, signal_at: tuple[int, signal.Signals] | None = None) -> WorkerLog:
        """Reads its events until it ends; sends ``signal_at[1]`` once it reports step ``signal_at[0]``.

        A SIGKILLed process must die of it; a SIGTERMed one must save, report the
        preemption and exit 0.

        Raises:
            DemoError: The process failed, timed out, or ended before it could be signalled.
        """
        try:
            _follow(self.proc, self.log, signal_at)
            self.log.returncode = self.proc.wait()
        finally:
            self._terminate()
        # training time: from the moment it had restored (its start event) to its end
        self.log.wall_s = time.perf_counter() - (self.log.ready_at or self._go or self._started)
        self._err.seek(0)
        stderr = self._err.read()
        self._err.close()
        timed_out = time.perf_counter() - self._started >= self.timeout_s
        _check_ending(self.log, signal_at, stderr, timed_out)
        return self.log

    def stop(self) -> None:
        """Kills the process if it still runs (after a failure elsewhere) and cleans up."""
        self._terminate()
        self._err.close()

    def _terminate(self) -> None:
        self._watchdog.cancel()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None and not f.closed:
                try:
                    f.close()
                except BrokenPipeError:
                    pass


def _follow(proc: subprocess.Popen, log: WorkerLog,
            signal_at: tuple[int, signal.Signals] | None) -> None:
    """Reads the worker's events; sends the planned signal once it reports the step."""
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            ev = json.loads(line)
        except ValueError:
            continue  # stray output of a library; events are JSON lines
        if not isinstance(ev, dict):
            continue
        log.handle(ev)
        if ev.get("event") == "start":
            log.ready_at = time.perf_counter()
        if signal_at is not None and log.signal_sent_at is None and \
                ev.get("event") == "step" and log.last_step >= signal_at[0]:
            os.kill(proc.pid, signal_at[1])
            log.signal_sent_at = log.last_step


def _check_ending(log: WorkerLog, signal_at: tuple[int, signal.Signals] | None,
                  stderr: str, timed_out: bool) -> None:
    sig = None if signal_at is None else signal_at[1]
    if sig == signal.SIGKILL and log.signal_sent_at is not None \
            and log.returncode == -signal.SIGKILL:
        return
    if log.returncode != 0:
        why = "timed out" if timed_out else f"exited with {log.returncode}"
        raise DemoError(f"the {log.name} training process {why}:\n{stderr[-3000:]}")
    if signal_at is not None and log.signal_sent_at is None:
        raise DemoError(f"the {log.name} process finished before it could get "
                        f"{signal_at[1].name} at step {signal_at[0]}")
    if sig == signal.SIGKILL:
        raise DemoError(f"the {log.name} process exited before SIGKILL arrived")
    if sig == signal.SIGTERM and log.preempted_step is None:
        raise DemoError(f"the {log.name} process got SIGTERM but did not report a preemption "
                        f"checkpoint:\n{stderr[-3000:]}")
