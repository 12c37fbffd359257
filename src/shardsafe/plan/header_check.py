"""Does a data file's safetensors header say what the index says? (pure; used by ``verify``)

``plan_file`` writes each data file's header from the same items the index describes,
so every header entry is predictable from the index: one entry per chunk of the file,
named by the chunk's key path (``<path>/part[...]`` for a partial chunk, ``#k`` added on
a clash), with the dtype code, shape and data offsets of the chunk; a ``__metadata__``
string map whose ``shardsafe.parts`` entry describes exactly the partial chunks. Any
other header is reported, even one the loader (which trusts only the index) would never
notice: other tools read these files as plain safetensors.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ..format.datafile import METADATA_KEY
from ..format.dtypes import DTYPES, lookup
from ..format.index.objects import Index, TensorEntry
from ..format.index.rows import ChunkEntry, FileEntry
from ..format.index.rows import LINKED_FILE
from ..format.tree import render_path
from .layout import PARTS_KEY, part_name

MAX_HEADER_BYTES = 100_000_000  # the safetensors library refuses longer headers too
_ITEMSIZE = {d.safetensors: d.itemsize for d in DTYPES.values() if d.safetensors}
_CLASH = re.compile(r"#[1-9][0-9]*")


def _expected(t: TensorEntry, c: ChunkEntry) -> tuple[str, str, list[int], dict[str, Any] | None]:
    """(name without clash suffix, dtype code, shape, parts entry or None) of one chunk."""
    path = render_path(t.key)
    d = lookup(t.dtype)
    code, shape = (d.safetensors, list(c.shape)) if d.safetensors else ("U8", [c.nbytes])
    if tuple(c.shape) == tuple(t.shape):
        return path, code, shape, None
    part = {"tensor": path, "offsets": list(c.offsets), "shape": list(c.shape),
            "global_shape": list(t.shape)}
    return part_name(path, c.offsets, c.shape), code, shape, part


def _entry_problem(name: str, v: Any, want: tuple[str, str, list[int], Any] | None) -> str | None:
    """What is wrong with header entry ``name`` (None when it matches ``want``)."""
    if not isinstance(v, dict) or set(v) != {"dtype", "shape", "data_offsets"}:
        return f"entry {name!r} is not a safetensors tensor entry"
    code, shape, offs = v["dtype"], v["shape"], v["data_offsets"]
    if code not in _ITEMSIZE:
        return f"entry {name!r} has unknown dtype {code!r}"
    if (not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape)
            or not isinstance(offs, list) or len(offs) != 2
            or not all(type(o) is int and o >= 0 for o in offs)):
        return f"entry {name!r} has a malformed shape or data_offsets"
    if offs[1] - offs[0] != math.prod(shape) * _ITEMSIZE[code]:
        return f"entry {name!r}: data_offsets do not span its dtype and shape"
    if want is None:
        return f"entry {name!r} at data_offsets {offs} is no chunk of the index"
    base, want_code, want_shape, _ = want
    if not _names_match(name, base):
        return f"entry {name!r} should be named {base!r}"
    if code != want_code or shape != want_shape:
        return (f"entry {name!r} is {code}{shape}, the index says {want_code}{want_shape}")
    return None


def _metadata_problem(meta: Any, parts_want: dict[str, Any], subset: bool = False) -> str | None:
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in meta.items()):
        return "__metadata__ is not a map of strings"
    if parts_want:
        try:
            parts = json.loads(meta.get(PARTS_KEY, ""))
        except ValueError:
            return f"__metadata__[{PARTS_KEY!r}] is missing or not JSON"
        if subset and isinstance(parts, dict):  # a referenced file also holds other chunks
            parts = {k: v for k, v in parts.items() if k in parts_want}
        if parts != parts_want:
            return f"__metadata__[{PARTS_KEY!r}] does not describe the partial chunks of the index"
    elif PARTS_KEY in meta and not subset:
        return f"__metadata__[{PARTS_KEY!r}] names partial chunks the index does not have"
    return None


def _names_match(name: str, base: str) -> bool:
    return name == base or (name.startswith(base) and _CLASH.fullmatch(name[len(base):]) is not None)


def _take(pending: dict[tuple[int, int], list], span: Any, name: str) -> Any:
    """The expected chunk at ``span`` for header entry ``name`` (removed from ``pending``).

    Several empty chunks share one span: the one whose name matches is taken first.
    """
    wants = pending.get(span) if isinstance(span, tuple) else None
    if not wants:
        return None
    i = next((j for j, w in enumerate(wants) if _names_match(name, w[0])), 0)
    return wants.pop(i)


def header_problems(index: Index, f: FileEntry, entries: dict[str, Any]) -> list[str]:
    """Every way the parsed header ``entries`` of data file ``f`` disagrees with ``index``.

    Also checks what the safetensors library requires: known dtype codes, offsets that
    span ``prod(shape) * itemsize`` and tile the data section without holes to its end.
    A reference (``f.reference``: a data file of an earlier step, incremental saves) also
    holds chunks this index does not use: there only the referenced chunks are checked;
    so too in a link that a rolled-back step made of a file it referenced (``LINKED_FILE``).
    """
    subset = f.reference is not None or LINKED_FILE.fullmatch(f.name) is not None
    pending: dict[tuple[int, int], list] = {}
    for t in index.tensors:
        for c in t.chunks:
            if c.file == f.name:
                rel = c.offset - f.data_start
                pending.setdefault((rel, rel + c.nbytes), []).append(_expected(t, c))
    spans = sorted(pending)
    problems: list[str] = []
    parts_got: dict[str, Any] = {}
    for name, v in entries.items():
        if name == METADATA_KEY:
            continue
        offs = v.get("data_offsets") if isinstance(v, dict) else None
        span = tuple(offs) if isinstance(offs, list) and len(offs) == 2 else None
        want = _take(pending, span, name)
        if want is None and subset:
            continue
        msg = _entry_problem(name, v, want)
        if msg is not None:
            problems.append(msg)
        elif want[3] is not None:
            parts_got[name] = want[3]
    missing = sum(len(w) for w in pending.values())
    if missing:
        problems.append(f"{missing} chunk(s) of the index have no header entry")
    meta_msg = _metadata_problem(entries.get(METADATA_KEY, {}), parts_got, subset)
    if meta_msg is not None:
        problems.append(meta_msg)
    if subset:
        return problems
    pos = 0
    for lo, hi in spans:
        if lo != pos:
            problems.append("the chunks leave a hole in the data section")
            break
        pos = hi
    if pos != f.size - f.data_start:
        problems.append("the chunks do not end at the end of the file")
    return problems


__all__ = ["MAX_HEADER_BYTES", "header_problems"]
