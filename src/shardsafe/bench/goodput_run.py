"""The supervisor of the goodput benchmark: one training job, its failures, its restarts.

``supervise`` starts trainer processes (``goodput_trainer``), all warm standbys waiting
for ``go`` before the clock starts; it sends ``go`` to the first, follows its progress on
its stdout, and when the job first completes a failure's trigger step it waits the
failure's fraction of a step and injects it: ``kill`` is a real ``SIGKILL`` of the
trainer; ``node`` is a ``SIGKILL`` and the removal of the local directory (the node's
memory is gone; the persistent directory survives). It then sends ``go`` to the next
standby, which restores and goes on, until the job reaches its last step.

Failures are triggered by progress (step and fraction of a step), so every strategy
meets each failure at the same point of the job; ``failure_schedule`` draws them from
a seed. Everything is timed with ``time.monotonic()`` (the trainer reports its steps on
the same clock).
"""

from __future__ import annotations

import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Literal

from ..harness.processes import child_env
from .goodput_trainer import TrainerConfig

FailureKind = Literal["kill", "node"]


@dataclass(frozen=True)
class Failure:
    """One injected failure: after the job first completes ``step``, wait ``frac`` of a
    step time, then ``kind`` (``kill``: SIGKILL; ``node``: SIGKILL and the local directory wiped)."""

    step: int
    frac: float
    kind: FailureKind


def failure_schedule(seed: int, steps: int, count: int, node_losses: int) -> list[Failure]:
    """``count`` failures at seeded random points of a ``steps``-step job, ``node_losses``
    of them node losses; at least 5% of the job apart and never in its first or last 10%."""
    rng = random.Random(seed)
    lo, hi, gap = max(1, steps // 10), steps - max(1, steps // 10), max(1, steps // 20)
    if not 0 <= node_losses <= count:
        raise ValueError(f"{node_losses} node losses among {count} failures")
    if hi - lo < count * gap:
        raise ValueError(f"{count} failures do not fit into {steps} steps")
    while True:
        points = sorted(rng.sample(range(lo, hi), count))
        if all(b - a >= gap for a, b in zip(points, points[1:])):
            break
    kinds = ["node"] * node_losses + ["kill"] * (count - node_losses)
    rng.shuffle(kinds)
    return [Failure(p, round(rng.random(), 3), k) for p, k in zip(points, kinds)]


@dataclass
class Attempt:
    """One trainer process's life: when it got ``go``, what it restored, its steps."""

    go: float
    restored_step: int | None = None
    tier: str | None = None
    restored_at: float | None = None
    steps: list[tuple[int, float, float]] = field(default_factory=list)  # (step, end, blocked)
    killed_at: float | None = None
    failure: Failure | None = None
    exit_code: int | None = None  # the process's return code (-9: SIGKILL)


@dataclass
class JobRun:
    """The record of one job (one strategy) from the first ``go`` to its last step."""

    strategy: str
    start: float
    end: float
    attempts: list[Attempt]


class TrainerProcess:
    """One trainer child process: spawn, wait until ready, ``go``, read its lines, kill."""

    def __init__(self, cfg: TrainerConfig, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shardsafe.bench.goodput_trainer", cfg.to_json()],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, bufsize=1)
        self._buf = ""

    def readline(self, timeout: float) -> str | None:
        """The next line, or None after ``timeout`` seconds; raises if the process ended."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while "\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536).decode()
                if not chunk:
                    raise RuntimeError(f"trainer exited with {self.proc.wait()} unexpectedly")
                self._buf += chunk
        line, _, self._buf = self._buf.partition("\n")
        return line

    def wait_ready(self, timeout: float = 300.0) -> None:
        line = self.readline(timeout)
        if line != "ready":
            raise RuntimeError(f"trainer did not become ready (got {line!r})")

    def go(self) -> float:
        assert self.proc.stdin is not None
        t = time.monotonic()
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return t

    def kill(self) -> float:
        t = time.monotonic()
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return t

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


def _follow(tp: TrainerProcess, att: Attempt, failure: Failure | None, step_s: float,
            timeout: float) -> bool:
    """Reads ``tp``'s progress into ``att`` until the job is done (True) or ``failure``
    has been injected (False)."""
    kill_at: float | None = None
    while True:
        wait = timeout if kill_at is None else max(0.0, kill_at - time.monotonic())
        line = tp.readline(wait)
        if line is None:
            if kill_at is None:
                raise RuntimeError(f"trainer made no progress for {timeout:.0f} s")
            att.killed_at, att.failure = tp.kill(), failure
            att.exit_code = tp.proc.returncode
            return False
        word, *rest = line.split()
        if word == "restored":
            att.restored_step, att.tier, att.restored_at = int(rest[0]), rest[1], float(rest[2])
        elif word == "step":
            step = int(rest[0])
            att.steps.append((step, float(rest[1]), float(rest[2])))
            if failure is not None and kill_at is None and step == failure.step:
                kill_at = time.monotonic() + failure.frac * step_s
        elif word == "done":
            att.exit_code = tp.proc.wait()
            return True


def supervise(cfg: TrainerConfig, failures: list[Failure], *, stall_timeout: float = 120.0) -> JobRun:
    """Runs one job to its last step through ``failures`` (see the module docstring).

    The persistent and local directories of ``cfg`` are emptied first.
    """
    for d in (cfg.intervals.persistent_dir, cfg.intervals.local_dir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    env = child_env(OMP_NUM_THREADS="1")
    pool = [TrainerProcess(cfg, env) for _ in range(len(failures) + 1)]
    try:
        for tp in pool:
            tp.wait_ready()
        pending = sorted(failures, key=lambda f: f.step)
        attempts: list[Attempt] = []
        done_steps = 0
        for tp in pool:
            # a failure is met only when the job first gets past its step
            nxt = next((f for f in pending if f.step > done_steps), None)
            att = Attempt(go=tp.go())
            attempts.append(att)
            finished = _follow(tp, att, nxt, cfg.step_s, stall_timeout)
            done_steps = max([done_steps] + [s for s, _, _ in att.steps])
            if finished:
                return JobRun(cfg.strategy, attempts[0].go, att.steps[-1][1], attempts)
            assert nxt is not None
            pending.remove(nxt)
            if nxt.kind == "node":
                shutil.rmtree(cfg.intervals.local_dir, ignore_errors=True)
                os.makedirs(cfg.intervals.local_dir)
        raise RuntimeError("ran out of standby trainers")  # cannot happen: one per failure
    finally:
        for tp in pool:
            tp.close()
