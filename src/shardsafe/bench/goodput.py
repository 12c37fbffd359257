"""Goodput: how much of the wall time a training job that fails now and then spends training.

``python -m shardsafe.bench.goodput [--quick]`` runs the same job (a small MLP with AdamW
on the CPU, a fixed number of steps, each padded to a fixed step time) once per
checkpoint strategy (``none``, ``torch.save``, ``dcp.async_save``, ``shardsafe``,
``shardsafe+local``; see ``goodput_strategies``), each in real trainer processes under a
supervisor (``goodput_run``) that injects the same seeded failures into every job
(``kill``: SIGKILL of the trainer; ``node``: SIGKILL and the local directory wiped) and
restarts the trainer from a warm standby.

Metrics, per strategy:

- ``ettr`` (effective training time ratio) = useful time / wall time. *Useful time* is
  what the job's steps take uninterrupted and without checkpoints: ``steps`` x the median
  step period (end of one step to the end of the next) of a calibration run of 100
  failure-free steps without checkpoints, run first in the same invocation. *Wall time*
  runs from the first trainer's ``go`` to the end of the job's last step, restarts and
  restores included. 1.0 is a job that neither fails nor checkpoints.
- ``steps_lost``: steps computed more than once (completed steps in all trainer processes
  minus the job's steps), i.e. the work the failures threw away.
- ``recovery_s``: mean over failures of the time from the restart (``go`` to the
  standby trainer) to the end of its first new step: restore plus one step.
- ``blocked_s``: total time the training loop spent inside save calls (completed steps).

Prints a markdown table, writes a PNG of progress (step) over wall time with the failures
marked (``--out``), and prints as its last line one JSON object
``{strategy: {"ettr", "steps_lost", "recovery_s", "blocked_s"}}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .goodput_plot import plot
from .goodput_run import Failure, JobRun, failure_schedule, supervise
from .goodput_strategies import STRATEGIES, Intervals
from .goodput_trainer import TrainerConfig, state_bytes

LOCAL_MISSING = "local tier not built"
BATCH = 8


@dataclass(frozen=True)
class StrategyMetrics:
    """The metrics of one strategy's job (see the module docstring)."""

    strategy: str
    ettr: float
    wall_s: float
    executed_steps: int
    steps_lost: int
    recovery_s: float | None
    blocked_s: float
    restores: list[tuple[int, str]]

    def summary(self) -> dict[str, Any]:
        return {"ettr": round(self.ettr, 4), "steps_lost": self.steps_lost,
                "recovery_s": None if self.recovery_s is None else round(self.recovery_s, 4),
                "blocked_s": round(self.blocked_s, 4)}


def outcome(run: JobRun, steps: int, useful_s: float) -> StrategyMetrics:
    """The metrics of ``run``, a job of ``steps`` steps whose uninterrupted time is ``useful_s``."""
    wall = run.end - run.start
    done = sum(len(a.steps) for a in run.attempts)
    recoveries = [a.steps[0][1] - a.go for a in run.attempts[1:] if a.steps]
    return StrategyMetrics(
        strategy=run.strategy, ettr=useful_s / wall, wall_s=wall, executed_steps=done, steps_lost=done - steps,
        recovery_s=statistics.mean(recoveries) if recoveries else None,
        blocked_s=sum(b for a in run.attempts for _, _, b in a.steps),
        restores=[(a.restored_step or 0, a.tier or "?") for a in run.attempts[1:]])


def step_period(run: JobRun) -> float:
    """The median time from one step's end to the next's in ``run`` (the first step counts
    from ``go``): the pace of an uninterrupted job, robust to a passing spike of load."""
    ends = [run.start] + [end for a in run.attempts for _, end, _ in a.steps]
    return statistics.median(b - a for a, b in zip(ends, ends[1:]))


def local_tier_available() -> bool:
    """Whether this shardsafe's ``CheckpointManager`` has a local tier (``local_directory``)."""
    from ..manager.options import ManagerOptions

    return "local_directory" in {f.name for f in dataclasses.fields(ManagerOptions)}


def table(outcomes: list[StrategyMetrics | str], strategies: Sequence[str]) -> str:
    """The markdown table of the outcomes (a string entry: the strategy is unavailable)."""
    rows = ["| strategy | ETTR | wall (s) | steps lost | mean recovery (s) | blocked by saves (s) "
            "| restored from (step, tier) |",
            "|---|---:|---:|---:|---:|---:|---|"]
    for name, o in zip(strategies, outcomes):
        if isinstance(o, str):
            rows.append(f"| {name} | unavailable: {o} | | | | | |")
            continue
        rec = "–" if o.recovery_s is None else f"{o.recovery_s:.3f}"
        rest = ", ".join(f"{s} {t}" for s, t in o.restores) or "–"
        rows.append(f"| {name} | {o.ettr:.3f} | {o.wall_s:.1f} | {o.steps_lost} | {rec} "
                    f"| {o.blocked_s:.3f} | {rest} |")
    return "\n".join(rows)


def _defaults(args: argparse.Namespace) -> None:
    """Fills the scenario options ``--quick`` (or the full run) decides."""
    quick = dict(steps=300, step_time=0.1, width=512, failures=3, node_losses=1, every=20,
                 local_every=4)
    full = dict(steps=1000, step_time=0.2, width=2048, failures=6, node_losses=2, every=40,
                local_every=8)
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    p.add_argument("--quick", action="store_true",
                   help="the few-minute scenario (300 steps of 0.1 s, a 6 MiB state, 3 failures)")
    p.add_argument("--out", default=os.path.join("docs", "goodput.png"), help="the PNG plot")
    p.add_argument("--seed", type=int, default=0, help="seed of the failure schedule")
    p.add_argument("--strategies", default=",".join(STRATEGIES),
                   help="comma-separated subset of " + ",".join(STRATEGIES))
    p.add_argument("--steps", type=int, help="steps of the job")
    p.add_argument("--step-time", type=float, help="seconds each step is padded to")
    p.add_argument("--width", type=int, help="MLP width (state = 24 * width^2 bytes)")
    p.add_argument("--failures", type=int, help="failures injected")
    p.add_argument("--node-losses", type=int, help="how many of them lose the node")
    p.add_argument("--every", type=int, help="persistent save interval (steps), all strategies")
    p.add_argument("--local-every", type=int, help="local save interval (steps), shardsafe+local")
    p.add_argument("--dir", help="persistent directory parent (default: a temp dir)")


@dataclass
class Report:
    """One benchmark run: the scenario, the calibration, each strategy's job and metrics."""

    description: str
    useful_s: float
    failures: list[Failure]
    runs: list[JobRun]
    outcomes: dict[str, StrategyMetrics | str]  # a string: why the strategy is unavailable

    def summary(self) -> dict[str, Any]:
        """The JSON object of the last line: ``{strategy: {"ettr", "steps_lost", ...}}``."""
        return {s: ({"unavailable": o} if isinstance(o, str) else o.summary())
                for s, o in self.outcomes.items()}


CALIBRATION_STEPS = 100


def run(args: argparse.Namespace) -> Report:
    """Runs the benchmark described by parsed ``args`` (see ``add_arguments``)."""
    _defaults(args)
    try:  # fail before the minutes of training, not after them
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("the plot needs matplotlib: pip install 'shardsafe[bench]'") from None
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = set(strategies) - set(STRATEGIES)
    if unknown:
        raise ValueError(f"unknown strategies {sorted(unknown)}; choose from {', '.join(STRATEGIES)}")
    failures = failure_schedule(args.seed, args.steps, args.failures, args.node_losses)
    base = tempfile.mkdtemp(prefix="shardsafe-goodput-", dir=args.dir)
    local = tempfile.mkdtemp(prefix="shardsafe-goodput-local-",
                             dir="/dev/shm" if os.path.isdir("/dev/shm") else None)

    def config(strategy: str, steps: int) -> TrainerConfig:
        iv = Intervals(os.path.join(base, strategy.replace("+", "_")), os.path.join(local, "tier"),
                       args.every, args.local_every)
        return TrainerConfig(strategy, iv, steps, args.step_time, args.width, BATCH)

    outcomes: dict[str, StrategyMetrics | str] = {}
    runs: list[JobRun] = []
    try:
        # useful time: the job's steps at the pace of an uninterrupted run without checkpoints
        calib = supervise(config("none", min(args.steps, CALIBRATION_STEPS)), [])
        useful = step_period(calib) * args.steps
        for s in strategies:
            if s == "shardsafe+local" and not local_tier_available():
                outcomes[s] = LOCAL_MISSING
                continue
            print(f"goodput: running {s} ...", file=sys.stderr, flush=True)
            runs.append(supervise(config(s, args.steps), failures))
            outcomes[s] = outcome(runs[-1], args.steps, useful)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(local, ignore_errors=True)
    desc = (f"{args.steps} steps of {args.step_time} s, "
            f"{state_bytes(args.width) / (1 << 20):.0f} MiB state; failures "
            + ", ".join(f"{f.kind}@{f.step}+{f.frac:.2f}" for f in failures)
            + f"; persistent every {args.every}, local every {args.local_every} steps")
    plot(runs, args.out, desc, useful / args.steps)
    return Report(desc, useful, failures, runs, outcomes)


def render(rep: Report, out: str, seconds: float) -> str:
    """What the command prints: a header line, the table, and last the JSON line."""
    return (f"Goodput: {rep.description}. Useful time (uninterrupted, no checkpoints): "
            f"{rep.useful_s:.2f} s. Took {seconds:.0f} s; plot: {out}\n\n"
            + table(list(rep.outcomes.values()), list(rep.outcomes)) + "\n"
            + json.dumps(rep.summary()))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line of ``python -m shardsafe.bench.goodput``."""
    p = argparse.ArgumentParser(prog="python -m shardsafe.bench.goodput",
                                description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shardsafe.bench.goodput``: runs, prints the table, then the JSON line."""
    args = parse_args(argv)
    started = time.time()
    try:
        rep = run(args)
    except ValueError as e:  # a scenario that cannot be built (e.g. failures that do not fit)
        print(f"goodput: {e}", file=sys.stderr)
        return 2
    print(render(rep, args.out, time.time() - started))
    return 0

if __name__ == "__main__":
    sys.exit(main())
