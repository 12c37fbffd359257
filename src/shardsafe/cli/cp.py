"""``shardsafe cp SRC DST``: copy a checkpoint, or every committed step of a directory
(``--all``), between any two stores, verifying every block as it streams past.

The copy itself is ``engine.transfer.verbatim.copy_checkpoint`` (the files byte for byte,
in pieces of ``PIECE`` bytes; an incremental step with the files it references, carried
inside the copy, or with ``--all`` shared between the steps copied, so that nothing is
written outside DST), or with ``--compression``
``engine.transfer.recode.recode_checkpoint`` (the tensors decoded and coded
again, in batches). Either way memory stays bounded, the destination is committed
atomically, and an interrupted copy leaves nothing committed.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from . import EXIT_FAILED, EXIT_OK
from .._numbers import human_bytes
from ._args import add_command, add_quiet_option, resolve_step, storage_options
from ._listing import scan
from ._output import progress
from ..engine.commit.diagnose import not_found
from ..engine.commit import is_committed, read_index
from ..engine.transfer.verbatim import CopyResult, copy_checkpoint
from ..engine.transfer.recode import recode_checkpoint
from ..errors import CheckpointNotFoundError, CorruptCheckpointError
from ..manager.steps import is_rolled_back
from ..storage import Storage, storage_for


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "cp", run, "copy a checkpoint (or every step) between stores, verified",
                    "Copy the checkpoint SRC to DST, or with --all every committed checkpoint under "
                    "the directory SRC into the directory DST, between local paths, s3:// and other "
                    "fsspec URLs. Every block is verified as it streams past (one 16 MiB piece in "
                    "memory); the destination is committed atomically, so an interrupted copy leaves "
                    "nothing committed and can simply be run again. Nothing is written outside DST: "
                    "a step of an incremental manager is copied with the files it references inside "
                    "the copy, so the copy stands alone (with --all, where DST is a directory of "
                    "steps, they stay shared between the steps copied there).",
                    ("src", "SRC", "checkpoint (or, with --all, directory) path or URL"),
                    ("dst", "DST", "destination path or URL"),
                    json_help="print one JSON object instead of text")
    add_quiet_option(p)
    p.add_argument("--all", action="store_true",
                   help="copy every committed checkpoint under SRC to DST/<name>; a damaged one "
                        "is listed as NOT COPIED (exit code 1) and the others are copied")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a committed checkpoint at the destination (else refused, unless "
                        "it is this very checkpoint already, which is left as it is)")
    p.add_argument("--compression", choices=("none", "zstd", "auto"), default=None,
                   help="code the copy's tensors anew (decoded and verified, then written raw or "
                        "compressed); without it the files are copied as they are")
    p.add_argument("--src-storage-options", metavar="JSON", default=None,
                   help="fsspec options for SRC only (over --storage-options)")
    p.add_argument("--dst-storage-options", metavar="JSON", default=None,
                   help="fsspec options for DST only (over --storage-options)")


@dataclass(frozen=True, slots=True)
class _Job:
    name: str
    src: str
    dst: str
    nbytes: int


def _jobs(args: argparse.Namespace, src: Storage, spath: str, dst: Storage,
          dpath: str) -> tuple[list[_Job], list[str]]:
    """What to copy, and (``--all``) the damaged checkpoints that cannot be."""
    if not args.all:
        try:
            index = read_index(src, spath)
        except CheckpointNotFoundError:
            if is_committed(src, spath):  # deleted and saved again meanwhile
                raise
            if any(en.state == "committed" for en in _scan_or_none(src, spath)):
                raise CheckpointNotFoundError(f"{args.src!r} is a directory of checkpoints: add --all to "
                                              f"copy every one, or name one (such as {args.src}@latest)") from None
            raise not_found(src, spath, args.src) from None
        name = spath.rstrip("/").rsplit("/", 1)[-1]
        return [_Job(name, spath, dpath, sum(f.size for f in index.files))], []
    entries = [e for e in scan(src, spath) if not is_rolled_back(e.name)]
    jobs = [_Job(e.name, e.path, dst.join(dpath, e.name), sum(f.size for f in e.index.files))
            for e in entries if e.state == "committed" and e.index is not None]
    damaged = [f"{e.name}: {e.error}" for e in entries if e.state == "corrupt"]
    if not jobs and not damaged:
        hint = "; it is a checkpoint itself: copy it without --all" if is_committed(src, spath) else ""
        raise CheckpointNotFoundError(f"no committed checkpoint under {args.src!r}{hint}")
    return jobs, damaged


def _scan_or_none(storage: Storage, path: str) -> list:
    """The entries under ``path``, or none where it is no directory."""
    try:
        return scan(storage, path)
    except CheckpointNotFoundError:
        return []


def _copy_one(args: argparse.Namespace, src: Storage, dst: Storage, j: _Job, on_bytes) -> CopyResult:  # noqa: ANN001
    if args.compression is None:
        # --all: references stay references, naming siblings inside the destination directory
        return copy_checkpoint(src, j.src, dst, j.dst, overwrite=args.overwrite, on_bytes=on_bytes,
                               carry_references=not args.all)
    return recode_checkpoint(src, j.src, dst, j.dst, overwrite=args.overwrite, on_bytes=on_bytes,
                             compression=None if args.compression == "none" else args.compression)


def run(args: argparse.Namespace) -> int:
    common = storage_options(args)
    args.src = resolve_step(args.src, {**common, **storage_options(args, "src_storage_options")})
    src, spath = storage_for(args.src, {**common, **storage_options(args, "src_storage_options")})
    dst, dpath = storage_for(args.dst, {**common, **storage_options(args, "dst_storage_options")})
    jobs, damaged = _jobs(args, src, spath, dst, dpath)
    if args.all:
        dst.makedirs(dpath)
    bar = progress(sum(j.nbytes for j in jobs), "cp", args.quiet)
    copied, skipped, nbytes = [], [], 0
    try:
        for j in jobs:
            try:
                r = _copy_one(args, src, dst, j, bar.update)
            except CorruptCheckpointError as e:
                if not args.all:
                    raise
                damaged.append(f"{j.name}: {e}")  # nothing of it was committed; go on
                continue
            (skipped if r.skipped else copied).append(j.name)
            nbytes += r.nbytes
            if not args.json:
                with bar.paused():
                    print(f"up to date {j.name}" if r.skipped else
                          f"copied {j.name} ({r.files} file(s), {human_bytes(r.nbytes)})")
    finally:
        bar.close()
    if args.json:
        print(json.dumps({"copied": copied, "skipped": skipped, "damaged": damaged, "bytes": nbytes}))
    else:
        for d in damaged:
            print(f"NOT COPIED {d}")
    return EXIT_FAILED if damaged else EXIT_OK
