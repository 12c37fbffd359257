"""The text report of ``shardsafe demo`` (the CLI prints it)."""

from __future__ import annotations

from functools import partial

from .._numbers import human_bytes as _human_bytes
from ..harness.compare import summarize
from .events import SaveEvent
from .run import DemoResult

_WIDTH = 13  # label column
human_bytes = partial(_human_bytes, largest="GiB")  # the demo's sizes stay in GiB at most


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def labelled(label: str, text: str) -> str:
    """A report line: ``label`` in the label column, then ``text``."""
    return f"  {label:<{_WIDTH}}{text}"


def continued(text: str) -> str:
    """A report line that continues the one above (``text`` under the text column)."""
    return " " * (_WIDTH + 2) + text


def _spread(values: list[float]) -> str:
    return (f"{_ms(sum(values) / len(values))} mean, {_ms(min(values))} min, "
            f"{_ms(max(values))} max")


def _crash(r: DemoResult) -> list[str]:
    crash, pre = r.crashed, r.preempted
    lines = [
        labelled("crash", f"SIGKILL once step {crash.signal_sent_at} was reported (planned "
                       f"{r.plan.crash_at}); the process had trained {crash.last_step} steps"),
        continued(f"a new process resumed from step {pre.resumed_from}, the newest committed step"
              if pre.resumed_from is not None else
              "a new process found no committed step and started from step 0"),
    ]
    lost = [s.step for s in crash.saves if pre.resumed_from is None or s.step > pre.resumed_from]
    if lost:  # an async save still being written when the process died never commits
        lines.append(continued(f"(the save of step {lost[-1]} was still being written when the "
                           f"process died, so it never counted)"))
    return lines


def _interruptions(r: DemoResult) -> list[str]:
    crash, pre, res = r.crashed, r.preempted, r.resumed
    return [
        *_crash(r),
        labelled("preemption", f"SIGTERM once step {pre.signal_sent_at} was reported (planned "
                            f"{r.plan.preempt_at}); the process saved step {pre.preempted_step}, "
                            f"waited {_ms(pre.preempt_wait_s or 0.0)} for the write and exited "
                            f"with status {pre.returncode}"),
        continued(f"a new process resumed from step {res.resumed_from}"),
        labelled("steps lost", f"{r.steps_lost_to_crash} to the crash (trained again after "
                            f"resuming), {r.steps_lost_to_preemption} to the preemption"),
        labelled("steps run", f"{r.reference.steps} reference + {crash.steps_run} crashed + "
                           f"{pre.steps_run} preempted + {res.steps_run} resumed = "
                           f"{r.reference.steps + sum(w.steps_run for w in r.workers)}"),
    ]


def _checkpoints(r: DemoResult, saves: list[SaveEvent]) -> list[str]:
    o = r.options
    per_worker = " + ".join(str(len(w.saves)) for w in r.workers)
    stalls = [s.stall_s for s in saves]
    durable = [s.durable_s for s in saves if s.durable_s is not None]
    mode = "synchronous save" if o.sync else "async save: until the state was copied"
    lines = [
        labelled("checkpoints", f"{len(saves)} saved ({per_worker} by the three processes), "
                             f"{len(r.kept)} kept (max_to_keep {o.keep}): steps "
                             f"{', '.join(map(str, r.kept))}; {human_bytes(r.checkpoint_bytes)} "
                             f"each"),
        labelled("blocked", f"{_ms(sum(stalls))} in all: training waited in save() ({mode})"),
        continued(f"per save {_spread(stalls)}"),
    ]
    if durable:
        how = "within save()" if o.sync else "written in the background"
        lines.append(labelled("durable", f"per save {_spread(durable)} from save() to committed "
                                      f"on disk ({how})"))
    return lines


def _result(r: DemoResult) -> list[str]:
    if r.identical:
        fp = r.resumed.fingerprint
        lines = [
            labelled("result", "IDENTICAL: parameters, optimizer, LR schedule, data loader and RNG "
                            "states of the resumed run"),
            continued(f"match the uninterrupted run bit for bit (sha256 {fp[:16]}...)"
                  if fp else "match the uninterrupted run bit for bit"),
        ]
    else:
        lines = [labelled("result", f"DIFFERENT: {len(r.differences)} key path(s) differ from the "
                                 f"uninterrupted run:")]
        lines += [continued(d) for d in summarize(r.differences)]
    lines += [labelled("PROBLEM", p) for p in r.problems]
    return lines


def report(r: DemoResult) -> str:
    """A short readable report of a demo run."""
    o, saves = r.options, r.saves
    lines = [
        "shardsafe demo: crash and preempt a training run, resume it, compare with an "
        "uninterrupted run",
        "",
        labelled("job", r.config.describe()),
        labelled("steps", f"{o.steps}; CheckpointManager(save_interval_steps={o.every}, "
                       f"max_to_keep={o.keep}, async_save={not o.sync}, "
                       f"preemption_signals=(SIGTERM,)), seed {o.seed}"),
        *_interruptions(r),
    ]
    if saves:
        lines += _checkpoints(r, saves)
    walls = ", ".join(f"{w.name} {w.wall_s:.1f} s" for w in r.workers)
    lines += [labelled("wall time", f"{r.wall_s:.1f} s in all; training: reference "
                                 f"{r.reference.wall_s:.1f} s (in this process), {walls}"),
              continued("(the next process starts up while the current one trains)")]
    lines += _result(r)
    if o.directory is not None:
        lines += ["", f"The checkpoints are kept in {o.directory}. Look at them with:",
                  f"  shardsafe ls {o.directory}", f"  shardsafe verify {o.directory}"]
    else:
        lines += ["", "Run with --dir DIR to keep the checkpoints, then look at them with "
                      "`shardsafe ls DIR` and `shardsafe verify DIR`."]
    return "\n".join(lines)
