"""Which run a local checkpoint belongs to: the id of its persistent directory.

A manager with a local tier ties it to its persistent directory: the first writable
manager of the directory publishes a random id in ``<directory>/.shardsafe-run``, and
every local step records that id in its index (``local_tier``). A local step of any
other run (a fresh persistent directory next to a reused ``local_directory``, or a
directory deleted and created again under the same name) carries another id and is
never restored. Reading refuses anything but a small regular file holding the id.
"""

from __future__ import annotations

import json
import re
import secrets

from ..errors import CorruptCheckpointError
from ..storage.base import Storage

RUN_NAME = ".shardsafe-run"
_ID = re.compile(r"^[0-9a-f]{32}$")
_MAX_BYTES = 4096


def read_run_id(storage: Storage, directory: str) -> str | None:
    """The run id of ``directory``, or None if it has none yet.

    Raises:
        CorruptCheckpointError: the file is there but does not hold a run id (or is not
            a regular file).
    """
    path = storage.join(directory, RUN_NAME)
    try:
        if storage.size(path) > _MAX_BYTES:
            raise CorruptCheckpointError("run id file is too large", file=RUN_NAME)
        raw = storage.read(path)
    except FileNotFoundError:
        return None
    try:
        run = json.loads(raw.decode("utf-8"))["run"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        run = None
    if not isinstance(run, str) or not _ID.match(run):
        raise CorruptCheckpointError("run id file does not hold a run id", file=RUN_NAME)
    return run


def ensure_run_id(storage: Storage, directory: str) -> str:
    """The run id of ``directory``, published first if it has none (the directory's
    single writer calls this, under its lock)."""
    run = read_run_id(storage, directory)
    if run is None:
        run = secrets.token_hex(16)
        storage.publish(storage.join(directory, RUN_NAME), json.dumps({"run": run}).encode("utf-8"))
    return run


__all__ = ["RUN_NAME", "ensure_run_id", "read_run_id"]
