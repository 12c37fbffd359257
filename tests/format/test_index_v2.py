"""Index format v2: golden bytes, round trips with v1 objects, and every untrusted-input rule."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from shardsafe.errors import CorruptCheckpointError
from shardsafe.format.index import v2 as index_v2
from shardsafe.format.checksum import crc32c
from shardsafe.format.index.container import MAGIC
from shardsafe.format.index.chunk_table import Split
from shardsafe.format.index.objects import Index, TensorEntry
from shardsafe.format.index.rows import ChunkEntry, FileEntry
from shardsafe.format.index.versions import decode_index, encode_index

from v2_forge import seal_v2, split_v2

F0, F1 = "data-r00000-000.safetensors", "data-r00001-000.safetensors"

INDEX = Index(
    tree={"t": "dict", "k": ["w", "g", "s", "step"], "v": [
        {"t": "tensor", "id": 0}, {"t": "tensor", "id": 1}, {"t": "tensor", "id": 2},
        {"t": "int", "v": 7}]},
    tensors=(
        # split along dim 0 over both files: stored as one rule
        TensorEntry(("w",), "torch", "float32", (4, 2), (
            ChunkEntry(F0, 4096, 16, (0, 0), (2, 2), (0x11111111,)),
            ChunkEntry(F1, 4096, 16, (2, 0), (2, 2), (0x22222222,)))),
        # a 2 x 2 grid: stored in general form
        TensorEntry(("g",), "numpy", "int64", (2, 2), tuple(
            ChunkEntry(F0, 4112 + 8 * i, 8, (i // 2, i % 2), (1, 1), (0x30 + i,)) for i in range(4))),
        TensorEntry(("s",), "torch", "float16", (), (ChunkEntry(F1, 4112, 2, (), (), (0xABCDEF01,)),)),
    ),
    files=(FileEntry(F0, 4144, 4096, 0), FileEntry(F1, 4114, 4096, 1)),
    block_size=16 << 20, world_size=2, created=1.5, library="shardsafe test", metadata={"step": 7})

GOLDEN_JSON = (
    b'{"library":"shardsafe test","created":1.5,"world_size":2,"checksum":"crc32c",'
    b'"block_size":16777216,"metadata":{"step":7},'
    b'"files":[{"name":"data-r00000-000.safetensors","size":4144,"data_start":4096,"rank":0},'
    b'{"name":"data-r00001-000.safetensors","size":4114,"data_start":4096,"rank":1}],'
    b'"tensors":[{"key":["w"],"kind":"torch","dtype":"float32","shape":[4,2],"chunks":2,'
    b'"split":[0,2,0,1]},'
    b'{"key":["g"],"kind":"numpy","dtype":"int64","shape":[2,2],"chunks":4},'
    b'{"key":["s"],"kind":"torch","dtype":"float16","shape":[],"chunks":1}],'
    b'"columns":{"offset":["<u2",7],"file":["<u1",5],"pos":["<u1",8],"extent":["<u1",8],'
    b'"crc32c":["<u4",7]},'
    b'"tree":{"t":"dict","k":["w","g","s","step"],"v":[{"t":"tensor","id":0},'
    b'{"t":"tensor","id":1},{"t":"tensor","id":2},{"t":"int","v":7}]}}'
)


def _golden() -> bytes:
    import struct

    js = GOLDEN_JSON + b"\0" * (-len(GOLDEN_JSON) % 8)
    cols = (
        struct.pack("<7H", 4096, 4096, 4112, 4120, 4128, 4136, 4112) + b"\0" * 2
        + bytes([0, 0, 0, 0, 1]) + b"\0" * 3
        + bytes([0, 0, 0, 1, 1, 0, 1, 1])
        + bytes([1] * 8)
        + struct.pack("<7I", 0x11111111, 0x22222222, 0x30, 0x31, 0x32, 0x33, 0xABCDEF01) + b"\0" * 4)
    head = struct.pack("<8sIIQQ", b"SSAFEIDX", 2, 32, len(GOLDEN_JSON), len(cols)) + js + cols
    return head + struct.pack("<I", crc32c(head))


def test_golden_bytes() -> None:
    assert encode_index(INDEX, version=2) == _golden()


def test_golden_crc_is_pinned() -> None:
    # the last four bytes are the CRC32C of the rest; pinned so a CRC change cannot slip by
    assert _golden()[-4:].hex() == GOLDEN_CRC


GOLDEN_CRC = "9bcd172c"


def test_round_trip_through_v1_objects() -> None:
    decoded = decode_index(_golden())
    assert decoded.format_version == 2
    assert dataclasses.replace(decoded, format_version=1) == INDEX
    assert encode_index(decoded) == _golden()  # a v2 index re-encodes as v2 by default
    assert decode_index(encode_index(decoded, version=1)) == dataclasses.replace(decoded, format_version=1)


def test_v1_stays_the_default() -> None:
    assert encode_index(INDEX).startswith(b'{"format_version":1,')


def test_columnar_views() -> None:
    ci = index_v2.decode(_golden())
    ct = ci.chunks
    assert ct.splits == (Split(0, 2, 0, 1), None, None)
    w = ct.tensor_chunks(0)
    assert w.pos.tolist() == [[0, 0], [2, 0]] and w.extent.tolist() == [[2, 2], [2, 2]]
    assert w.file.tolist() == [0, 1] and w.nbytes.tolist() == [16, 16]
    g = ct.tensor_chunks(1)
    assert g.pos.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]] and g.nbytes.tolist() == [8] * 4
    s = ct.tensor_chunks(2)
    assert s.pos.shape == (1, 0) and s.nbytes.tolist() == [2]
    assert ct.chunk_checksums(6).tolist() == [0xABCDEF01]
    assert index_v2.decode(index_v2.encode(ci)) == ci


def test_multi_block_chunks_keep_their_checksums() -> None:
    big = dataclasses.replace(INDEX, block_size=4096, tensors=(
        TensorEntry(("w",), "torch", "float32", (4, 2048), (
            ChunkEntry(F0, 4096, 16384, (0, 0), (2, 2048), (1, 2, 3, 4)),
            ChunkEntry(F1, 4096, 16384, (2, 0), (2, 2048), (5, 6, 7, 8)))),) + INDEX.tensors[1:],
        files=(FileEntry(F0, 4096 + 16384 + 64, 4096, 0), FileEntry(F1, 4096 + 16384 + 2, 4096, 1)))
    big = dataclasses.replace(big, tensors=(big.tensors[0], dataclasses.replace(
        big.tensors[1], chunks=tuple(dataclasses.replace(c, offset=c.offset + 16384 - 16)
                                     for c in big.tensors[1].chunks)),
        TensorEntry(("s",), "torch", "float16", (), (ChunkEntry(F1, 4096 + 16384, 2, (), (), (9,)),))))
    raw = encode_index(big, version=2)
    assert dataclasses.replace(decode_index(raw), format_version=1) == big
    js, cols = split_v2(raw)
    cols["crc32c"] = cols["crc32c"][:-1]
    with pytest.raises(CorruptCheckpointError, match="checksums"):
        decode_index(seal_v2(js, cols))


# ----------------------------------------------------------------------------- forgeries

Edit = Callable[[dict[str, Any], dict[str, np.ndarray]], None]


def _set(col: str, i: int, v: int) -> Edit:
    def fn(js: dict[str, Any], cols: dict[str, np.ndarray]) -> None:
        cols[col] = cols[col].copy()
        cols[col][i] = v
    return fn


def _tensor(t: int, member: str, v: Any) -> Edit:
    def fn(js: dict[str, Any], cols: dict[str, np.ndarray]) -> None:
        js["tensors"][t][member] = v
    return fn


def _drop(col: str) -> Edit:
    def fn(js: dict[str, Any], cols: dict[str, np.ndarray]) -> None:
        cols[col] = cols[col][:-1]
    return fn


FORGERIES: dict[str, tuple[Edit, str]] = {
    "general file id out of range": (_set("file", 0, 2), "file id 2"),
    "split names a missing file": (_tensor(0, "split", [0, 2, 1, 1]), "beyond the 2 listed"),
    "negative split stride": (_tensor(0, "split", [0, 2, 1, -1]), "split of w"),
    "split step does not match the count": (_tensor(0, "split", [0, 1, 0, 1]), "needs 4 chunks"),
    "split dim out of range": (_tensor(0, "split", [2, 2, 0, 1]), "does not fit"),
    "split step zero": (_tensor(0, "split", [0, 0, 0, 1]), "does not fit"),
    "offset inside the header": (_set("offset", 0, 100), "outside the data section"),
    "offset past the end": (_set("offset", 1, 4110), "outside the data section"),
    "overlapping byte ranges": (_set("offset", 3, 4116), "overlaps"),
    "overlapping chunks": (_set("pos", 4, 0), "overlap"),
    "gap: a chunk is too small": (_set("extent", 7, 0), "elements"),
    "chunk outside the shape": (_set("pos", 7, 2), "outside shape"),
    "huge extent": (_set("extent", 0, 1 << 62), "outside shape"),
    "value above 2^62": (_set("offset", 2, (1 << 62) + 1), r"above 2\^62"),
    "chunk count disagrees with the columns": (_tensor(1, "chunks", 3), "holds"),
    "missing checksum": (_drop("crc32c"), "checksums"),
    "missing offset": (_drop("offset"), "offset holds"),
    "bad split shape": (_tensor(0, "split", [0, 2, 0]), "split must be"),
    "boolean count": (_tensor(1, "chunks", True), "chunk count"),
    "unknown dtype": (_tensor(1, "dtype", "float128"), "unknown dtype"),
    "too many dims": (_tensor(2, "shape", [1] * 65), "at most 64"),
}


@pytest.mark.parametrize("case", sorted(FORGERIES))
def test_forged_indexes_are_rejected(case: str) -> None:
    edit, message = FORGERIES[case]
    js, cols = split_v2(_golden())
    assert index_v2.decode(seal_v2(js, cols)) == index_v2.decode(_golden())  # the sealer is faithful
    edit(js, cols)
    with pytest.raises(CorruptCheckpointError, match=message):
        decode_index(seal_v2(js, cols))


def _json_edit(fn: Callable[[dict[str, Any]], None], fix_counts: bool = True) -> bytes:
    js, cols = split_v2(_golden())
    js = copy.deepcopy(js)
    fn(js)
    return seal_v2(js, cols, widths={n: w for n, (w, _) in js["columns"].items()}, fix_counts=fix_counts)


@pytest.mark.parametrize("fn,message", [
    (lambda js: js["columns"].__setitem__("crc32c", ["<u8", 7]), "bad descriptor"),
    (lambda js: js["columns"].__setitem__("pos", ["<i8", 8]), "bad descriptor"),
    (lambda js: js["columns"].__setitem__("file", ["<u1", 4]), "holds 4 values"),
    (lambda js: js["columns"].pop("extent"), "exactly"),
    (lambda js: js["files"].append(dict(js["files"][0])), "duplicate"),
    (lambda js: js["files"][0].__setitem__("name", "../x"), "no paths"),
    (lambda js: js["tree"]["v"].__setitem__(2, {"t": "int", "v": 1}), "exactly once"),
    (lambda js: js.__setitem__("checksum", "md5"), "checksum algorithm"),
    (lambda js: js.__setitem__("block_size", 10), "block_size"),
    # key paths: strings and integers bare, other keys as key nodes (section 6)
    (lambda js: js["tensors"][0].__setitem__("key", [True]), "tensor key"),
    (lambda js: js["tensors"][0].__setitem__("key", [1.5]), "tensor key"),
    (lambda js: js["tensors"][0].__setitem__("key", [None]), "tensor key"),
    (lambda js: js["tensors"][0].__setitem__("key", [["w"]]), "tensor key"),
    (lambda js: js["tensors"][0].__setitem__("key", [{"t": "str", "v": "w"}]), "tensor key"),
    (lambda js: js["tensors"][0].__setitem__("key", [{"t": "pickle", "v": "gASV"}]), "tensor key"),
    (lambda js: js["tensors"][0].__setitem__("key", [{"t": "list", "v": []}]), "tensor key"),
    (lambda js: js["tensors"][0].__setitem__("key", "w"), "key list"),
    (lambda js: js["tensors"][0].__setitem__("key", [{"t": "none"}]), "keyed"),  # valid, but not the tree's
])
def test_forged_json_part_is_rejected(fn: Callable[[dict[str, Any]], None], message: str) -> None:
    with pytest.raises(CorruptCheckpointError, match=message):
        decode_index(_json_edit(fn, fix_counts=False))


def test_every_truncation_and_bit_flip_is_caught() -> None:
    good = _golden()
    for n in range(len(good)):
        with pytest.raises(CorruptCheckpointError):
            index_v2.decode(good[:n] if good[:n].startswith(MAGIC) else MAGIC + good[8:n])
    for i in range(0, len(good), 7):
        flipped = bytearray(good)
        flipped[i] ^= 0x40
        with pytest.raises(CorruptCheckpointError):
            decode_index(bytes(flipped))


def test_nonzero_padding_is_rejected() -> None:
    good = bytearray(_golden())
    jlen = int.from_bytes(good[16:24], "little")
    good[32 + jlen] = 1  # the first JSON padding byte
    body = bytes(good[:-4])
    with pytest.raises(CorruptCheckpointError, match="padding"):
        decode_index(body + crc32c(body).to_bytes(4, "little"))


def test_duplicate_json_members_are_rejected() -> None:
    js, cols = split_v2(_golden())
    raw = seal_v2(js, cols)
    forged = raw.replace(b'"created":1.5', b'"created":1.5,"created":2.5', 1)
    # fix the JSON length and the CRC by hand: the sealer cannot write duplicates
    import struct
    jlen = int.from_bytes(raw[16:24], "little") + len(b',"created":2.5')
    text = forged[32 : 32 + jlen]
    rest = raw[32 + int.from_bytes(raw[16:24], "little"):]
    rest = rest.lstrip(b"\0")
    section = raw[len(raw) - 4 - int.from_bytes(raw[24:32], "little"):-4]
    out = struct.pack("<8sIIQQ", b"SSAFEIDX", 2, 32, jlen, len(section)) + text + b"\0" * (-jlen % 8) + section
    with pytest.raises(CorruptCheckpointError, match="duplicate"):
        decode_index(out + crc32c(out).to_bytes(4, "little"))
    assert rest  # the section followed the JSON part


def test_two_chunks_of_a_scalar_are_rejected() -> None:
    js, cols = split_v2(_golden())
    js["tensors"][2]["chunks"] = 2
    cols["offset"] = np.append(cols["offset"], 4112)
    cols["file"] = np.append(cols["file"], 0)
    cols["crc32c"] = np.append(cols["crc32c"], 5).astype(np.uint32)
    with pytest.raises(CorruptCheckpointError, match="scalar overlap"):
        decode_index(seal_v2(js, cols))


def test_empty_tensors_and_empty_chunks() -> None:
    empty = dataclasses.replace(INDEX, tensors=INDEX.tensors + (
        TensorEntry(("e",), "torch", "float32", (0, 3), (ChunkEntry(F0, 0, 0, (0, 0), (0, 3), (0,)),)),
        TensorEntry(("z",), "torch", "float32", (0,), ())),
        tree={"t": "dict", "k": ["w", "g", "s", "step", "e", "z"], "v": INDEX.tree["v"] + [
            {"t": "tensor", "id": 3}, {"t": "tensor", "id": 4}]})
    assert dataclasses.replace(decode_index(encode_index(empty, version=2)), format_version=1) == empty
