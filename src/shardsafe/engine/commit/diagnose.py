"""What a path that is not a committed checkpoint is, and what to do with it.

A user who names the wrong path (a ``torch.save`` file, a DCP checkpoint, a manager's
directory of steps, a save that never finished) is told what the path is, not only that
it holds no index. ``describe`` finds out with a few requests (a stat, a listing, the
first bytes of a file, one existence check per listed entry up to ``MAX_PROBES``); it is
called only once a load or a command has already failed to find an index, never on a
path that is a checkpoint.
"""

from __future__ import annotations

import os
import posixpath
import stat
import struct

from ...errors import CheckpointError, CheckpointNotFoundError
from ...format import INDEX_NAME
from ...format.index.objects import Index
from ...plan.layout import is_data_file_name
from ...storage.base import Storage
from ...storage.local import LocalStorage
from .names import parse_step
from .transaction import TMP_MARKER, is_committed, is_temporary, read_index

DCP_METADATA = ".metadata"  # the (pickled) metadata file of a torch.distributed.checkpoint directory
MAX_PROBES = 16  # entries of a directory checked for an index, newest step first
_HEAD = 128  # bytes of a file read to recognise its format
_ZIP = b"PK\x03\x04"
_TORCH_LEGACY = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."  # pickled magic number of torch.save's old format
IMPORT = "`shardsafe import` converts it"


def describe(storage: Storage, path: str, shown: str | None = None) -> str:
    """One sentence saying what ``path`` (in ``storage``'s syntax; ``shown`` as the user
    wrote it) is, when it holds no committed checkpoint, and what to do with it."""
    user = shown if shown is not None else path
    shown = repr(user)
    kind = _kind(storage, path)
    if kind == "missing":
        unfinished = _unfinished_sibling(storage, path)
        if unfinished is not None:
            return (f"{shown} does not exist: only an unfinished save to it is there ({unfinished!r}, a "
                    f"save that was interrupted, or is still running); nothing was committed")
        return f"{shown} does not exist"
    if kind == "file":
        return f"{shown} {_file_kind(storage, path)}"
    if kind != "directory":
        return f"{shown} is {kind}, not a checkpoint directory"
    return f"{shown} {_directory_kind(storage, path, user)}"


def not_found(storage: Storage, path: str, shown: str | None = None) -> CheckpointNotFoundError:
    """The error for a path that holds no committed checkpoint: ``describe``'s sentence."""
    return CheckpointNotFoundError(describe(storage, path, shown))


def read_index_explained(storage: Storage, path: str, shown: str | None = None) -> Index:
    """``read_index``, raising ``not_found`` where ``path`` holds no committed checkpoint.

    Raises:
        CheckpointNotFoundError: no committed checkpoint at ``path``; says what it is instead.
        CorruptCheckpointError: the index is damaged or a data file is truncated.
    """
    try:
        return read_index(storage, path)
    except CheckpointNotFoundError:
        if is_committed(storage, path):  # deleted and saved again meanwhile: the error stands
            raise
        raise not_found(storage, path, shown) from None


def _kind(storage: Storage, path: str) -> str:
    """``missing``, ``file``, ``directory``, or (local) what else it is (``a FIFO``, ...)."""
    if isinstance(storage, LocalStorage):
        try:
            mode = os.stat(path).st_mode  # a path the user names may be a link to what it means
        except (FileNotFoundError, NotADirectoryError):
            return "missing"
        except OSError as e:
            return f"unreadable ({e.strerror})"
        if stat.S_ISDIR(mode):
            return "directory"
        if stat.S_ISREG(mode):
            return "file"
        return "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    if storage.list(path) or storage.is_directory(path):
        return "directory"
    return "file" if storage.exists(path) else "missing"


def _head(storage: Storage, path: str) -> bytes:
    """The first bytes of the (regular) file ``path``; empty when they cannot be read."""
    if isinstance(storage, LocalStorage):
        try:
            with open(path, "rb") as f:
                return f.read(_HEAD)
        except OSError:
            return b""
    try:
        n = min(storage.size(path), _HEAD)
        buf = bytearray(n)
        storage.read_into(path, 0, memoryview(buf))
    except (OSError, EOFError, CheckpointError):
        return b""
    return bytes(buf)


def _file_kind(storage: Storage, path: str) -> str:
    name = posixpath.basename(path.rstrip("/"))
    if name == INDEX_NAME:
        parent = posixpath.dirname(path.rstrip("/")) or "."
        return f"is the index file of a checkpoint: load the directory that holds it ({parent!r})"
    head = _head(storage, path)
    if head.startswith(_ZIP) and b"data.pkl" in head or head.startswith(_TORCH_LEGACY):
        return f"is a torch.save file, not a shardsafe checkpoint: {IMPORT}"
    if _is_safetensors(head):
        return f"is a safetensors file, not a shardsafe checkpoint: {IMPORT}"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "is a Python pickle, not a shardsafe checkpoint (a checkpoint is a directory holding index.json)"
    return "is a file, not a shardsafe checkpoint (a checkpoint is a directory holding index.json)"


def _is_safetensors(head: bytes) -> bool:
    """A safetensors file starts with the length of its JSON header, then ``{``."""
    if len(head) < 10:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 2 <= n < 1 << 32 and head[8:9] == b"{"


def _directory_kind(storage: Storage, path: str, user: str) -> str:
    names = storage.list(path)
    if not names:
        return "is an empty directory: nothing was saved there"
    if DCP_METADATA in names:
        return ("is a DCP checkpoint (torch.distributed.checkpoint's own format), not a shardsafe "
                "one: read it with `torch.distributed.checkpoint.load`, or convert it with "
                "`shardsafe import --trust-pickle`")
    committed = _committed_children(storage, path, names)
    if committed:
        steps = [parse_step(n) for n in committed]
        if all(s is not None for s in steps):
            listed = _listing([str(s) for s in steps], "steps", "step")
        else:
            listed = _listing([repr(n) for n in committed], "checkpoints", "checkpoint")
        newest = f"{user.rstrip('/')}/{committed[-1]}"
        return (f"is a directory of checkpoints ({listed}), not a checkpoint: load one of them "
                f"(the newest: {newest!r}), or restore with `CheckpointManager.restore`")
    if any(is_data_file_name(n) for n in names) or any(is_temporary(n) for n in names) \
            or any(parse_step(n) is not None for n in names):
        return ("holds only an unfinished save (no index.json: the save was interrupted, or is "
                "still running); nothing was committed there")
    return "is a directory without index.json: not a shardsafe checkpoint"


def _committed_children(storage: Storage, path: str, names: list[str]) -> list[str]:
    """Committed checkpoints among ``names``, steps in step order first: of the steps the
    newest, then the other visible names, at most ``MAX_PROBES`` checked."""
    steps = sorted((n for n in names if parse_step(n) is not None), key=lambda n: parse_step(n) or 0)
    others = [n for n in names if parse_step(n) is None and not n.startswith(".")]
    probed = (steps[::-1] + others)[:MAX_PROBES]
    found = {n for n in probed if is_committed(storage, storage.join(path, n))}
    return [n for n in steps + others if n in found]


def _listing(items: list[str], plural: str, singular: str) -> str:
    if len(items) == 1:
        return f"{singular} {items[0]}"
    if len(items) <= 6:
        return f"{plural} {', '.join(items)}"
    return f"{len(items)} {plural}: {', '.join(items[:3])}, ..., {items[-1]}"


def _unfinished_sibling(storage: Storage, path: str) -> str | None:
    """The working directory of an unfinished save to ``path`` (local storage), if any."""
    if not isinstance(storage, LocalStorage):
        return None
    parent, name = os.path.split(path.rstrip("/"))
    prefix = f".{name}{TMP_MARKER}"
    for n in storage.list(parent or "."):
        if n.startswith(prefix):
            return n
    return None


__all__ = ["describe", "not_found", "read_index_explained"]
