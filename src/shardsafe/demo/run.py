"""Orchestration of ``shardsafe demo``: reference, crash, preemption, resume, comparison.

1. *reference*: this process trains all steps without interruption and keeps a frozen
   copy of the final state (no checkpoints).
2. *crashed*: a training process (``python -m shardsafe.demo.worker``) checkpoints
   through a ``CheckpointManager``; it gets SIGKILL at a seeded step between checkpoints.
3. *preempted*: a new process restores the newest committed step and trains on; it
   gets SIGTERM between checkpoints, saves the step it is at, waits for the write and
   exits 0.
4. *resumed*: a new process restores exactly that step, trains to the end and saves
   the final step.

The final checkpoint must be bit-identical to the reference. Library code does not
print: ``report.report`` returns the text and the CLI prints it.

Starting a training process costs seconds of torch start-up on a small machine, so the
demo starts only three, each one while the previous phase trains (``TrainingProcess``),
and trains the reference in this process.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, TypeVar

import shardsafe

from ..harness.compare import differences, fingerprint, snapshot
from .events import SaveEvent, WorkerLog
from .plan import Interruptions, plan_interruptions
from .process import DemoError, TrainingProcess
from .train import DemoTrainer, TrainConfig, deterministic_process

__all__ = ["DemoError", "DemoOptions", "DemoResult", "ReferenceRun", "Verdict", "in_demo_directory",
           "run_demo", "run_reference"]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What ``shardsafe demo`` does.

    Attributes:
        steps: Training steps of the whole run.
        every: Checkpoint interval in steps (``save_interval_steps``).
        keep: Checkpoints to keep (``max_to_keep``).
        seed: Seeds the job and the interruption points.
        directory: The manager directory (new or empty); None uses a temporary directory
            removed at the end.
        sync: Save synchronously (``async_save=False``), to compare the stall.
        nproc: Training processes per run; above 1 the distributed demo
            (``shardsafe.demo.distributed``) runs instead.
        corrupt_resume: Resume deliberately wrong (forget the RNG state), to show that the
            comparison catches it. For tests.
        timeout_s: Upper bound for each training process.
    """

    steps: int = 300
    every: int = 25
    keep: int = 3
    seed: int = 0
    directory: str | None = None
    sync: bool = False
    nproc: int = 1
    corrupt_resume: bool = False
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.keep < 1:
            raise ValueError(f"--keep must be at least 1, got {self.keep}")
        if self.nproc < 1:
            raise ValueError(f"--nproc must be at least 1, got {self.nproc}")
        plan_interruptions(self.steps, self.every, self.seed)  # ValueError when they do not fit


@dataclass(slots=True)
class ReferenceRun:
    """The uninterrupted run (trained in this process)."""

    state: Any
    fingerprint: str
    steps: int
    wall_s: float


class Verdict:
    """The verdict of a demo run, from its ``differences`` and its ``problems``."""

    __slots__ = ()
    differences: list[str]  # key paths whose final values differ from the reference

    @property
    def problems(self) -> list[str]:
        """Ways the preemption failed its promise (resume from exactly the saved step)."""
        return []

    @property
    def identical(self) -> bool:
        """The resumed run's final state equals the reference bit for bit."""
        return not self.differences

    @property
    def ok(self) -> bool:
        """Identical, and the preemption lost nothing."""
        return self.identical and not self.problems


@dataclass(slots=True)
class DemoResult(Verdict):
    """Everything the report shows."""

    options: DemoOptions
    config: TrainConfig
    plan: Interruptions
    reference: ReferenceRun
    crashed: WorkerLog
    preempted: WorkerLog
    resumed: WorkerLog
    kept: list[int]
    checkpoint_bytes: int
    differences: list[str]
    wall_s: float = 0.0

    @property
    def problems(self) -> list[str]:
        """Ways the preemption failed its promise (resume from exactly the saved step)."""
        pre, res = self.preempted, self.resumed
        out = []
        if res.resumed_from != pre.preempted_step:
            out.append(f"the preempted process saved step {pre.preempted_step}, but the next "
                       f"process resumed from step {res.resumed_from}")
        if pre.last_step != pre.preempted_step:
            out.append(f"the preempted process trained to step {pre.last_step} but saved "
                       f"step {pre.preempted_step}")
        return out

    @property
    def workers(self) -> tuple[WorkerLog, WorkerLog, WorkerLog]:
        return self.crashed, self.preempted, self.resumed

    @property
    def saves(self) -> list[SaveEvent]:
        return [s for w in self.workers for s in w.saves]

    @property
    def steps_lost_to_crash(self) -> int:
        """Steps the crashed process completed after its newest committed checkpoint."""
        return self.crashed.last_step - (self.preempted.resumed_from or 0)

    @property
    def steps_lost_to_preemption(self) -> int:
        """Steps the preempted process completed that the resumed process trains again."""
        return self.preempted.last_step - (self.resumed.resumed_from or 0)


def run_reference(cfg: TrainConfig) -> ReferenceRun:
    """Trains ``cfg`` without interruption in this process; keeps a copy of the final state."""
    deterministic_process()
    start = time.perf_counter()
    trainer = DemoTrainer(cfg)
    trainer.run(cfg.steps)
    return ReferenceRun(snapshot(trainer.state), fingerprint(trainer.state), trainer.step,
                        time.perf_counter() - start)


def step_path(directory: str, step: int) -> str:
    """Where a manager keeps ``step`` (the layout of docs/guides/training-loop.md)."""
    return os.path.join(directory, f"step_{step:08d}")


def directory_size(path: str) -> int:
    """Total size in bytes of the files under ``path``."""
    total = 0
    for root, _dirs, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def _compare(directory: str, ref: ReferenceRun, res: WorkerLog) -> list[str]:
    final = shardsafe.load(step_path(directory, ref.steps))
    diffs = differences(ref.state, final)
    # the resumed worker fingerprinted its live final state: this also checks that the
    # final checkpoint round-trips exactly
    if fingerprint(final) != res.fingerprint:
        diffs.append("<resumed>: its final checkpoint differs from its live state")
    if not diffs and ref.fingerprint != res.fingerprint:
        diffs.append("<fingerprint>: the final states hash differently")
    return diffs


def _phases(directory: str, opts: DemoOptions, plan: Interruptions, cfg: TrainConfig,
            started: list[TrainingProcess]) -> tuple[ReferenceRun, WorkerLog, WorkerLog, WorkerLog]:
    args = ["--dir", directory, "--steps", str(opts.steps), "--every", str(opts.every),
            "--keep", str(opts.keep), "--seed", str(opts.seed), *(["--sync"] if opts.sync else [])]

    def start(name: str, extra: tuple[str, ...] = ()) -> TrainingProcess:
        started.append(TrainingProcess(name, [*args, *extra], opts.timeout_s))
        return started[-1]

    crashed = start("crashed")
    reference = run_reference(cfg)  # while the first process starts up
    crashed.go()
    preempted = start("preempted")  # starts up while the first one trains
    crashed_log = crashed.follow((plan.crash_at, signal.SIGKILL))
    preempted.go()
    resumed = start("resumed", ("--forget-rng",) if opts.corrupt_resume else ())
    # (if the crash came before any save had committed, that process started from step 0)
    preempted_log = preempted.follow((plan.preempt_at, signal.SIGTERM))
    resumed.go()
    return reference, crashed_log, preempted_log, resumed.follow()


def _run_in(directory: str, opts: DemoOptions) -> DemoResult:
    t0 = time.perf_counter()
    plan = plan_interruptions(opts.steps, opts.every, opts.seed)
    cfg = TrainConfig(steps=opts.steps, seed=opts.seed)
    started: list[TrainingProcess] = []
    try:
        reference, crashed, preempted, resumed = _phases(directory, opts, plan, cfg, started)
    finally:
        for p in started:  # after a failure, no process may outlive the demo
            p.stop()
    with shardsafe.CheckpointManager(directory, read_only=True) as listing:
        kept = listing.all_steps()
    diffs = _compare(directory, reference, resumed)
    return DemoResult(opts, cfg, plan, reference, crashed, preempted, resumed, kept,
                      directory_size(step_path(directory, opts.steps)), diffs,
                      time.perf_counter() - t0)


def in_demo_directory(opts: DemoOptions, run: Callable[[str, DemoOptions], R]) -> R:
    """Calls ``run(directory, opts)`` in ``--dir`` (new or empty) or in a temporary
    directory that is removed afterwards.

    Raises:
        ValueError: ``opts.directory`` exists and is not empty.
    """
    if opts.directory is None:
        directory = tempfile.mkdtemp(prefix="shardsafe-demo-")
        try:
            return run(directory, opts)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    if os.path.exists(opts.directory) and os.listdir(opts.directory):
        raise ValueError(f"--dir {opts.directory!r} is not empty; give a new or empty directory")
    os.makedirs(opts.directory, exist_ok=True)
    return run(opts.directory, opts)


def run_demo(opts: DemoOptions) -> DemoResult:
    """Runs the whole single-process demo.

    Raises:
        DemoError: A training process failed.
        ValueError: ``opts.directory`` exists and is not empty.
    """
    return in_demo_directory(opts, _run_in)
