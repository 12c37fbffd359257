"""Helpers shared by the subcommands: storage options, directory scans, progress, formatting.

Nothing here prints; the subcommand modules do.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import UsageError
from .._numbers import human_bytes as human_bytes  # one definition; ls and info format sizes
from ..engine.commit import is_committed, read_index
from ..engine.commit.diagnose import describe, read_index_explained
from ..errors import CheckpointError, CheckpointNotFoundError
from ..format.index.objects import Index
from ..manager.steps import StepDirectory, StepEntry, recorded
from ..storage import LocalStorage, Storage, storage_for


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    """Adds ``--storage-options JSON`` (passed to fsspec for URLs such as ``s3://``)."""
    parser.add_argument("--storage-options", metavar="JSON", default=None,
                        help="fsspec options for URLs, as a JSON object, e.g. "
                             "'{\"endpoint_url\": \"http://127.0.0.1:9000\"}'")


CKPT = ("ckpt", "CKPT", "checkpoint directory or URL")  # the operand naming one checkpoint


def add_command(sub: argparse._SubParsersAction, name: str, run: Callable[[argparse.Namespace], int],
                help: str, description: str, *operands: tuple[str, str, str],
                json_help: str | None = None) -> argparse.ArgumentParser:
    """Adds subcommand ``name`` that calls ``run``: its ``operands`` (``(dest, metavar,
    help)`` each, positional), ``--json`` when ``json_help`` is given, and
    ``--storage-options``. Returns the parser, for the command's own options."""
    p = sub.add_parser(name, help=help, description=description)
    for dest, metavar, text in operands:
        p.add_argument(dest, metavar=metavar, help=text)
    if json_help is not None:
        p.add_argument("--json", action="store_true", help=json_help)
    add_storage_options(p)
    p.set_defaults(func=run)
    return p


def storage_options(args: argparse.Namespace, name: str = "storage_options") -> dict:
    """The parsed ``--storage-options`` (or the option stored as ``name``; an empty dict
    when absent)."""
    raw = getattr(args, name, None)
    flag = "--" + name.replace("_", "-")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise UsageError(f"{flag} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a JSON object")
    return value


_STEP_SUFFIX = re.compile(r"@(latest|\d+)$")


def resolve_step(path: str, options: dict) -> str:
    """The checkpoint a command's operand names: ``DIR@latest`` is the newest committed
    step of the manager directory ``DIR``, ``DIR@N`` its step N; any other path is itself.

    Raises:
        CheckpointNotFoundError: ``DIR`` has no such committed step.
    """
    m = _STEP_SUFFIX.search(path)
    if m is None:
        return path
    directory = path[:m.start()]
    storage, spath = storage_for(directory, options)
    steps = StepDirectory(storage, spath).committed()
    want = max(steps, default=None) if m.group(1) == "latest" else int(m.group(1))
    if want is None:
        raise CheckpointNotFoundError(f"{path!r}: no committed step; {describe(storage, spath, directory)}")
    if want not in steps:
        listed = ", ".join(str(s) for s in list(steps)[-5:])
        raise CheckpointNotFoundError(f"{path!r}: {directory!r} has no committed step {want} "
                                      f"(newest: {listed})")
    return f"{directory.rstrip('/')}/{steps[want]}"


def open_checkpoint(path: str, options: dict) -> tuple[Storage, str, Index]:
    """Storage, backend path and validated index of the committed checkpoint at ``path``
    (``DIR@latest`` and ``DIR@N`` name a step: ``resolve_step``).

    Raises:
        CheckpointNotFoundError: ``path`` holds none; the message says what it is instead.
    """
    path = resolve_step(path, options)
    storage, spath = storage_for(path, options)
    return storage, spath, read_index_explained(storage, spath, path)


@dataclass(slots=True)
class Entry:
    """A checkpoint (or the leftover of an unfinished save) found in a directory.

    Attributes:
        name: Name inside the directory.
        path: Backend path.
        state: ``committed``, ``partial`` (an unfinished or crashed save) or ``corrupt``
            (committed, but its index or file sizes fail validation).
        index: The index of a committed checkpoint.
        error: Why it is corrupt.
        named_step: The step its name belongs to (``manager.steps.classify``).
    """

    name: str
    path: str
    state: str
    index: Index | None = None
    error: str | None = None
    named_step: int | None = None

    @property
    def step(self) -> int | None:
        """The step: as the manager recorded it in the index, else from the name."""
        return recorded(self.index).get("step", self.named_step) if self.index is not None else self.named_step

    @property
    def metrics(self) -> dict[str, Any]:
        """The metrics the manager recorded (as stored: JSON values)."""
        return recorded(self.index).get("metrics", {}) if self.index is not None else {}

    @property
    def size(self) -> int | None:
        """Bytes of the checkpoint's own data files (not those it references)."""
        return own_bytes(self.index) if self.index is not None else None

    @property
    def referenced(self) -> int | None:
        """Bytes of the chunks it references in sibling steps (incremental saves)."""
        return referenced_bytes(self.index) if self.index is not None else None


def own_bytes(index: Index) -> int:
    """Bytes of the data files the checkpoint holds itself."""
    return sum(f.size for f in index.files if f.reference is None)


def referenced_bytes(index: Index) -> int:
    """Bytes the chunks stored in data files of sibling steps (references) occupy there
    (compressed chunks: their stored bytes)."""
    ids = [i for i, f in enumerate(index.files) if f.reference is not None]
    if not ids:
        return 0
    t = index.table  # every decoded index has its chunk table
    return int(t.stored_nbytes()[np.isin(t.file, np.array(ids, dtype=np.int64))].sum())


def _entry(storage: Storage, parent: str, listed: StepEntry) -> Entry:
    """The command's view of a listed entry: a committed one's index is read (and
    validated); an unfinished save, an interrupted delete or a save in progress on an
    object store is ``partial`` (a temporary's index may be published already)."""
    path = storage.join(parent, listed.name)
    if listed.kind == "set-aside":
        return Entry(listed.name, path, "corrupt", error="set aside as damaged", named_step=listed.step)
    if not listed.committed or listed.kind == "temporary":
        return Entry(listed.name, path, "partial", named_step=listed.step)
    try:
        return Entry(listed.name, path, "committed", index=read_index(storage, path), named_step=listed.step)
    except CheckpointError as e:
        return Entry(listed.name, path, "corrupt", error=str(e), named_step=listed.step)


def scan(storage: Storage, path: str) -> list[Entry]:
    """Checkpoints and unfinished saves directly under ``path``, steps in order; symbolic
    links are left out (never followed, see ``engine.commit.list_entries``).

    Raises:
        CheckpointNotFoundError: ``path`` does not exist.
    """
    # listing a prefix needs one request per child on object stores: do them concurrently
    with ThreadPoolExecutor(8) as pool:
        listed = StepDirectory(storage, path).entries(every=True, map_fn=pool.map)
        if not listed and not storage.exists(path):
            raise CheckpointNotFoundError(f"{path!r} does not exist")
        found = list(pool.map(lambda e: _entry(storage, path, e), listed))
    return sorted(found, key=lambda e: (e.step is None, e.step or 0, e.name))


def checkpoints_at(storage: Storage, path: str) -> list[Entry]:
    """``path`` itself when it is a committed checkpoint, else the checkpoints under it."""
    if is_committed(storage, path):
        name = path.rstrip("/").rsplit("/", 1)[-1] or path
        try:
            return [Entry(name, path, "committed", index=read_index(storage, path))]
        except CheckpointError as e:
            return [Entry(name, path, "corrupt", error=str(e))]
    return scan(storage, path)


def modified(storage: Storage, path: str) -> float | None:
    """Newest modification time (POSIX seconds) of ``path`` or the files directly in it."""
    if isinstance(storage, LocalStorage):
        try:
            times = [os.stat(path).st_mtime]
            times += [os.stat(os.path.join(path, n)).st_mtime for n in storage.list(path)]
        except FileNotFoundError:
            return None
        return max(times)
    get = getattr(storage, "modified", None)
    if get is None:
        return None
    times = [t for t in (get(storage.join(path, n)) for n in storage.list(path)) if t is not None]
    return max(times) if times else None


def local_time(ts: float | None) -> str:
    """Local ``YYYY-MM-DD HH:MM:SS`` for a POSIX time; ``-`` when unknown."""
    if not ts:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def table(rows: list[list[str]]) -> Iterator[str]:
    """Left-aligned text columns (the first row is the header)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        yield "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass

    @contextmanager
    def paused(self) -> Iterator[None]:
        yield


class _Progress:
    """A tqdm bar on stderr. ``paused()`` clears it while the command prints a result line
    to stdout (the same terminal), then draws it again below the line."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar

    def update(self, n: int) -> None:
        self._bar.update(n)

    def close(self) -> None:
        self._bar.close()  # leave=False: the bar's line is cleared

    @contextmanager
    def paused(self) -> Iterator[None]:
        with self._bar.external_write_mode(file=sys.stdout):
            yield
            sys.stdout.flush()


def add_quiet_option(parser: argparse.ArgumentParser) -> None:
    """Adds ``-q/--quiet``: no progress bar."""
    parser.add_argument("-q", "--quiet", action="store_true", help="draw no progress bar")


def progress(total: int, desc: str, quiet: bool = False) -> Any:
    """A byte progress bar on stderr when it is a terminal, tqdm is installed and not
    ``quiet``; else silent. Result lines printed while it runs go inside ``paused()``;
    ``close()`` clears it."""
    if quiet or not sys.stderr.isatty():
        return _NoProgress()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoProgress()
    return _Progress(tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                          file=sys.stderr, leave=False))
