"""Orchestration of ``shardsafe demo``: reference run, crashed run, resumed run, comparison.

Three training processes run one after another (``python -m shardsafe.demo.worker``):

1. *reference*: trains all steps without interruption and saves its final state.
2. *crashed*: trains with a checkpoint every ``every`` steps; this process sends it
   SIGKILL once it reports a step chosen at random (seeded) after the first checkpoint
   and away from checkpoint boundaries.
3. *resumed*: a new process restores the newest committed checkpoint, trains to the end
   and saves its final state.

The two final states must be bit-identical. Library code does not print: ``report``
returns the text and the CLI prints it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import shardsafe

from .compare import differences, fingerprint
from .train import TrainConfig


class DemoError(RuntimeError):
    """The demo could not run as planned (a worker failed or the options do not fit)."""


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What ``shardsafe demo`` does.

    Attributes:
        steps: Training steps of the whole run.
        every: Checkpoint interval in steps.
        seed: Seeds the job and the crash point.
        directory: Where checkpoints go; None uses a temporary directory removed at the end.
        corrupt_resume: Resume deliberately wrong (forget the RNG state), to show that the
            comparison catches it. For tests.
        timeout_s: Upper bound for each training process.
    """

    steps: int = 300
    every: int = 25
    seed: int = 0
    directory: str | None = None
    corrupt_resume: bool = False
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        plan_crash(self.steps, self.every, self.seed)  # raises ValueError when they do not fit


@dataclass(frozen=True, slots=True)
class SaveEvent:
    """A checkpoint a worker reported."""

    step: int
    blocked_s: float
    nbytes: int


@dataclass(slots=True)
class WorkerLog:
    """What one training process reported, and how it ended."""

    name: str
    start_step: int = 0
    resumed_from: int | None = None
    last_step: int = 0
    saves: list[SaveEvent] = field(default_factory=list)
    fingerprint: str | None = None
    returncode: int | None = None
    killed: bool = False
    wall_s: float = 0.0


@dataclass(slots=True)
class DemoResult:
    """Everything the report shows."""

    options: DemoOptions
    config: TrainConfig
    crash_planned: int
    reference: WorkerLog
    crashed: WorkerLog
    resumed: WorkerLog
    differences: list[str]

    @property
    def identical(self) -> bool:
        return not self.differences

    @property
    def saves(self) -> list[SaveEvent]:
        return self.crashed.saves + self.resumed.saves

    @property
    def steps_lost(self) -> int:
        """Steps the crashed process completed after its last checkpoint (run again)."""
        return self.crashed.last_step - (self.resumed.resumed_from or 0)


def plan_crash(steps: int, every: int, seed: int) -> int:
    """The step after which the crashed run is killed: seeded, after the first checkpoint,
    in the middle half of a checkpoint interval (so the kill lands between checkpoints even
    if the process runs on for a few steps before the signal arrives).

    Raises:
        ValueError: ``steps`` and ``every`` leave no such step.
    """
    if every < 4:
        raise ValueError(f"--every must be at least 4 so a crash can land between checkpoints, "
                         f"got {every}")
    lo, hi = every // 4, every - every // 4
    candidates = [s for s in range(every + 1, steps - every // 4) if lo <= s % every <= hi]
    if not candidates:
        raise ValueError(f"--steps {steps} leaves no room for a crash after the first checkpoint "
                         f"(every {every} steps); use at least {2 * every} steps")
    return random.Random(seed).choice(candidates)


def _worker_env() -> dict[str, str]:
    # the worker must import this very shardsafe, also when it is not installed
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.abspath(shardsafe.__file__)))
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _handle(log: WorkerLog, ev: dict[str, Any]) -> None:
    kind = ev.get("event")
    if kind == "start":
        log.start_step = log.last_step = int(ev["step"])
        log.resumed_from = ev.get("resumed_from")
    elif kind == "step":
        log.last_step = int(ev["step"])
    elif kind == "save":
        log.saves.append(SaveEvent(int(ev["step"]), float(ev["blocked_s"]), int(ev["nbytes"])))
    elif kind == "done":
        log.fingerprint = str(ev["fingerprint"])


def run_worker(name: str, args: list[str], *, timeout_s: float,
               kill_at: int | None = None) -> WorkerLog:
    """Runs one worker, following its events; SIGKILLs it once it reports step ``kill_at``.

    Raises:
        DemoError: The worker failed, timed out, or finished before it could be killed.
    """
    log = WorkerLog(name)
    start = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "shardsafe.demo.worker", *args],
                                stdout=subprocess.PIPE, stderr=err, text=True, env=_worker_env())
        watchdog = threading.Timer(timeout_s, proc.kill)
        watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue  # stray output of a library; events are JSON lines
                _handle(log, ev)
                if kill_at is not None and not log.killed and log.last_step >= kill_at:
                    os.kill(proc.pid, signal.SIGKILL)
                    log.killed = True
            log.returncode = proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log.wall_s = time.perf_counter() - start
        err.seek(0)
        stderr = err.read()
    if log.killed and log.returncode == -signal.SIGKILL:
        return log
    if log.returncode != 0:
        why = "timed out" if time.perf_counter() - start >= timeout_s else \
            f"exited with {log.returncode}"
        raise DemoError(f"{name} training process {why}:\n{stderr[-3000:]}")
    if kill_at is not None:
        raise DemoError(f"the {name} process finished before it could be killed at step {kill_at}")
    return log


def _compare(ref_path: str, res_path: str, ref: WorkerLog, res: WorkerLog) -> list[str]:
    ref_state, res_state = shardsafe.load(ref_path), shardsafe.load(res_path)
    diffs = differences(ref_state, res_state)
    # the fingerprints were taken from the live objects inside the workers: they also
    # check that each saved final state round-trips exactly
    for log, state in ((ref, ref_state), (res, res_state)):
        if fingerprint(state) != log.fingerprint:
            diffs.append(f"<{log.name}>: its checkpoint differs from its live state")
    if not diffs and ref.fingerprint != res.fingerprint:
        diffs.append("<fingerprint>: the final states hash differently")
    return diffs


def _run_in(directory: str, opts: DemoOptions) -> DemoResult:
    crash_at = plan_crash(opts.steps, opts.every, opts.seed)
    ckpts = os.path.join(directory, "checkpoints")
    ref_final = os.path.join(directory, "final-reference")
    res_final = os.path.join(directory, "final-resumed")
    common = ["--steps", str(opts.steps), "--seed", str(opts.seed)]
    reference = run_worker("reference", [*common, "--dir", os.path.join(directory, "reference"),
                                         "--final", ref_final], timeout_s=opts.timeout_s)
    crashed = run_worker("crashed", [*common, "--dir", ckpts, "--every", str(opts.every)],
                         timeout_s=opts.timeout_s, kill_at=crash_at)
    extra = ["--forget-rng"] if opts.corrupt_resume else []
    resumed = run_worker("resumed", [*common, "--dir", ckpts, "--every", str(opts.every),
                                     "--resume", "--final", res_final, *extra],
                         timeout_s=opts.timeout_s)
    if resumed.resumed_from is None:
        raise DemoError("the resumed process found no committed checkpoint")
    diffs = _compare(ref_final, res_final, reference, resumed)
    return DemoResult(opts, TrainConfig(steps=opts.steps, seed=opts.seed), crash_at, reference,
                      crashed, resumed, diffs)


def run_demo(opts: DemoOptions) -> DemoResult:
    """Runs the whole demo.

    Raises:
        DemoError: A training process failed.
        ValueError: ``opts.directory`` exists and is not empty.
    """
    if opts.directory is None:
        directory = tempfile.mkdtemp(prefix="shardsafe-demo-")
        try:
            return _run_in(directory, opts)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    if os.path.exists(opts.directory) and os.listdir(opts.directory):
        raise ValueError(f"--dir {opts.directory!r} is not empty; give a new or empty directory")
    os.makedirs(opts.directory, exist_ok=True)
    return _run_in(opts.directory, opts)
