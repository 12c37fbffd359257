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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._numbers import human_bytes as human_bytes  # one definition; ls and info format sizes
from ..engine.commit import TMP_MARKER, is_committed, is_temporary, list_entries, read_index
from ..errors import CheckpointError, CheckpointNotFoundError
from ..format.index.objects import Index
from ..manager.steps import MANAGER_KEY, QUARANTINE_SUFFIX, parse_step
from ..plan.layout import is_data_file_name
from ..storage import LocalStorage, Storage, storage_for

# the manager sets damaged steps aside as step_N.corrupt (or step_N.corrupt.2, ...)
QUARANTINED = re.compile(re.escape(QUARANTINE_SUFFIX) + r"(\.\d+)?$")


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
        raise ValueError(f"{flag} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object")
    return value


def open_checkpoint(path: str, options: dict) -> tuple[Storage, str, Index]:
    """Storage, backend path and validated index of the committed checkpoint at ``path``."""
    storage, spath = storage_for(path, options)
    return storage, spath, read_index(storage, spath)


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
    """

    name: str
    path: str
    state: str
    index: Index | None = None
    error: str | None = None

    @property
    def step(self) -> int | None:
        """The step: from the manager's metadata, else from a ``step_N`` name."""
        if self.index is not None:
            md = self.index.metadata.get(MANAGER_KEY)
            if isinstance(md, dict) and isinstance(md.get("step"), int):
                return md["step"]
        return parse_step(QUARANTINED.sub("", _final_name(self.name)))

    @property
    def metrics(self) -> dict[str, Any]:
        md = self.index.metadata.get(MANAGER_KEY) if self.index is not None else None
        metrics = md.get("metrics") if isinstance(md, dict) else None
        return metrics if isinstance(metrics, dict) else {}

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
    if index.table is not None:  # v2: columns, no object per chunk
        t = index.table
        return int(t.stored_nbytes()[np.isin(t.file, np.array(ids, dtype=np.int64))].sum())
    names = {index.files[i].name for i in ids}
    return sum(c.stored_nbytes for t in index.tensors for c in t.chunks if c.file in names)


def _final_name(name: str) -> str:
    """``step_00000002`` for a temporary ``.step_00000002.shardsafe-tmp-<id>``."""
    if is_temporary(name):
        return name[1:].split(TMP_MARKER, 1)[0]
    return name


def _classify(storage: Storage, parent: str, name: str) -> Entry | None:
    path = storage.join(parent, name)
    if is_temporary(name):  # an unfinished save (its index may be published already)
        return Entry(name, path, "partial") if storage.is_directory(path) else None
    if QUARANTINED.search(name):
        return Entry(name, path, "corrupt", error="set aside as damaged")
    if is_committed(storage, path):
        try:
            return Entry(name, path, "committed", index=read_index(storage, path))
        except CheckpointError as e:
            return Entry(name, path, "corrupt", error=str(e))
    # object stores write data under the final prefix: data files without an index are a
    # save that has not committed (or never will); so is a step directory without an
    # index (a delete, index first, was interrupted). Other directories are not ours.
    if not storage.is_directory(path):
        return None  # a file, FIFO or device named like a step: not ours
    if parse_step(name) is not None or any(is_data_file_name(n) for n in storage.list(path)):
        return Entry(name, path, "partial")
    return None


def scan(storage: Storage, path: str) -> list[Entry]:
    """Checkpoints and unfinished saves directly under ``path``, steps in order; symbolic
    links are left out (never followed, see ``engine.commit.list_entries``).

    Raises:
        CheckpointNotFoundError: ``path`` does not exist.
    """
    names = list_entries(storage, path)
    if not names and not storage.exists(path):
        raise CheckpointNotFoundError(f"{path!r} does not exist")
    # listing a prefix needs one request per child on object stores: do them concurrently
    with ThreadPoolExecutor(8) as pool:
        found = [e for e in pool.map(lambda n: _classify(storage, path, n), names) if e is not None]
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


def progress(total: int, desc: str) -> Any:
    """A byte progress bar on stderr when it is a terminal and tqdm is installed; else silent."""
    if not sys.stderr.isatty():
        return _NoProgress()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoProgress()
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                file=sys.stderr, leave=False)
