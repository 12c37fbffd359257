"""``shardsafe gc DIR``: apply retention and remove what unfinished saves left behind.

Retention keeps the ``--max-to-keep`` newest committed checkpoints (by step for a
manager directory of ``step_<N>`` checkpoints, else by creation time) and deletes the
others crash-safely (index first). Leftovers are partial saves: hidden
``.<name>.shardsafe-tmp-<id>`` directories, object-store prefixes holding data but no
index, and unfinished S3 multipart uploads. A leftover younger than ``--min-age``
may belong to a save still running, so it is kept.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from . import EXIT_OK
from ._common import Entry, add_storage_options, modified, scan, storage_options
from ..engine.commit import delete_checkpoint
from ..storage import Storage, storage_for

DEFAULT_MIN_AGE = 3600.0


@dataclass(frozen=True, slots=True)
class Plan:
    """What ``gc`` removes."""

    expired: list[Entry]
    leftovers: list[Entry]
    uploads: list[tuple[str, str, float | None]]


def expired(entries: list[Entry], max_to_keep: int | None) -> list[Entry]:
    """Committed checkpoints beyond the ``max_to_keep`` newest (pure)."""
    committed = [e for e in entries if e.state == "committed"]
    if max_to_keep is None or len(committed) <= max_to_keep:
        return []
    stepped = [e for e in committed if e.step is not None]
    if stepped:  # a manager directory: steps order it; other checkpoints there are not its own
        ordered = sorted(stepped, key=lambda e: e.step)
    else:
        ordered = sorted(committed, key=lambda e: (e.index.created, e.name))
    return ordered[: max(0, len(ordered) - max_to_keep)]


def _old(t: float | None, now: float, min_age: float) -> bool:
    if t is None:  # unknown age: only an explicit --min-age 0 removes it
        return min_age <= 0
    return now - t >= min_age


def plan(storage: Storage, path: str, max_to_keep: int | None, min_age: float) -> Plan:
    """Decides what to remove under ``path`` (reads only)."""
    entries = scan(storage, path)
    now = time.time()
    leftovers = [e for e in entries
                 if e.state == "partial" and _old(modified(storage, e.path), now, min_age)]
    find = getattr(storage, "incomplete_uploads", None)
    uploads = [u for u in (find(path) if find else []) if _old(u[2], now, min_age)]
    return Plan(expired(entries, max_to_keep), leftovers, uploads)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gc", help="apply retention and remove leftovers of unfinished saves",
                       description="Delete committed checkpoints beyond the --max-to-keep newest "
                                   "and remove leftovers of unfinished saves older than --min-age.")
    p.add_argument("dir", metavar="DIR", help="directory of checkpoints (or URL)")
    p.add_argument("--max-to-keep", type=int, metavar="N",
                   help="keep the N newest committed checkpoints (default: keep all)")
    p.add_argument("--min-age", type=float, default=DEFAULT_MIN_AGE, metavar="SECONDS",
                   help="only remove leftovers at least this old, so running saves are safe "
                        f"(default {DEFAULT_MIN_AGE:.0f})")
    p.add_argument("--dry-run", action="store_true", help="print what would be removed")
    add_storage_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.max_to_keep is not None and args.max_to_keep < 1:
        raise ValueError("--max-to-keep must be at least 1")
    storage, path = storage_for(args.dir, storage_options(args))
    todo = plan(storage, path, args.max_to_keep, args.min_age)
    verb = "would delete" if args.dry_run else "deleted"
    for e in todo.expired:
        if not args.dry_run:
            delete_checkpoint(storage, e.path)
        print(f"{verb} {e.name} (step {e.step})" if e.step is not None else f"{verb} {e.name}")
    for e in todo.leftovers:
        if not args.dry_run:
            storage.delete(e.path)
        print(f"{verb} leftover {e.name}")
    for key, upload_id, _ in todo.uploads:
        if not args.dry_run:
            storage.abort_upload(key, upload_id)  # type: ignore[attr-defined]
        print(f"{verb} unfinished upload {key}")
    if not (todo.expired or todo.leftovers or todo.uploads):
        print("nothing to remove")
    return EXIT_OK
