"""A forged or damaged index is rejected by validation before any data is read or allocated.

Each case edits the index of a real checkpoint and re-seals it with a correct checksum,
so it is the validation (not the CRC) that must reject it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import shardsafe
from shardsafe.engine.commit import read_index
from shardsafe.errors import CorruptCheckpointError
from shardsafe.format.index.versions import decode_index
from shardsafe.storage.local import LocalStorage

from forge_index import edited, read_raw, reseal_text, seal, v1_bytes, write_raw

DATA = "data-r00000-000.safetensors"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    path = str(tmp_path_factory.mktemp("forged") / "ckpt")
    shardsafe.save({"a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
                    "b": np.arange(5, dtype=np.int16),
                    "c": {"x": torch.ones(2, dtype=torch.float64), "n": 3}}, path)
    return path, read_raw(path)


def _tensor(raw: dict, key: str) -> dict:
    return next(t for t in raw["tensors"] if t["key"][-1] == key)


def _chunk(raw: dict, key: str) -> dict:
    return _tensor(raw, key)["chunks"][0]


def _set(*path_and_value: Any) -> Callable[[dict], None]:
    *path, value = path_and_value

    def fn(raw: dict) -> None:
        node = raw
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
    return fn


def _rename_file(new: str) -> Callable[[dict], None]:
    def fn(raw: dict) -> None:
        raw["files"][0]["name"] = new
        for t in raw["tensors"]:
            for c in t["chunks"]:
                c["file"] = new
    return fn


def _chunk_edit(which: str, **changes: Any) -> Callable[[dict], None]:
    def fn(raw: dict) -> None:
        _chunk(raw, which).update(changes)
    return fn


def _tensor_edit(which: str, **changes: Any) -> Callable[[dict], None]:
    def fn(raw: dict) -> None:
        _tensor(raw, which).update(changes)
    return fn


def _overlap(raw: dict) -> None:
    _chunk(raw, "x")["offset"] = _chunk(raw, "a")["offset"] + 8


def _past_end(raw: dict) -> None:
    _chunk(raw, "a")["offset"] = raw["files"][0]["size"] - 8


def _absurd(dims: list[int]) -> Callable[[dict], None]:
    def fn(raw: dict) -> None:
        t = _tensor(raw, "a")
        t["shape"] = dims
        t["chunks"][0].update(shape=dims, offsets=[0] * len(dims), nbytes=math.prod(dims) * 4)
    return fn


def _split_twice_same_region(raw: dict) -> None:
    # two byte-disjoint chunks of the same row: the element count matches the shape,
    # but row 1 is never written (a reader would hand out uninitialised memory)
    t = _tensor(raw, "a")
    t["shape"] = [2, 3]
    c = t["chunks"][0]
    c.update(shape=[1, 3], offsets=[0, 0], nbytes=12)
    t["chunks"] = [c, dict(c, offset=c["offset"] + 12)]


def _tree(fn: Callable[[dict], None]) -> Callable[[dict], None]:
    def outer(raw: dict) -> None:
        fn(raw["tree"])
    return outer


def _missing_id(tree: dict) -> None:
    tree["v"][0] = {"t": "tensor", "id": 99}


def _duplicate_id(tree: dict) -> None:
    tree["v"][1] = {"t": "tensor", "id": 0}


def _drop_ref(tree: dict) -> None:
    tree["v"][0] = {"t": "int", "v": 1}


def _deep(tree: dict) -> None:
    node: dict = {"t": "int", "v": 1}
    for _ in range(300):
        node = {"t": "list", "v": [node]}
    tree["k"].append("deep")
    tree["v"].append(node)


def _dup_key(tree: dict) -> None:
    tree["k"][1] = tree["k"][0]


CASES: list[tuple[str, Callable[[dict], None]]] = [
    ("file ../x", _rename_file("../x")),
    ("file /etc/passwd", _rename_file("/etc/passwd")),
    ("file a/b/c", _rename_file("a/b/c")),
    # references (incremental saves) are exactly "<plain directory>/<plain file>"
    ("reference ../b", _rename_file("../" + DATA)),
    ("reference ./b", _rename_file("./" + DATA)),
    ("reference a/..", _rename_file("step_1/..")),
    ("reference a//b", _rename_file("step_1//" + DATA)),
    ("reference /a/b", _rename_file("/step_1/" + DATA)),
    ("reference hidden dir", _rename_file(".step_1.shardsafe-tmp-0/" + DATA)),
    ("reference a\\b", _rename_file("step_1\\" + DATA)),
    ("reference to an index", _rename_file("step_1/index.json")),
    ("file with newline", _rename_file(DATA + "\n")),
    ("file empty", _rename_file("")),
    ("file hidden", _rename_file(".hidden")),
    ("file ..", _rename_file("..")),
    ("file reserved", _rename_file("index.json")),
    ("file not a string", _rename_file(7)),  # type: ignore[arg-type]
    ("chunk names unknown file", _chunk_edit("a", file="other.safetensors")),
    ("chunk traversal file", _chunk_edit("a", file="../" + DATA)),
    ("duplicate file", lambda r: r["files"].append(dict(r["files"][0]))),
    ("negative offset", _chunk_edit("a", offset=-8)),
    ("bool offset", _chunk_edit("b", offset=True)),
    ("float offset", _chunk_edit("a", offset=4096.0)),
    ("offset inside header", _chunk_edit("b", offset=16)),
    ("overlapping ranges", _overlap),
    ("range past end", _past_end),
    ("file size negative", _set("files", 0, "size", -1)),
    ("data_start past size", lambda r: r["files"][0].update(data_start=r["files"][0]["size"] + 1)),
    ("data_start tiny", _set("files", 0, "data_start", 4)),
    ("absurd shape 2**40 x 2**40", _absurd([2**40, 2**40])),
    ("absurd shape 2**62", _absurd([2**62])),
    ("absurd empty shape", _absurd([0, 2**62])),
    ("absurd empty shape 2", _absurd([0, 2**40, 2**40])),
    ("negative dim", _absurd([-1, 3])),
    ("too many dims", _absurd([1] * 65)),
    ("nbytes lies", _chunk_edit("a", nbytes=40)),
    ("chunk outside shape", _chunk_edit("a", offsets=[1, 0])),
    ("chunk ndim differs", _chunk_edit("a", offsets=[0], shape=[12])),
    ("chunks overlap inside tensor", _split_twice_same_region),
    ("no chunks", _tensor_edit("a", chunks=[])),
    ("too many checksums", lambda r: _chunk(r, "a")["crc32c"].append("00000000")),
    ("no checksums", _chunk_edit("a", crc32c=[])),
    ("checksum not hex", _chunk_edit("a", crc32c=["xyzxyzxy"])),
    ("checksum 0x prefix", _chunk_edit("a", crc32c=["0x123456"])),
    ("checksum negative", _chunk_edit("a", crc32c=["-1234567"])),
    ("checksum spaces", _chunk_edit("a", crc32c=[" 1234567"])),
    ("checksum underscore", _chunk_edit("a", crc32c=["1234_567"])),
    ("checksum int", _chunk_edit("a", crc32c=[1234])),
    ("unknown dtype", _tensor_edit("a", dtype="float128")),
    ("dtype not a string", _tensor_edit("a", dtype=["float32"])),
    ("numpy kind with bfloat16", lambda r: _tensor(r, "b").update(
        kind="numpy", dtype="bfloat16", chunks=[dict(_chunk(r, "b"), nbytes=10)])),
    ("unknown kind", _tensor_edit("a", kind="tensorflow")),
    ("key not a list", _tensor_edit("a", key="a")),
    ("key holds float", _tensor_edit("a", key=[1.5])),
    ("key differs from tree", _tensor_edit("a", key=["zzz"])),
    ("format_version 2", _set("format_version", 2)),
    ("format_version string", _set("format_version", "1")),
    ("format_version missing", lambda r: r.pop("format_version")),
    ("format_version true", _set("format_version", True)),
    ("unknown checksum", _set("checksum", "md5")),
    ("block_size tiny", _set("block_size", 16)),
    ("block_size missing", lambda r: r.pop("block_size")),
    ("files not a list", _set("files", {})),
    ("tensors not a list", _set("tensors", None)),
    ("metadata not an object", _set("metadata", [])),
    ("created overflows float", _set("created", 10**400)),
    ("created string", _set("created", "yesterday")),
    ("world_size 0", _set("world_size", 0)),
    ("tree missing", lambda r: r.pop("tree")),
    ("tree root is a list", _set("tree", {"t": "list", "v": []})),
    ("tree references missing tensor", _tree(_missing_id)),
    ("tree references tensor twice", _tree(_duplicate_id)),
    ("tree drops a tensor", _tree(_drop_ref)),
    ("tree too deep", _tree(_deep)),
    ("tree duplicate key", _tree(_dup_key)),
    ("tree bool key", _tree(lambda t: t["k"].__setitem__(1, True))),
    ("tree unknown node", _tree(lambda t: t["v"].__setitem__(1, {"t": "pickle", "v": "gASV"}))),
    ("tree bad base64", _tree(lambda t: t["v"].__setitem__(1, {"t": "bytes", "v": "!!"}))),
    ("tree npscalar wrong size", _tree(lambda t: t["v"].__setitem__(
        1, {"t": "npscalar", "dtype": "float64", "v": "AAAA"}))),
    ("tree npscalar bfloat16", _tree(lambda t: t["v"].__setitem__(
        1, {"t": "npscalar", "dtype": "bfloat16", "v": "AAA="}))),
    ("tree float overflows", _tree(lambda t: t["v"].__setitem__(1, {"t": "float", "v": 10**400}))),
    ("tree dict k/v lengths differ", _tree(lambda t: t["k"].append("extra"))),
    ("tree node not an object", _tree(lambda t: t["v"].__setitem__(1, 5))),
    ("tree tensor id bool", _tree(lambda t: t["v"].__setitem__(0, {"t": "tensor", "id": False}))),
    ("top level not an object", lambda r: (r.clear(), r.update({"x": []}))),
]


@pytest.mark.parametrize("fn", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_forged_index_is_rejected_by_decode(base, fn) -> None:
    _, raw = base
    with pytest.raises(CorruptCheckpointError) as info:
        decode_index(seal(edited(raw, fn)))
    assert info.value.file == "index.json"


# Edits json.dumps cannot express: made on the text, then re-sealed.
TEXT_CASES = [
    ("metadata nested 100000 deep", b'"metadata":{}', b'"metadata":' + b"[" * 100_000 + b"]" * 100_000),
    ("NaN literal", b'"metadata":{}', b'"metadata":{"x":NaN}'),
    ("Infinity literal", b'"metadata":{}', b'"metadata":{"x":-Infinity}'),
    ("1e400 literal", b'"metadata":{}', b'"metadata":{"x":1e400}'),
    ("invalid UTF-8", b'"metadata":{}', b'"metadata":{"x":"\xff\xfe"}'),
    ("duplicate member hides the real files", b'"files":', b'"files":[],"files":'),
]


@pytest.mark.parametrize(("old", "new"), [(o, n) for _, o, n in TEXT_CASES], ids=[c[0] for c in TEXT_CASES])
def test_forged_index_text_is_rejected(base, old: bytes, new: bytes) -> None:
    _, raw = base
    with pytest.raises(CorruptCheckpointError) as info:
        decode_index(reseal_text(seal(raw), old, new))
    assert info.value.file == "index.json"


def test_unedited_index_decodes(base) -> None:
    _, raw = base
    index = decode_index(seal(raw))  # the harness itself produces valid indexes
    assert sorted(t.key for t in index.tensors) == [("a",), ("b",), ("c", "x")]


class RecordingStorage(LocalStorage):
    """Local storage that records every data read (the load path must make none)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def read_into(self, path, offset, out) -> None:  # noqa: ANN001
        self.reads.append(path)
        super().read_into(path, offset, out)


@pytest.mark.parametrize("name", ["file ../x", "overlapping ranges", "absurd shape 2**40 x 2**40",
                                  "tree references missing tensor", "chunks overlap inside tensor",
                                  "absurd empty shape"])
def test_load_rejects_before_reading_data(base, tmp_path, name: str) -> None:
    src, raw = base
    fn = dict(CASES)[name]
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with open(os.path.join(src, DATA), "rb") as f:
        (ckpt / DATA).write_bytes(f.read())
    write_raw(str(ckpt), edited(raw, fn))
    storage = RecordingStorage()
    with pytest.raises(CorruptCheckpointError) as info:
        read_index(storage, str(ckpt))
    assert info.value.file == "index.json"
    assert storage.reads == []
    with pytest.raises(CorruptCheckpointError):
        shardsafe.load(str(ckpt))
    with pytest.raises(CorruptCheckpointError):
        shardsafe.load(str(ckpt), {"a": torch.zeros(3, 4), "b": np.zeros(5, np.int16),
                                   "c": {"x": torch.zeros(2, dtype=torch.float64), "n": 0}})


@pytest.mark.parametrize("cut", [0, 1, 10, 100, -60, -20, -2])
def test_truncated_index(base, cut: int) -> None:
    _, raw = base
    data = seal(raw)
    with pytest.raises(CorruptCheckpointError):
        decode_index(data[:cut] if cut else b"")


def test_flipped_byte_fails_the_checksum(base) -> None:
    _, raw = base
    data = bytearray(seal(raw))
    pos = data.index(b'"shape":[3,4]') + len(b'"shape":[')
    data[pos] ^= ord("3") ^ ord("5")  # still valid JSON; only the checksum can notice
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        decode_index(bytes(data))


def test_json_of_real_index_is_what_we_edit(base) -> None:
    path, raw = base
    with open(os.path.join(path, "index.json"), "rb") as f:
        # the harness re-seals the v1 form of the saved (v2) index byte-identically
        assert seal(raw) == v1_bytes(f.read())
    assert json.loads(seal(raw))["format_version"] == 1


class NoBigReads(LocalStorage):
    """Refuses (instead of performing) a whole-file read of anything over 1 MiB."""

    def read(self, path: str) -> bytes:
        assert self.size(path) < 1 << 20, f"read {path} of {self.size(path)} bytes"
        return super().read(path)


def test_huge_index_is_refused_before_it_is_read(tmp_path) -> None:
    from shardsafe.format.index.rules import MAX_INDEX_BYTES

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with open(ckpt / "index.json", "wb") as f:
        f.truncate(MAX_INDEX_BYTES + 1)  # sparse: no disk space, no memory
    with pytest.raises(CorruptCheckpointError, match="index") as info:
        read_index(NoBigReads(), str(ckpt))
    assert info.value.file == "index.json"


def test_empty_chunks_may_sit_anywhere(tmp_path) -> None:
    # FORMAT.md 9.6 constrains the byte ranges of non-empty chunks only: an empty chunk
    # reads nothing, so a reader must not reject one at offset 0 or inside another range
    path = str(tmp_path / "c")
    shardsafe.save({"e": torch.zeros(0, 3), "f": torch.zeros(2, 0), "w": torch.ones(4)}, path)
    raw = read_raw(path)
    _chunk(raw, "e")["offset"] = 0
    _chunk(raw, "f")["offset"] = _chunk(raw, "w")["offset"] + 4
    write_raw(path, raw)
    for got in (shardsafe.load(path), shardsafe.load(path, mmap=True)):
        assert got["e"].shape == (0, 3) and got["f"].shape == (2, 0) and torch.equal(got["w"], torch.ones(4))
