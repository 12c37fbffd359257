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
``--dry-run`` lists what would go, uploads with their id and age, and what stays and why;
``--json`` prints the same report as one object.

Deleting is mark and sweep (``engine.commit.sweep``), as in the manager: expired checkpoints
are un-committed (index first), then the files of un-committed directories that no
committed checkpoint names are removed. Data that a kept step of an incremental manager
references stays (its directory is reported as kept) until no committed step uses it.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from . import EXIT_OK
from ._args import add_command, storage_options
from ._listing import Entry, modified, scan
from ..engine.commit import is_temporary, uncommit
from ..engine.commit.names import written_by_shardsafe
from ..engine.commit.sweep import plan_sweep, sweep
from ..manager.retention import (AnyPreservationPolicy, EveryNSteps, LatestN, PreservationPolicy,
                              StepRecord, steps_to_delete)
from ..manager.steps import is_rolled_back, recorded
from ..storage import Storage, storage_for

DEFAULT_MIN_AGE = 3600.0

Upload = tuple[str, str, float | None]  # (key path, upload id, start time)


@dataclass(frozen=True, slots=True)
class Kept:
    """Something ``gc`` leaves, and why."""

    name: str
    step: int | None
    reason: str
    files: int | None = None
    """Data files kept in a directory otherwise removed (committed checkpoints use them)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What ``gc`` removes, and what it keeps."""

    expired: list[Entry]
    leftovers: list[Entry]
    uploads: list[Upload]
    """Unfinished uploads shardsafe started, old enough to abort."""
    foreign: list[Upload]
    """Unfinished uploads under the directory that shardsafe did not start (left)."""
    kept: list[Kept] = field(default_factory=list)
    """Checkpoints and leftovers kept, with the reason."""
    young: list[Upload] = field(default_factory=list)
    """Unfinished uploads of shardsafe's younger than ``--min-age`` (kept)."""


def _time(e: Entry) -> float:
    return recorded(e.index).get("time", e.index.created)


def _by_step(entries: list[Entry], keep_period: int | None) -> tuple[dict[int, list[Entry]], bool]:
    """The committed checkpoints retention numbers, by step (by creation time where none
    has a step), and whether they are numbered by step."""
    committed = [e for e in entries if e.state == "committed" and not is_rolled_back(e.name)]
    by_step: dict[int, list[Entry]] = {}
    for e in committed:
        if e.step is not None:
            by_step.setdefault(e.step, []).append(e)
    if by_step:
        return by_step, True
    if keep_period is not None:
        raise ValueError("--keep-period needs a directory of step_<N> checkpoints")
    ordered = sorted(committed, key=lambda e: (e.index.created, e.name))
    return {i: [e] for i, e in enumerate(ordered)}, False


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
    by_step, _ = _by_step(entries, keep_period)
    policy: PreservationPolicy = LatestN(max_to_keep)
    if keep_period is not None:
        policy = AnyPreservationPolicy((policy, EveryNSteps(keep_period)))
    records = [StepRecord(step, max(_time(e) for e in es), es[0].metrics or None)
               for step, es in by_step.items()]
    return [e for s in steps_to_delete(records, policy) for e in by_step[s]]


def kept_checkpoints(entries: list[Entry], gone: list[Entry], max_to_keep: int | None,
                     keep_period: int | None = None) -> list[Kept]:
    """Why each committed or damaged checkpoint that ``expired`` did not choose stays (pure)."""
    by_step, stepped = _by_step(entries, keep_period if max_to_keep is not None else None)
    newest = set(sorted(by_step)[-max_to_keep:]) if max_to_keep is not None else set()
    numbered = {e.name: n for n, es in by_step.items() for e in es}
    names = {e.name for e in gone}
    out = []
    for e in entries:
        if e.name in names or e.state == "partial":
            continue
        if e.state == "corrupt":
            why = f"damaged ({e.error}); gc deletes only checkpoints it can read (see shardsafe verify)"
        elif is_rolled_back(e.name):
            why = "moved aside by a rollback; retention never expires it"
        elif e.name not in numbered:
            why = "not a step_<N> checkpoint of this manager directory"
        elif max_to_keep is None:
            why = "no --max-to-keep: every committed checkpoint is kept"
        elif numbered[e.name] in newest:
            why = f"one of the {max_to_keep} newest" + ("" if stepped else " (by creation time)")
        else:
            why = f"its step is divisible by --keep-period {keep_period}"
        out.append(Kept(e.name, e.step, why))
    return out


def _old(t: float | None, now: float, min_age: float) -> bool:
    if t is None:  # unknown age: only an explicit --min-age 0 removes it
        return min_age <= 0
    return now - t >= min_age


def _young(what: str, t: float | None, now: float, min_age: float) -> str:
    """Why a leftover or an upload younger than ``--min-age`` is kept."""
    if t is None:
        return f"{what} of unknown age: only --min-age 0 removes it"
    return (f"{what} {_age(now - t)} ago, younger than --min-age ({min_age:g} s): "
            f"a save may still be writing it")


def plan(storage: Storage, path: str, max_to_keep: int | None, min_age: float,
         keep_period: int | None = None) -> Plan:
    """Decides what to remove under ``path``, and what to keep (reads only)."""
    entries = scan(storage, path)
    now = time.time()
    leftovers, kept = [], []
    for e in entries:
        if e.state == "partial":
            t = modified(storage, e.path)
            if _old(t, now, min_age):
                leftovers.append(e)
            else:
                kept.append(Kept(e.name, e.step, _young("unfinished save, last written", t, now, min_age)))
    find = getattr(storage, "incomplete_uploads", None)
    found = find(path) if find else []
    own = [u for u in found if written_by_shardsafe(_relative(path, u[0]))]
    gone = expired(entries, max_to_keep, keep_period)
    return Plan(gone, leftovers, [u for u in own if _old(u[2], now, min_age)],
                sorted(u for u in found if u not in own),
                kept_checkpoints(entries, gone, max_to_keep, keep_period) + kept,
                [u for u in own if not _old(u[2], now, min_age)])


def _relative(directory: str, key_path: str) -> str:
    """``key_path`` relative to ``directory`` (both backend paths, ``bucket/prefix``)."""
    prefix = directory.rstrip("/") + "/"
    return key_path[len(prefix):] if key_path.startswith(prefix) else key_path


def _at_least(low: float, kind: Callable[[str], float]) -> Callable[[str], float]:
    """An argparse ``type``: a number of ``kind`` not below ``low``; anything else is a
    usage error (argparse prints it with the usage line and exits 2)."""
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value >= low:  # NaN too
            raise argparse.ArgumentTypeError(f"must be at least {low:g}, got {text}")
        return value
    return parse


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "gc", run, "apply retention and remove leftovers of unfinished saves",
                    "Delete committed checkpoints beyond the --max-to-keep newest and remove "
                    "leftovers of unfinished saves older than --min-age.",
                    ("dir", "DIR", "directory of checkpoints (or URL)"),
                    json_help="print one JSON object: what was (or would be) deleted, what was "
                              "kept and why, the uploads aborted and left")
    p.add_argument("--max-to-keep", type=_at_least(1, int), metavar="N",
                   help="keep the N newest committed checkpoints (default: keep all)")
    p.add_argument("--keep-period", type=_at_least(1, int), metavar="P",
                   help="also keep every step divisible by P (as CheckpointManager's keep_period)")
    p.add_argument("--min-age", type=_at_least(0, float), default=DEFAULT_MIN_AGE, metavar="SECONDS",
                   help="only remove leftovers at least this old, so running saves are safe "
                        f"(default {DEFAULT_MIN_AGE:.0f})")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be removed, and what is kept and why")


@dataclass(slots=True)
class GcReport:
    """What ``gc`` did (or, with ``--dry-run``, would do); ``--json`` prints it as is."""

    dry_run: bool
    deleted: list[dict] = field(default_factory=list)
    """``{"name", "step", "what"}``: ``checkpoint`` (expired), ``leftover`` (an unfinished
    save, removed) or ``unreferenced files`` (of a leftover whose other files are kept)."""
    kept: list[dict] = field(default_factory=list)
    """``{"name", "step", "reason", "files"}`` (``files``: the data files kept in a directory
    otherwise removed, else None)."""
    uploads_aborted: list[dict] = field(default_factory=list)
    """``{"key", "upload_id", "started"}`` (start as POSIX time, or None)."""
    uploads_kept: list[dict] = field(default_factory=list)
    """Uploads of shardsafe's younger than ``--min-age``: ``{"key", "upload_id", "started", "reason"}``."""
    uploads_left: list[dict] = field(default_factory=list)
    """Uploads shardsafe did not start: ``{"key", "upload_id", "started"}``."""


def run(args: argparse.Namespace) -> int:
    storage, path = storage_for(args.dir, storage_options(args))
    todo = plan(storage, path, args.max_to_keep, args.min_age, args.keep_period)
    report = GcReport(args.dry_run)
    for e in todo.expired:
        if not args.dry_run:
            uncommit(storage, e.path)
        report.deleted.append({"name": e.name, "step": e.step, "what": "checkpoint"})
    for e in todo.leftovers:
        if is_temporary(e.name):  # an unfinished save: nothing can reference it
            if not args.dry_run:
                storage.delete(e.path)
            report.deleted.append({"name": e.name, "step": e.step, "what": "leftover"})
    _sweep(storage, path, todo, report)
    report.kept += [asdict(k) for k in todo.kept]
    now = time.time()
    for key, upload_id, started in todo.uploads:
        if not args.dry_run:
            storage.abort_upload(key, upload_id)  # type: ignore[attr-defined]
        report.uploads_aborted.append({"key": key, "upload_id": upload_id, "started": started})
    report.uploads_kept = [{"key": k, "upload_id": u, "started": t,
                            "reason": _young("started", t, now, args.min_age)} for k, u, t in todo.young]
    report.uploads_left = [{"key": k, "upload_id": u, "started": t} for k, u, t in todo.foreign]
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        for line in _lines(report, now):
            print(line)
    return EXIT_OK


def _lines(report: GcReport, now: float) -> list[str]:
    """The text report (kept checkpoints and young uploads only with ``--dry-run``)."""
    verb = "would delete" if report.dry_run else "deleted"
    what = {"leftover": "leftover ", "unreferenced files": "unreferenced files of leftover ", "checkpoint": ""}
    out = []
    for d in report.deleted:
        step = f" (step {d['step']})" if d["what"] == "checkpoint" and d["step"] is not None else ""
        out.append(f"{verb} {what[d['what']]}{d['name']}{step}")
    out += [f"kept {k['name']}: {k['reason']}" for k in report.kept if k["files"] is not None]
    for u in report.uploads_aborted:
        age = f", started {_age(now - u['started'])} ago" if u["started"] is not None else ""
        out.append(f"{verb} unfinished upload {u['key']} (upload id {u['upload_id']}{age})")
    if not (report.deleted or report.uploads_aborted):
        out.append("nothing to remove")
    if report.dry_run:
        out += [f"would keep {k['name']}: {k['reason']}" for k in report.kept if k["files"] is None]
        out += [f"would keep unfinished upload {u['key']} (upload id {u['upload_id']}): {u['reason']}"
                for u in report.uploads_kept]
    if report.uploads_left:
        out.append(f"left {len(report.uploads_left)} unfinished upload(s) not written by shardsafe: "
                   f"{', '.join(u['key'] for u in report.uploads_left)}")
    return out


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{max(0.0, seconds):.0f} s"


def _sweep(storage: Storage, path: str, todo: Plan, report: GcReport) -> None:
    """Removes the files of expired checkpoints and old partial directories that no
    committed checkpoint references; reports the directories whose files are kept."""
    expired = [e.name for e in todo.expired]
    names = expired + [e.name for e in todo.leftovers if not is_temporary(e.name)]
    planned = plan_sweep(storage, path, names, ignore=expired if report.dry_run else ())
    if not report.dry_run:
        sweep(storage, path, names)
    steps = {e.name: e.step for e in todo.expired + todo.leftovers}
    for name, (drop, kept) in planned.items():
        if name not in expired and (drop or not kept):
            report.deleted.append({"name": name, "step": steps.get(name),
                                   "what": "unreferenced files" if kept else "leftover"})
        if kept:
            report.kept.append(asdict(Kept(name, steps.get(name), f"{len(kept)} data file(s) that committed "
                                           f"checkpoints reference", len(kept))))
    for name in names[len(expired):]:
        if name not in planned:
            report.kept.append(asdict(Kept(name, steps.get(name), "a symbolic link or not a directory: "
                                                                  "gc never removes it")))
