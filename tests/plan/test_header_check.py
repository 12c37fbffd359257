"""header_check: the header plan_file writes is exactly what the index predicts, partial
chunks (shardsafe.parts) and name clashes included; any change is reported."""

from __future__ import annotations

import json

import numpy as np

from shardsafe.format.datafile import parse_header
from shardsafe.format.index.objects import Index, TensorEntry
from shardsafe.format.index.rows import ChunkEntry, FileEntry
from shardsafe.plan.flatten import TensorItem
from shardsafe.plan.header_check import header_problems
from shardsafe.plan.layout import PARTS_KEY, plan_file


def _item(i: int, path: tuple, local: np.ndarray, shape: tuple, offsets: tuple) -> TensorItem:
    return TensorItem(id=i, path=path, value=local, kind="numpy", dtype=str(local.dtype), shape=shape,
                      offsets=offsets, replicated=local.shape == shape)


def _case() -> tuple[Index, FileEntry, dict]:
    w = np.arange(24, dtype=np.float32).reshape(4, 6)
    items = [_item(0, ("model", "w"), w[:2], (4, 6), (0, 0)),
             _item(1, ("model", "b"), np.ones(6, np.float64), (6,), (0,)),
             _item(2, ("model.b",), np.ones(2, np.int16), (2,), (0,)),  # clashes with model -> b
             _item(3, ("e",), np.zeros(0, np.float32), (0,), (0,)),
             _item(4, ("f",), np.zeros(0, np.float32), (0,), (0,))]
    plan = plan_file("f.safetensors", items)
    tensors = tuple(TensorEntry(key=it.path, kind="numpy", dtype=it.dtype, shape=it.shape,
                                chunks=(ChunkEntry("f.safetensors", off, it.nbytes, it.offsets,
                                                   it.local_shape, (0,)),))
                    for it, off in zip(plan.items, plan.layout.offsets))
    f = FileEntry("f.safetensors", plan.layout.size, plan.layout.data_start)
    index = Index(tree=None, tensors=tensors, files=(f,), block_size=1 << 20)  # type: ignore[arg-type]
    _, entries = parse_header(plan.layout.header)
    return index, f, entries


def test_the_written_header_matches() -> None:
    index, f, entries = _case()
    assert "model.b#1" in entries and PARTS_KEY in entries["__metadata__"]
    assert header_problems(index, f, entries) == []


def test_changed_parts_metadata_is_reported() -> None:
    index, f, entries = _case()
    parts = json.loads(entries["__metadata__"][PARTS_KEY])
    parts["model.w/part[0:2,0:6]"]["global_shape"] = [8, 6]
    entries["__metadata__"][PARTS_KEY] = json.dumps(parts)
    assert any(PARTS_KEY in m for m in header_problems(index, f, entries))


def test_missing_and_extra_entries_are_reported() -> None:
    index, f, entries = _case()
    entries["x"] = entries.pop("model.b")
    problems = header_problems(index, f, entries)
    assert any("should be named 'model.b'" in m for m in problems)
    del entries["e"]
    assert any("no header entry" in m for m in header_problems(index, f, entries))
