"""The names shardsafe gives what it writes into a directory of checkpoints: a manager's
step directories (``step_name``/``parse_step``), and the one rule for recognising
shardsafe's own objects where nothing else says whose they are.

An unfinished S3 multipart upload has no index, no listing entry and no owner; only its
key tells who started it. ``shardsafe gc`` aborts an upload only when its key is one a
save, a copy or an incremental step of shardsafe writes, at the depth it writes it::

    <directory>/<checkpoint>/index.json
    <directory>/<checkpoint>/data-r<rank>-<part>.safetensors   (or .blocks)
    <directory>/<checkpoint>/ref<row>-<data file>               (a copy's carried reference)
    <directory>/<checkpoint>/.<file>.shardsafe-tmp-<id>        (a sibling file being copied)
    <directory>/<.working directory>/entries-r<rank>            (a rank's chunk entries, too
                                                                 large for the store, on their
                                                                 way to rank 0)

``<checkpoint>`` is any one path component (a ``step_<N>`` directory, a checkpoint of
another name, or a save's hidden ``.<name>.shardsafe-tmp-<id>`` working directory);
deeper or shallower keys, and other file names, belong to someone else.

Pure: names in, a verdict out.
"""

from __future__ import annotations

import re

from ...format import INDEX_NAME
from ...format.index.rows import FILE_NAME, LINK_PREFIX
from ...plan.layout import BLOCK_SUFFIX, DATA_SUFFIX, is_data_file_name
from .transaction import TMP_MARKER

# detach.own_name: "ref<row>-<file>", "ref<row><ext of file>" or "ref<row>.<n>"
_LINKED = re.compile(re.escape(LINK_PREFIX) + r"[0-9]{5}(?:-(?P<base>.+)|"
                     + re.escape(DATA_SUFFIX) + "|" + re.escape(BLOCK_SUFFIX) + r"|\.[0-9]+)")
_STEP = re.compile(r"^step_(\d+)$")
_ENTRIES = re.compile(r"entries-r(0|[1-9][0-9]*)")


def entries_file_name(rank: int) -> str:
    """Name of the file in a save's working directory that holds ``rank``'s chunk entries
    when they are too large to send through the store (``two_phase``)."""
    return f"entries-r{rank}"


def step_name(step: int) -> str:
    """Directory name of a manager's ``step`` (``step_00000042``: zero-padded to 8 digits,
    wider numbers as they are)."""
    return f"step_{step:08d}"


def parse_step(name: str) -> int | None:
    """The step a directory name stands for, or None if it is not a step directory."""
    m = _STEP.match(name)
    return int(m.group(1)) if m else None


_HIDDEN = re.compile(r"\.(?P<name>.+)" + re.escape(TMP_MARKER) + r"[0-9a-f]+")


def is_own_file_name(name: str) -> bool:
    """Whether ``name`` is a file name a save or a copy gives a file of a checkpoint: the
    index, a data or block file, a copy's own name for a referenced file, or the hidden
    temporary name one of those is written under."""
    hidden = _HIDDEN.fullmatch(name)
    if hidden is not None:
        name = hidden.group("name")
    if name == INDEX_NAME:
        return hidden is None  # the index is published in one request, never via a temporary
    if _ENTRIES.fullmatch(name):
        return hidden is None  # written whole into the working directory, removed by rank 0
    if is_data_file_name(name):
        return True
    linked = _LINKED.fullmatch(name)
    if linked is None or FILE_NAME.fullmatch(name) is None:
        return False
    base = linked.group("base")
    return base is None or is_data_file_name(base)


def written_by_shardsafe(key: str) -> bool:
    """Whether ``key``, relative to a directory of checkpoints (``/``-separated, as an
    object store lists it), names an object shardsafe writes there:
    ``<checkpoint>/<file>`` with ``<file>`` one of ``is_own_file_name``'s names."""
    parts = key.split("/")
    if len(parts) != 2:
        return False
    checkpoint, file = parts
    return checkpoint not in ("", ".", "..") and is_own_file_name(file)


__all__ = ["entries_file_name", "is_own_file_name", "parse_step", "step_name", "written_by_shardsafe"]
