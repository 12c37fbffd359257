"""A local checkpoint as one byte message, and back (what travels to and from a peer).

A message is an 8-byte little-endian header length, a JSON header
``{"step": N, "rank": r, "error": str | null, "files": [[name, size], ...]}`` and the
files' bytes one after another (the index and the data files, exactly as on disk, so
the receiver verifies the same checksums when it loads). A rank whose local save
failed sends a header with its ``error`` and no files, so every round still pairs up.

``write_step`` stores a received checkpoint atomically: into a hidden temporary
directory first (``engine.commit.is_temporary`` names), renamed into place last.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import uuid
from dataclasses import dataclass

import numpy as np

from ..engine.commit import TMP_MARKER
from ..errors import CorruptCheckpointError

_LEN = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class StepMessage:
    """A decoded message: which step of which rank, and its files (None on error)."""

    step: int
    rank: int
    error: str | None
    files: dict[str, memoryview]


def pack(step: int, rank: int, directory: str | None, error: str | None = None) -> np.ndarray:
    """The message for ``directory`` (a committed step directory), or an error notice."""
    names = sorted(os.listdir(directory)) if directory is not None and error is None else []
    sizes = [os.path.getsize(os.path.join(directory, n)) for n in names] if names else []  # type: ignore[arg-type]
    header = json.dumps({"step": step, "rank": rank, "error": error,
                         "files": [[n, s] for n, s in zip(names, sizes)]}).encode()
    out = np.empty(_LEN.size + len(header) + sum(sizes), dtype=np.uint8)
    out[: _LEN.size] = np.frombuffer(_LEN.pack(len(header)), dtype=np.uint8)
    pos = _LEN.size + len(header)
    out[_LEN.size : pos] = np.frombuffer(header, dtype=np.uint8)
    view = memoryview(out)
    for n, s in zip(names, sizes):
        with open(os.path.join(directory, n), "rb", buffering=0) as f:  # type: ignore[arg-type]
            got = f.readinto(view[pos : pos + s])
        if got != s:
            raise CorruptCheckpointError(f"{n} changed size while being sent", file=n)
        pos += s
    return out


def unpack(message: np.ndarray) -> StepMessage:
    """Decodes a message (raises CorruptCheckpointError on a malformed one)."""
    raw = memoryview(message).cast("B")
    try:
        (hlen,) = _LEN.unpack_from(raw)
        header = json.loads(bytes(raw[_LEN.size : _LEN.size + hlen]))
        pos = _LEN.size + hlen
        files = {}
        for name, size in header["files"]:
            if os.path.basename(name) != name or name.startswith("."):
                raise ValueError(f"bad file name {name!r}")
            files[name] = raw[pos : pos + size]
            pos += size
        if pos != len(raw):
            raise ValueError(f"{len(raw) - pos} bytes left over")
        return StepMessage(int(header["step"]), int(header["rank"]), header["error"], files)
    except (struct.error, ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpointError(f"malformed peer message: {e}") from e


def write_step(files: dict[str, memoryview], parent: str, name: str) -> str:
    """Writes ``files`` as ``parent/name`` atomically (replacing an older copy); its path."""
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{name}{TMP_MARKER}{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    try:
        for n, data in files.items():
            with open(os.path.join(tmp, n), "wb") as f:
                f.write(data)
        dst = os.path.join(parent, name)
        if os.path.exists(dst):
            shutil.rmtree(dst)
        os.rename(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


__all__ = ["StepMessage", "pack", "unpack", "write_step"]
