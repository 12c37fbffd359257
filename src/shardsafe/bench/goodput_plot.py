"""The goodput benchmark's figure: progress over wall time per strategy, failures marked."""

from __future__ import annotations

import os
import textwrap

from .goodput_run import JobRun

MARKS = {"kill": ("x", "process killed"), "node": ("v", "node lost")}


def _progress(run: JobRun) -> tuple[list[float], list[int]]:
    """(seconds since the start, completed step) along the job, restores drawn as drops."""
    xs: list[float] = []
    ys: list[int] = []
    for a in run.attempts:
        if not xs:
            xs, ys = [0.0], [a.restored_step or 0]
        elif a.restored_at is not None:  # the restart: back to the restored step
            xs += [a.go - run.start, a.restored_at - run.start]
            ys += [ys[-1], a.restored_step or 0]
        xs += [end - run.start for _, end, _ in a.steps]
        ys += [s for s, _, _ in a.steps]
    return xs, ys


def plot(runs: list[JobRun], path: str, title: str, step_s: float) -> None:
    """Writes a PNG with two panels: completed step over wall time (every strategy), and
    the lag behind an uninterrupted run (wall time minus ``step_s`` per completed step) of
    the strategies that checkpoint. Failures are marked where they hit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, lag) = plt.subplots(2, 1, figsize=(9, 8), dpi=110)
    for i, run in enumerate(runs):
        color = f"C{i}"
        xs, ys = _progress(run)
        top.plot(xs, ys, label=run.strategy, linewidth=1.4, color=color)
        if run.strategy != "none":
            lag.plot(xs, [x - y * step_s for x, y in zip(xs, ys)], linewidth=1.4, color=color,
                     label=run.strategy)
        for a in run.attempts:
            if a.killed_at is None or a.failure is None:
                continue
            x = a.killed_at - run.start
            y = a.steps[-1][0] if a.steps else (a.restored_step or 0)
            style = dict(marker=MARKS[a.failure.kind][0], color=color, markersize=9,
                         linestyle="none", markeredgecolor="black")
            top.plot([x], [y], **style)
            if run.strategy != "none":
                lag.plot([x], [x - y * step_s], **style)
    for marker, text in MARKS.values():
        top.plot([], [], marker=marker, color="white", markeredgecolor="black",
                 linestyle="none", markersize=9, label=text)
    top.set_ylabel("completed step")
    top.set_title("\n".join(textwrap.wrap(title, 100)), fontsize=9)
    lag.set_ylabel("behind an uninterrupted run (s)")
    lag.set_title("lag: wall time minus the uninterrupted time of the completed steps "
                  "(checkpointing strategies)", fontsize=9)
    for ax in (top, lag):
        ax.set_xlabel("wall time (s)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
