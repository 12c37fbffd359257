"""``shardsafe gc DIR``: apply retention and remove what unfinished saves left behind.

Retention keeps the ``--max-to-keep`` newest committed checkpoints (by step for a
manager directory of ``step_<N>`` checkpoints, else by creation time), plus every
``--keep-period``-th step, and deletes the others crash-safely (index first). The
decision is the manager's own policy code (``manager.retention``), so ``gc`` and a
``CheckpointManager`` with the same options keep the same steps. Leftovers are partial saves: hidden
``.<name>.shardsafe-tmp-<id>`` directories, object-store prefixes holding data but no
index, and unfinished S3 multipart uploads (a save aborts its own when it fails; one
killed mid-upload cannot, and the upload holds storage invisibly until it is aborted).
Only uploads whose keys are names shardsafe writes, at the depth it writes them
(``engine.commit.names``), are aborted: another tool's upload under the same prefix is
left and reported.
A leftover younger than ``--min-age`` may belong to a save still running, so it is kept;
``--dry-run`` lists what would go, uploads with their id and age.

Deleting is mark and sweep (``engine.commit.sweep``), as in the manager: expired checkpoints
are un-committed (index first), then the files of un-committed directories that no
committed checkpoint names are removed. Data that a kept step of an incremental manager
references stays (its directory is reported as kept) until no committed step uses it.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from . import EXIT_OK
from ._common import Entry, add_command, modified, scan, storage_options
from ..engine.commit import is_temporary, uncommit
from ..engine.commit.names import written_by_shardsafe
from ..engine.commit.sweep import plan_sweep, sweep
from ..manager.retention import (AnyPreservationPolicy, EveryNSteps, LatestN, PreservationPolicy,
                              StepRecord, steps_to_delete)
from ..manager.steps import is_rolled_back, recorded
from ..storage import Storage, storage_for

DEFAULT_MIN_AGE = 3600.0


@dataclass(frozen=True, slots=True)
class Plan:
    """What ``gc`` removes."""

    expired: list[Entry]
    leftovers: list[Entry]
    uploads: list[tuple[str, str, float | None]]
    """Unfinished uploads shardsafe started: ``(key path, upload id, start time)``."""
    foreign: list[str]
    """Key paths of unfinished uploads under the directory that shardsafe did not start (left)."""


def _time(e: Entry) -> float:
    return recorded(e.index).get("time", e.index.created)


def expired(entries: list[Entry], max_to_keep: int | None, keep_period: int | None = None) -> list[Entry]:
    """Committed checkpoints that retention deletes, oldest first (pure).

    In a manager directory the steps are the records; checkpoints there without a step
    are not the manager's and are left alone, and so are steps a rollback moved aside
    (``step_N.rolled-back-<time>``, which the manager never lists or expires either).
    Elsewhere the checkpoints are numbered by creation time, so ``keep_period`` needs
    steps. Two checkpoints of one step (a copy under another name) expire together.
    """
    if max_to_keep is None:
        return []
    committed = [e for e in entries if e.state == "committed" and not is_rolled_back(e.name)]
    by_step: dict[int, list[Entry]] = {}
    for e in committed:
        if e.step is not None:
            by_step.setdefault(e.step, []).append(e)
    policy: PreservationPolicy = LatestN(max_to_keep)
    if by_step:
        if keep_period is not None:
            policy = AnyPreservationPolicy((policy, EveryNSteps(keep_period)))
    else:
        if keep_period is not None:
            raise ValueError("--keep-period needs a directory of step_<N> checkpoints")
        ordered = sorted(committed, key=lambda e: (e.index.created, e.name))
        by_step = {i: [e] for i, e in enumerate(ordered)}
    records = [StepRecord(step, max(_time(e) for e in es), es[0].metrics or None)
               for step, es in by_step.items()]
    return [e for s in steps_to_delete(records, policy) for e in by_step[s]]


def _old(t: float | None, now: float, min_age: float) -> bool:
    if t is None:  # unknown age: only an explicit --min-age 0 removes it
        return min_age <= 0
    return now - t >= min_age


def plan(storage: Storage, path: str, max_to_keep: int | None, min_age: float,
         keep_period: int | None = None) -> Plan:
    """Decides what to remove under ``path`` (reads only)."""
    entries = scan(storage, path)
    now = time.time()
    leftovers = [e for e in entries
                 if e.state == "partial" and _old(modified(storage, e.path), now, min_age)]
    find = getattr(storage, "incomplete_uploads", None)
    found = find(path) if find else []
    own = [u for u in found if written_by_shardsafe(_relative(path, u[0]))]
    foreign = sorted(u[0] for u in found if u not in own)
    uploads = [u for u in own if _old(u[2], now, min_age)]
    return Plan(expired(entries, max_to_keep, keep_period), leftovers, uploads, foreign)


def _relative(directory: str, key_path: str) -> str:
    """``key_path`` relative to ``directory`` (both backend paths, ``bucket/prefix``)."""
    prefix = directory.rstrip("/") + "/"
    return key_path[len(prefix):] if key_path.startswith(prefix) else key_path


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "gc", run, "apply retention and remove leftovers of unfinished saves",
                    "Delete committed checkpoints beyond the --max-to-keep newest and remove "
                    "leftovers of unfinished saves older than --min-age.",
                    ("dir", "DIR", "directory of checkpoints (or URL)"))
    p.add_argument("--max-to-keep", type=int, metavar="N",
                   help="keep the N newest committed checkpoints (default: keep all)")
    p.add_argument("--keep-period", type=int, metavar="P",
                   help="also keep every step divisible by P (as CheckpointManager's keep_period)")
    p.add_argument("--min-age", type=float, default=DEFAULT_MIN_AGE, metavar="SECONDS",
                   help="only remove leftovers at least this old, so running saves are safe "
                        f"(default {DEFAULT_MIN_AGE:.0f})")
    p.add_argument("--dry-run", action="store_true", help="print what would be removed")


def run(args: argparse.Namespace) -> int:
    for name in ("max_to_keep", "keep_period"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    storage, path = storage_for(args.dir, storage_options(args))
    todo = plan(storage, path, args.max_to_keep, args.min_age, args.keep_period)
    verb = "would delete" if args.dry_run else "deleted"
    for e in todo.expired:
        if not args.dry_run:
            uncommit(storage, e.path)
        print(f"{verb} {e.name} (step {e.step})" if e.step is not None else f"{verb} {e.name}")
    for e in todo.leftovers:
        if is_temporary(e.name):  # an unfinished save: nothing can reference it
            if not args.dry_run:
                storage.delete(e.path)
            print(f"{verb} leftover {e.name}")
    _sweep(storage, path, todo, args.dry_run, verb)
    now = time.time()
    for key, upload_id, started in todo.uploads:
        if not args.dry_run:
            storage.abort_upload(key, upload_id)  # type: ignore[attr-defined]
        age = f", started {_age(now - started)} ago" if started is not None else ""
        print(f"{verb} unfinished upload {key} (upload id {upload_id}{age})")
    if not (todo.expired or todo.leftovers or todo.uploads):
        print("nothing to remove")
    if todo.foreign:
        print(f"left {len(todo.foreign)} unfinished upload(s) not written by shardsafe: "
              f"{', '.join(todo.foreign)}")
    return EXIT_OK


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{max(0.0, seconds):.0f} s"


def _sweep(storage: Storage, path: str, todo: Plan, dry_run: bool, verb: str) -> None:
    """Removes the files of expired checkpoints and old partial directories that no
    committed checkpoint references; reports the directories whose files are kept."""
    expired = [e.name for e in todo.expired]
    names = expired + [e.name for e in todo.leftovers if not is_temporary(e.name)]
    planned = plan_sweep(storage, path, names, ignore=expired if dry_run else ())
    if not dry_run:
        sweep(storage, path, names)
    for name, (drop, kept) in planned.items():
        if name not in expired and (drop or not kept):
            print(f"{verb} leftover {name}" if not kept else
                  f"{verb} unreferenced files of leftover {name}")
        if kept:
            print(f"kept {name}: {len(kept)} data file(s) that committed checkpoints reference")
