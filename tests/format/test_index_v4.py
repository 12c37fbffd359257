"""Index format version 4 (the index in parts): it holds exactly what version 3 holds; a
rank reading the global part and the parts ``parts_for`` names gets exactly the chunks
its regions overlap; and every forged header, directory, global part or part is refused
with a CorruptCheckpointError naming the problem."""

from __future__ import annotations

import dataclasses
import itertools
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_index_v2_property import indexes
from v4_forge import seal_v4, split_v4

import shardsafe
from shardsafe.errors import CorruptCheckpointError
from shardsafe.format.index import v3, v4
from shardsafe.format.index.objects import Index, from_columnar, to_columnar
from shardsafe.format.index.rows import ChunkEntry, FileEntry
from shardsafe.format.index.v4_global import GlobalPart
from shardsafe.format.index.v4_layout import Header
from shardsafe.format.index.versions import decode, decode_index, encode_index
from shardsafe.harness.synthetic_job import build_index

F0, F1, F2 = "d0", "d1", "d2"


def _index() -> Index:
    """w: float32 [6, 2] split over three files; g: int64 [2, 2] as a 2 x 2 grid over files
    0 and 1 (general); s: a scalar; e: an empty tensor; b: bfloat16 [3] (both in file 1);
    r: int8 [4] whole in file 2."""
    tensors = (
        shardsafe.format.index.objects.TensorEntry(("w",), "torch", "float32", (6, 2), tuple(
            ChunkEntry(f"d{r}", 4096, 16, (2 * r, 0), (2, 2), (r + 1,)) for r in range(3))),
        shardsafe.format.index.objects.TensorEntry(("g", 0), "numpy", "int64", (2, 2), tuple(
            ChunkEntry(f"d{i % 2}", 4112 + 8 * (i // 2), 8, (i // 2, i % 2), (1, 1), (10 + i,)) for i in range(4))),
        shardsafe.format.index.objects.TensorEntry(("s",), "torch", "float16", (), (ChunkEntry(F1, 4128, 2, (), (), (5,)),)),
        shardsafe.format.index.objects.TensorEntry(("e",), "torch", "float32", (0, 3),
                                                   (ChunkEntry(F1, 4130, 0, (0, 0), (0, 3), (0,)),)),
        shardsafe.format.index.objects.TensorEntry(("b",), "torch", "bfloat16", (3,), (ChunkEntry(F1, 4130, 6, (0,), (3,), (6,)),)),
        shardsafe.format.index.objects.TensorEntry(("r",), "torch", "int8", (4,), (ChunkEntry(F2, 4112, 4, (0,), (4,), (7,)),)),
    )
    tree = {"t": "dict", "k": ["w", "g", "s", "e", "b", "r"], "v": [
        {"t": "tensor", "id": 0}, {"t": "list", "v": [{"t": "tensor", "id": 1}]}, {"t": "tensor", "id": 2},
        {"t": "tensor", "id": 3}, {"t": "tensor", "id": 4}, {"t": "tensor", "id": 5}]}
    files = (FileEntry(F0, 4128, 4096, 0), FileEntry(F1, 4136, 4096, 1), FileEntry(F2, 4116, 4096, 2))
    return Index(tree=tree, tensors=tensors, files=files, block_size=4096, world_size=3, metadata={"m": 1})


def _regions(index: Index, world: int, rank: int) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """Rank ``rank``'s dim-0 shard of every tensor when ``world`` ranks share them (FSDP)."""
    out = []
    for t, e in enumerate(index.tensors):
        if not e.shape:
            out.append((t, (), ()))
            continue
        q = -(-e.shape[0] // world)
        lo = min(rank * q, e.shape[0])
        out.append((t, (lo,) + (0,) * (len(e.shape) - 1), (min(lo + q, e.shape[0]) - lo,) + tuple(e.shape[1:])))
    return out


def _read_parts(data: bytes, g: GlobalPart, parts: list[int]) -> dict[int, tuple[bytes, tuple[int, int, int]]]:
    """What a rank reads of the index for ``parts``: their directory entries, then their bytes."""
    h = g.header
    out = {}
    for k in parts:
        off, n = h.entry_span(k, k)
        (entry,) = h.entries(data[off : off + n], k)
        out[k] = (data[entry[0] : entry[0] + entry[1]], entry)
    return out


def _overlapping(index: Index, t: int, offsets: tuple[int, ...], shape: tuple[int, ...]) -> list[ChunkEntry]:
    if any(s <= 0 for s in shape):
        return []
    return sorted(index.tensors[t].overlapping(offsets, shape), key=lambda c: (c.file, c.offset))


def _check_narrowed(data: bytes, regions: list) -> tuple[GlobalPart, list[int]]:  # noqa: ANN001
    """Narrowing to ``regions`` gives exactly the chunks of the whole index they overlap."""
    whole = decode_index(data)
    g = GlobalPart.decode(data[: Header(data).head_size])
    parts = g.parts_for(regions)
    narrowed = from_columnar(g.narrow(_read_parts(data, g, parts), [t for t, _, _ in regions]), 4)
    for t, offsets, shape in regions:
        assert _overlapping(narrowed, t, offsets, shape) == _overlapping(whole, t, offsets, shape), (t, parts)
    assert {f.name for f in narrowed.files} <= {f.name for f in whole.files}
    return g, parts


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip_holds_what_version_3_holds(compress: bool) -> None:
    index = _index()
    data = v4.encode(to_columnar(index), compress=compress)
    back = decode_index(data)
    assert back.format_version == 4 and back.tensors == index.tensors and back.tree == index.tree
    assert decode(data)[0] == decode(encode_index(index, version=3))[0]
    assert Header(data).codec == int(compress)
    assert encode_index(back, version=4) == v4.encode(to_columnar(index))  # deterministic


def test_parts_are_the_runs_of_one_ranks_files() -> None:
    data = encode_index(_index(), version=4)
    f = split_v4(data)
    assert [p[0]["part"] for p in f.parts] == [0, 1, 2] and f.js["files"] == 3
    assert [[r["name"] for r in p[0]["files"]] for p in f.parts] == [[F0], [F1], [F2]]
    # the global part holds the rows of the tensors stored as one chunk (s, e, b, r) and of
    # their files; the parts those of w (one chunk each) and g (two in d0, two in d1)
    assert f.cols["whole_offset"].tolist() == [4128, 4130, 4130, 4112]
    assert [i for i, _ in f.js["whole_files"]] == [1, 2]
    assert [len(p[1]["offset"]) for p in f.parts] == [3, 3, 1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(indexes(), st.booleans())
def test_any_index_round_trips(index: Index, compress: bool) -> None:
    data = v4.encode(to_columnar(index), compress=compress)
    assert dataclasses.replace(decode_index(data), format_version=1) == index
    assert v3.decode(v3.encode(decode(data)[0])) == decode(data)[0]


def test_the_synthetic_job_and_compressed_chunks_round_trip(tmp_path) -> None:  # noqa: ANN001
    job = build_index(8, 20)
    assert decode(v4.encode(job))[0] == job
    state = {"x": np.arange(40_000, dtype=np.float32), "y": np.zeros(30_000, dtype=np.float64), "n": 3}
    shardsafe.save(state, str(tmp_path / "c"), compression="zstd")
    with open(tmp_path / "c" / "index.json", "rb") as fh:
        coded = decode(fh.read())[0]
    assert coded.chunks.coding is not None and decode(v4.encode(coded))[0] == coded


def test_an_index_without_files_or_tensors() -> None:
    empty = Index(tree={"t": "dict", "k": ["n"], "v": [{"t": "int", "v": 1}]}, tensors=(), files=(),
                  block_size=4096)
    data = encode_index(empty, version=4)
    assert Header(data).parts == 0 and decode_index(data).tree == empty.tree


# ----------------------------------------------------------------------------- reading in parts


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_narrowing_gives_exactly_the_overlapping_chunks(world: int) -> None:
    index = _index()
    data = encode_index(index, version=4)
    for rank in range(world):
        _check_narrowed(data, _regions(index, world, rank))


@pytest.mark.parametrize("ranks,world", [(8, 8), (8, 6), (16, 12), (12, 16)])
def test_same_layout_reads_one_part_and_resharding_a_few(ranks: int, world: int) -> None:
    job = build_index(ranks, 12)
    data = v4.encode(job)
    whole = from_columnar(job, 3)
    for rank in range(world):
        _, parts = _check_narrowed(data, _regions(whole, world, rank))
        if world == ranks:
            assert parts == [rank]  # its own part, nothing else
        else:
            assert len(parts) <= 6 and (not parts or max(parts) - min(parts) < ranks // 2)  # a few, near


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(indexes(), st.data())
def test_any_region_narrows_to_its_chunks(index: Index, data: st.DataObject) -> None:
    if not index.tensors:
        return
    raw = encode_index(index, version=4)
    regions = []
    for t in data.draw(st.lists(st.integers(0, len(index.tensors) - 1), min_size=1, max_size=4, unique=True)):
        shape = index.tensors[t].shape
        lo = tuple(data.draw(st.integers(0, s)) for s in shape)
        regions.append((t, lo, tuple(data.draw(st.integers(0, s - a)) for a, s in zip(lo, shape))))
    _check_narrowed(raw, regions)


def test_a_narrowed_index_lists_only_the_files_it_reads() -> None:
    job = build_index(8, 6)
    data = v4.encode(job)
    g = GlobalPart.decode(data)
    narrowed = g.narrow(_read_parts(data, g, [3]), range(6))
    assert [f.name for f in narrowed.files] == [job.files[3].name]
    assert narrowed.chunks.num_chunks == 6 and narrowed.chunks.splits == (None,) * 6


# ----------------------------------------------------------------------------- forged input


def _forge(edit) -> bytes:  # noqa: ANN001
    f = split_v4(encode_index(_index(), version=4))
    edit(f)
    return seal_v4(f)


def _col(name: str, i: int, value: int):  # noqa: ANN202
    def edit(f):  # noqa: ANN001, ANN202
        f.cols[name] = f.cols[name].copy()
        f.cols[name][i] = value
    return edit


def _part_col(k: int, name: str, i: int, value: int):  # noqa: ANN202
    def edit(f):  # noqa: ANN001, ANN202
        f.parts[k][1][name] = f.parts[k][1][name].copy()
        f.parts[k][1][name][i] = value
    return edit


def _set(where, key, value):  # noqa: ANN001, ANN202
    def edit(f):  # noqa: ANN001, ANN202
        where(f)[key] = value
    return edit


def _drop_part(f) -> None:  # noqa: ANN001
    f.parts.pop()


def _swap_parts(f) -> None:  # noqa: ANN001
    f.parts[0], f.parts[1] = f.parts[1], f.parts[0]


FORGED = [
    ("part count", _drop_part, "part_files lists"),
    ("parts swapped", _swap_parts, "says it is part"),
    ("part number", _set(lambda f: f.parts[1][0], "part", 2), "says it is part"),
    ("part number bool", _set(lambda f: f.parts[0][0], "part", False), "says it is part"),
    ("part files count", _set(lambda f: f.parts[1][0], "files", []), "lists 0 files"),
    ("part file name", _set(lambda f: f.parts[1][0], "files", [{"name": "../x", "size": 4136, "data_start": 4096,
                                                                  "rank": 1}]), "bad data file entry"),
    ("duplicate file across parts", _set(lambda f: f.parts[2][0], "files", [{"name": F0, "size": 4116,
                                                                               "data_start": 4096, "rank": 2}]),
     "duplicate|listed differently"),
    ("part offsets short", lambda f: f.parts[0][1].__setitem__("offset", f.parts[0][1]["offset"][:-1]),
     "column offset"),
    ("part overlap", _part_col(0, "offset", 0, 4112), "overlaps"),
    ("part offset outside", _part_col(1, "offset", 0, 9000), "outside"),
    ("whole offset outside", _col("whole_offset", 3, 9000), "outside"),
    ("whole overlaps a part chunk", _col("whole_offset", 0, 4112), "overlaps"),
    ("whole checksums short", lambda f: f.cols.__setitem__("whole_crc32c", f.cols["whole_crc32c"][:-1]),
     "whole_crc32c"),
    ("whole file row differs", _set(lambda f: f.js, "whole_files", [[1, {"name": F1, "size": 4137,
                                                                         "data_start": 4096, "rank": 1}],
                                                                     [2, {"name": F2, "size": 4116,
                                                                          "data_start": 4096, "rank": 2}]]),
     "listed differently"),
    ("whole files unsorted", lambda f: f.js.__setitem__("whole_files", f.js["whole_files"][::-1]), "ascend"),
    ("whole file id beyond", lambda f: f.js.__setitem__("whole_files", f.js["whole_files"] + [[7, {
        "name": "z", "size": 9, "data_start": 8, "rank": 0}]]), "below the file count"),
    ("part_files total", _col("part_files", 0, 2), "part_files lists"),
    ("part_files zero", lambda f: (f.cols.__setitem__("part_files", np.array([1, 2, 0])), f.parts.append(f.parts[2])),
     "part_files lists"),
    ("general file beyond", _col("file", 0, 3), "names file 3"),
    ("general chunk outside", _col("pos", 0, 2), "outside shape"),
    ("general chunks share a box", _col("pos", 3, 0), "tensor g.0: chunks overlap"),
    ("general chunks leave a gap", _col("extent", 1, 2), "outside shape|hold 5 elements"),
    ("whole_files omits a file", lambda f: f.js.__setitem__("whole_files", f.js["whole_files"][:-1]),
     "its one chunk lies in data file 2, which whole_files does not list"),
    ("whole_files lists an extra file", lambda f: f.js.__setitem__("whole_files", [[0, {
        "name": F0, "size": 4128, "data_start": 4096, "rank": 0}]] + f.js["whole_files"]),
     "whole_files lists data file 0, which holds no tensor stored as one chunk"),
    ("scalar chunk count", _col("chunks", 2, 2), "column|chunks"),
    ("split file beyond", _col("split_file0", 0, 1), "files beyond"),
    ("file count", _set(lambda f: f.js, "files", 4), "part_files lists"),
    ("block size", _set(lambda f: f.js, "block_size", 100), "block_size"),
    ("checksum algorithm", _set(lambda f: f.js, "checksum", "md5"), "checksum algorithm"),
    ("tree drops a tensor", lambda f: f.js["tree"]["v"].__setitem__(5, {"t": "int", "v": 0}), "exactly once"),
    ("codecs without columns", _set(lambda f: f.js, "codecs", ["raw"]), "codecs"),
]


@pytest.mark.parametrize("name,edit,message", FORGED, ids=[f[0] for f in FORGED])
def test_forged_indexes_are_refused(name, edit, message) -> None:  # noqa: ANN001
    data = _forge(edit)
    with pytest.raises(CorruptCheckpointError, match=message):
        decode_index(data)
    with pytest.raises(CorruptCheckpointError, match=message):  # also by a rank that reads every part
        _partial_read(data)


def test_the_forge_reproduces_the_encoder() -> None:
    data = encode_index(_index(), version=4)
    assert decode(seal_v4(split_v4(data)))[0] == decode(data)[0]


def _header(data: bytes, at: int, fmt: str, value: int) -> bytes:
    """``data`` with one header field changed and the header's CRC32C made right again."""
    import struct

    from shardsafe.format.checksum import crc32c

    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    struct.pack_into("<I", out, 60, crc32c(bytes(out[:60])))
    return bytes(out)


HEADER_EDITS = [
    ("version 5", 8, "<I", 5, "format_version 5"),
    ("header size", 12, "<I", 32, "unsupported index header"),
    ("file size", 16, "<Q", 10, "cannot hold"),
    ("file size beyond 1 GiB", 16, "<Q", 1 << 31, "cannot hold"),
    ("global stored", 24, "<Q", 3, "cannot hold|checksum|truncated"),
    ("raw length of a raw part", 32, "<Q", 5, "cannot hold"),
    ("inflation bomb", 48, "<I", 1, "cannot hold|inflate"),
    ("parts", 40, "<Q", 1 << 40, "cannot hold"),
    ("codec", 48, "<I", 7, "codec"),
    ("reserved", 56, "<I", 1, "reserved"),
]


@pytest.mark.parametrize("name,at,fmt,value,message", HEADER_EDITS, ids=[h[0] for h in HEADER_EDITS])
def test_forged_headers_are_refused(name, at, fmt, value, message) -> None:  # noqa: ANN001
    data = encode_index(_index(), version=4)
    if name == "inflation bomb":
        data = _header(data, 32, "<Q", 1 << 29)  # 512 MiB claimed for ~1 KiB stored
    with pytest.raises(CorruptCheckpointError, match=message):
        decode_index(_header(data, at, fmt, value))


def test_a_damaged_directory_entry_or_part_is_caught_when_read() -> None:
    data = bytearray(encode_index(_index(), version=4))
    h = Header(bytes(data))
    g = GlobalPart.decode(bytes(data))
    entry = h.entries(bytes(data[h.directory : h.directory + 16]), 0)[0]
    bad_crc = bytearray(data)
    bad_crc[entry[0] + 5] ^= 1  # a bit of part 0's JSON
    with pytest.raises(CorruptCheckpointError, match="part 0"):
        g.narrow(_read_parts(bytes(bad_crc), g, [0]))
    with pytest.raises(CorruptCheckpointError, match="part 0"):
        decode_index(bytes(bad_crc))
    outside = bytearray(data)
    outside[h.directory : h.directory + 8] = (1 << 40).to_bytes(8, "little")
    with pytest.raises(CorruptCheckpointError, match="outside the parts"):
        h.entries(bytes(outside[h.directory : h.directory + 16]), 0)
    shifted = bytearray(data)  # an entry pointing at the next part: its CRC names part 0
    shifted[h.directory : h.directory + 16] = data[h.directory + 16 : h.directory + 32]
    with pytest.raises(CorruptCheckpointError, match="part 0"):
        g.narrow(_read_parts(bytes(shifted), g, [0]))


# ----------------------------------------------------------------------------- fuzz

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BASE = encode_index(_index(), version=4)
ZBASE = v4.encode(to_columnar(_index()), compress=True)


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from([BASE, ZBASE])))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "truncate", "insert", "word"]))
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif at + 8 <= len(data):
            data[at : at + 8] = draw(st.integers(0, 2**64 - 1)).to_bytes(8, "little")
        if not data:
            break
    if draw(st.booleans()) and len(data) >= 64:  # re-seal the header: the damage must be found elsewhere
        data = bytearray(_header(bytes(data), 16, "<Q", int.from_bytes(data[16:24], "little")))
    return bytes(data)


def _partial_read(data: bytes) -> None:
    """What a rank does: the global part, then the parts every tensor's whole region needs."""
    g = GlobalPart.decode(data)
    regions = [(t, (0,) * len(i.shape), i.shape) for t, i in enumerate(g.infos)]
    parts = g.parts_for(regions)
    h = g.header
    read = {}
    for k in parts:
        off, n = h.entry_span(k, k)
        if off + n > len(data):
            raise CorruptCheckpointError("truncated")
        (entry,) = h.entries(data[off : off + n], k)
        read[k] = (data[entry[0] : entry[0] + entry[1]], entry)
    g.narrow(read)


@FUZZ
@given(damaged())
def test_damaged_indexes_raise_only_corrupt_checkpoint_errors(data: bytes) -> None:
    for read in (decode_index, _partial_read):
        try:
            read(data)
        except CorruptCheckpointError:
            pass


@FUZZ
@given(st.data())
def test_forged_columns_raise_only_corrupt_checkpoint_errors(data: st.DataObject) -> None:
    f = split_v4(BASE)
    sections = [f.cols] + [p[1] for p in f.parts]
    cols = data.draw(st.sampled_from(sections))
    name = data.draw(st.sampled_from(sorted(cols)))
    values = cols[name].astype(np.int64).copy()
    if len(values) and data.draw(st.booleans()):
        values[data.draw(st.integers(0, len(values) - 1))] = data.draw(st.sampled_from([0, 1, 2, 7, 4095, 4096,
                                                                                        2**31, 2**62]))
    else:
        values = values[: data.draw(st.integers(0, len(values)))] if len(values) else np.array([3])
    cols[name] = values.astype(np.uint32 if name.endswith("crc32c") else np.int64)
    forged = seal_v4(f)
    for read in (decode_index, _partial_read):
        try:
            read(forged)
        except CorruptCheckpointError:
            pass


def test_every_single_bit_flip_is_caught() -> None:
    """Without re-sealing, any flipped bit is refused by the full reader (header, global
    part and parts are each covered by a CRC32C, the directory by the parts' own)."""
    for at, bit in itertools.product(range(0, len(BASE), 3), (0, 6)):
        data = bytearray(BASE)
        data[at] ^= 1 << bit
        with pytest.raises(CorruptCheckpointError):
            decode_index(bytes(data))


def test_a_real_save_round_trips_through_version_4() -> None:
    with tempfile.TemporaryDirectory() as d:
        state = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "nested": {"l": [1, np.ones(3, np.uint8)]}}
        shardsafe.save(state, os.path.join(d, "c"))
        with open(os.path.join(d, "c", "index.json"), "rb") as fh:
            index = decode_index(fh.read())
        assert decode_index(encode_index(index, version=4)).tensors == index.tensors


def test_the_fields_of_a_head_are_read_without_its_tensor_tables(tmp_path) -> None:
    """Listing steps reads a step's metadata from the head alone; a damaged head is refused."""
    import torch

    import shardsafe
    from shardsafe.engine.load.index_exchange import read_metadata
    from shardsafe.storage import LocalStorage

    path = str(tmp_path / "c")
    shardsafe.save({f"t{i}": torch.ones(3) for i in range(50)}, path, metadata={"step": 7})
    assert read_metadata(LocalStorage(), path) == {"step": 7}
    index = os.path.join(path, "index.json")
    with open(index, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptCheckpointError):
        read_metadata(LocalStorage(), path)
