"""``shardsafe ls DIR``: the checkpoints in a directory with state, size, time and metrics."""

from __future__ import annotations

import argparse
import json
from typing import Any

from . import EXIT_OK
from .._numbers import human_bytes
from ._args import add_command, resolve_step, storage_options
from ._listing import Entry, checkpoints_at, modified
from ._output import local_time, table
from ..engine.commit.diagnose import describe
from ..manager.steps import is_rolled_back
from ..storage import storage_for


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "ls", run, "list checkpoints (steps) in a directory",
                "List the checkpoints under DIR (a manager directory of step_<N> checkpoints or "
                "any directory holding checkpoints) with committed/partial/corrupt/rolled-back "
                "state, size, time and metrics. With incremental saves SIZE counts a step's own "
                "data (+ what it references in earlier steps), and a deleted step whose data "
                "later steps still use is 'referenced'.",
                ("dir", "DIR", "directory or URL (s3://bucket/run)"),
                json_help="print a JSON list instead of a table")


def _metrics_text(metrics: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in sorted(metrics.items()))


def _size_text(own: int | None, referenced: int | None) -> str:
    """``1.0 MiB``, or ``1.0 MiB (+64.0 MiB referenced)`` for an incremental step."""
    text = human_bytes(own)
    return f"{text} (+{human_bytes(referenced)} referenced)" if referenced else text


def _record(e: Entry, mtime: float | None, referenced: set[str]) -> dict[str, Any]:
    # a step moved aside by a manager rollback is intact but no longer listed as a step
    state = "rolled-back" if e.state == "committed" and is_rolled_back(e.name) else e.state
    if state == "partial" and e.name in referenced:
        state = "referenced"  # a deleted step whose data later steps still reference
    return {"name": e.name, "path": e.path, "state": state, "step": e.step, "bytes": e.size,
            "referenced_bytes": e.referenced,
            "time": e.index.created if e.index is not None else mtime, "metrics": e.metrics,
            "error": e.error}


def run(args: argparse.Namespace) -> int:
    args.dir = resolve_step(args.dir, storage_options(args))
    storage, path = storage_for(args.dir, storage_options(args))
    entries = checkpoints_at(storage, path)
    # the time of a committed checkpoint is in its index; others only have file times
    referenced = {f.reference[0] for e in entries if e.index is not None
                  for f in e.index.files if f.reference is not None}
    records = [_record(e, None if e.index is not None else modified(storage, e.path), referenced)
               for e in entries]
    if args.json:
        print(json.dumps(records, indent=2))
        return EXIT_OK
    if not records:
        print(f"no checkpoints: {describe(storage, path, args.dir)}")
        return EXIT_OK
    rows = [["NAME", "STATE", "STEP", "SIZE", "TIME", "METRICS"]]
    for r in records:
        rows.append([r["name"], r["state"], "-" if r["step"] is None else str(r["step"]),
                     _size_text(r["bytes"], r["referenced_bytes"]), local_time(r["time"]),
                     r["error"] or _metrics_text(r["metrics"])])
    for line in table(rows):
        print(line)
    return EXIT_OK
