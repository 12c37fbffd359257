"""The text report of ``shardsafe demo`` (the CLI prints it)."""

from __future__ import annotations

from .compare import summarize
from .run import DemoResult

_WIDTH = 13  # label column


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _line(label: str, text: str) -> str:
    return f"  {label:<{_WIDTH}}{text}"


def _cont(text: str) -> str:
    return " " * (_WIDTH + 2) + text


def report(r: DemoResult) -> str:
    """A short readable report of a demo run."""
    o, ref, crash, res = r.options, r.reference, r.crashed, r.resumed
    saves = r.saves
    blocked = [s.blocked_s for s in saves]
    lines = [
        "shardsafe demo: SIGKILL a training run, resume it, compare with an uninterrupted run",
        "",
        _line("job", r.config.describe()),
        _line("steps", f"{o.steps}, a checkpoint every {o.every} steps (shardsafe.save, "
                       f"seed {o.seed})"),
        _line("crash", f"SIGKILL after step {crash.last_step} (planned: {r.crash_planned}); "
                       f"newest committed checkpoint: step {res.resumed_from}"),
        _line("steps lost", f"{r.steps_lost} (done after the last checkpoint, trained again "
                            f"after resuming)"),
        _line("steps run", f"{ref.last_step} reference + {crash.last_step} crashed + "
                           f"{res.last_step - res.start_step} resumed = "
                           f"{ref.last_step + crash.last_step + res.last_step - res.start_step}"),
    ]
    if saves:
        lines += [
            _line("checkpoints", f"{len(saves)} written ({len(crash.saves)} before the crash, "
                                 f"{len(res.saves)} after resuming), "
                                 f"{human_bytes(saves[-1].nbytes)} each"),
            _line("blocked", f"{_ms(sum(blocked))} in all by checkpointing; per save "
                             f"{_ms(sum(blocked) / len(blocked))} mean, {_ms(min(blocked))} min, "
                             f"{_ms(max(blocked))} max"),
        ]
    lines.append(_line("wall time", f"reference {ref.wall_s:.1f} s, crashed {crash.wall_s:.1f} s, "
                                    f"resumed {res.wall_s:.1f} s"))
    if r.identical:
        lines += [
            _line("result", "IDENTICAL: parameters, optimizer, LR schedule, data loader and RNG "
                            "states of the resumed run"),
            _cont(f"match the uninterrupted run bit for bit (sha256 {res.fingerprint[:16]}...)"
                  if res.fingerprint else "match the uninterrupted run bit for bit"),
        ]
    else:
        lines.append(_line("result", f"DIFFERENT: {len(r.differences)} key path(s) differ from "
                                     f"the uninterrupted run:"))
        lines += [_cont(d) for d in summarize(r.differences)]
    return "\n".join(lines)
