"""No index makes a reader allocate more than a small multiple of what it legitimately
describes (docs/FORMAT.md 9.8 and 15.1): forged version 4 indexes whose few stored bytes
claim megabytes (a zlib bomb in the global part, a header claiming 1 GiB, a compressed
JSON of constant values) are refused by every reader within 1 s of CPU time and 256 MiB
of allocations, before they inflate or allocate what they claim. The writer never
writes what readers refuse: it stores such a global part raw, and refuses oversized
metadata."""

from __future__ import annotations

import contextlib
import io
import os
import struct
import time
import tracemalloc
import zlib

import numpy as np
import pytest
import torch

import shardsafe
from shardsafe import CheckpointError, CorruptCheckpointError
from shardsafe.cli import build_parser
from shardsafe.format.checksum import crc32c
from shardsafe.format.index.rules import MAX_METADATA_BYTES
from shardsafe.format.index.v4_layout import Header
from shardsafe.format.index.versions import decode_index
from v4_forge import HEADER, split_v4

LIMIT_BYTES = 256 << 20
LIMIT_CPU = 1.0


def _healthy(tmp_path) -> str:  # noqa: ANN001
    path = str(tmp_path / "ck")
    g = torch.Generator().manual_seed(0)
    shardsafe.save({"w": torch.randn(64, 16, generator=g), "b": torch.arange(9), "step": 4}, path)
    return path


def _with_global_part(path: str, prefix: bytes, zeros: int, raw_len: int | None = None) -> None:
    """Replaces the index's global part by zlib(``prefix`` + ``zeros`` zero bytes), streamed
    (the test never holds the inflated bytes), its header claiming ``raw_len`` (default:
    the true length) inflated bytes; every CRC32C right."""
    index = os.path.join(path, "index.json")
    with open(index, "rb") as f:
        data = f.read()
    z = zlib.compressobj(9)
    out = [z.compress(prefix)]
    piece = bytes(1 << 20)
    for _ in range(zeros >> 20):
        out.append(z.compress(piece))
    out.append(z.compress(bytes(zeros & ((1 << 20) - 1))))
    out.append(z.flush())
    stored = b"".join(out)
    h = Header(data)
    parts = data[h.directory :]  # directory and parts, their offsets moved below
    shift = (64 + len(stored) + (-len(stored) % 8)) - h.directory
    entries = bytearray(parts[: 16 * h.parts])
    for k in range(h.parts):
        off, n, c = struct.unpack_from("<QII", entries, 16 * k)
        struct.pack_into("<QII", entries, 16 * k, off + shift, n, c)
    size = h.file_size + shift
    raw = len(prefix) + zeros if raw_len is None else raw_len
    head = HEADER.pack(b"SSAFEIDX", 4, 64, size, len(stored), raw, h.parts, 1, crc32c(stored), 0, 0)[:60]
    head += struct.pack("<I", crc32c(head))
    with open(index, "wb") as f:
        f.write(head + stored + bytes(-len(stored) % 8) + bytes(entries) + parts[16 * h.parts :])


def _global_part(path: str) -> tuple[dict, bytes]:
    """The healthy index's global part: its JSON object and its column bytes."""
    import json

    data = open(os.path.join(path, "index.json"), "rb").read()
    h = Header(data)
    raw = data[64 : 64 + h.stored]
    raw = zlib.decompress(raw) if h.codec else raw
    (n,) = struct.unpack_from("<Q", raw)
    return json.loads(raw[8 : 8 + n]), raw[8 + n + (-(8 + n) % 8) :]


def _section(js: dict, columns: bytes = b"") -> bytes:
    """A global part's bytes: ``js`` as JSON, then ``columns``."""
    import json

    text = json.dumps(js, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + bytes(-(8 + len(text)) % 8) + columns


def _one_long_column(js: dict, n: int) -> dict:
    """``js`` whose columns are all empty but ``file``, of ``n`` one-byte values: a section
    that holds exactly what it describes, ``n`` + padding zero bytes of columns."""
    return dict(js, columns={c: ["<u4" if c.endswith("crc32c") else "<u1", n if c == "file" else 0]
                             for c in js["columns"]})


def _readers(path: str) -> list:
    target = {"w": torch.zeros(64, 16), "b": torch.zeros(9, dtype=torch.int64), "step": 0}

    def cli(*argv: str) -> None:
        args = build_parser().parse_args(list(argv))
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = args.func(args)
        if code:  # verify reports a damaged checkpoint and exits non-zero
            raise CheckpointError(out.getvalue())

    return [("load in place", lambda: shardsafe.load(path, target)),
            ("load", lambda: shardsafe.load(path)),
            ("verify", lambda: cli("verify", path)),
            ("info", lambda: cli("info", path))]


def _refused_cheaply(path: str, message: str) -> None:
    """Every reader raises a CheckpointError matching ``message`` within the bounds."""
    for name, read in _readers(path):
        tracemalloc.start()
        cpu = time.process_time()
        try:
            with pytest.raises(CheckpointError, match=message):
                read()
            spent = time.process_time() - cpu
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < LIMIT_BYTES, (name, peak)
        assert spent < LIMIT_CPU, (name, spent)


def test_a_zlib_bomb_beyond_the_inflation_bound_is_refused_before_inflating(tmp_path) -> None:
    path = _healthy(tmp_path)
    js, _ = _global_part(path)
    n = 245 << 20  # 238 KB stored, 245 MB inflated, 2 GB once widened to int64
    _with_global_part(path, _section(_one_long_column(js, n)), n)
    assert os.path.getsize(os.path.join(path, "index.json")) < 300_000
    _refused_cheaply(path, "global part cannot hold")


def test_a_column_longer_than_its_tensors_need_is_refused_before_widening(tmp_path) -> None:
    path = _healthy(tmp_path)
    js, _ = _global_part(path)
    n = 48 << 20  # inflates within the bound (64 MiB + 64 x stored): only its count refuses it
    _with_global_part(path, _section(_one_long_column(js, n)), n)
    _refused_cheaply(path, "column kind holds 0 values, the tensor rows need 2|tree")


def test_a_compressed_json_of_constant_values_is_refused_before_parsing(tmp_path) -> None:
    path = _healthy(tmp_path)
    js, columns = _global_part(path)
    js["metadata"] = {"x": [0] * (10 << 20)}  # 10 M values in 20 MB of JSON, ~20 KB stored
    _with_global_part(path, _section(js, columns), 0)
    _refused_cheaply(path, "JSON holds up to .* values, more than its .* stored bytes may describe")


@pytest.mark.parametrize("claim", ["file", "global part"])
def test_a_header_claiming_a_gigabyte_is_refused_before_allocating_it(tmp_path, claim) -> None:
    path = str(tmp_path / "ck")
    shardsafe.save({"w": torch.ones(3)}, path)
    index = os.path.join(path, "index.json")
    data = bytearray(open(index, "rb").read())
    assert len(data) < 1000
    fields = list(HEADER.unpack_from(data))
    fields[3] = 1 << 30  # S: the whole file
    if claim == "global part":
        fields[4] = fields[5] = (1 << 30) - 4096  # G = R: a raw global part of nearly 1 GiB
        fields[7] = 0
    head = HEADER.pack(*fields[:10], 0)[:60]
    data[:64] = head + struct.pack("<I", crc32c(head))
    open(index, "wb").write(bytes(data))
    readers = [("load", lambda: shardsafe.load(path))]
    if claim == "global part":  # a reader of parts needs the global part, never the file's size
        readers.append(("load in place", lambda: shardsafe.load(path, {"w": torch.zeros(3)})))
    for name, read in readers:
        tracemalloc.start()
        try:
            with pytest.raises(CorruptCheckpointError, match="truncated"):
                read()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 16 << 20, (name, peak)


def test_a_global_part_that_compresses_beyond_the_bounds_is_written_raw(tmp_path) -> None:
    path = str(tmp_path / "ck")
    state = {"w": torch.ones(3), "order": [0] * 1_500_000}  # a legitimate state: 1.5 M values that compress ~1000x
    shardsafe.save(state, path)
    data = open(os.path.join(path, "index.json"), "rb").read()
    h = Header(data)
    assert h.codec == 0 and h.raw == h.stored  # stored raw: readers' bounds hold for it
    assert decode_index(data).tensors[0].key == ("w",)
    assert shardsafe.load(path)["order"] == state["order"]


def test_metadata_beyond_the_limit_is_refused_by_the_save(tmp_path) -> None:
    big = {"x": [0] * (MAX_METADATA_BYTES // 2 + 1)}
    with pytest.raises((ValueError, CheckpointError), match="metadata takes .* bytes as JSON"):
        shardsafe.save({"w": torch.ones(3)}, str(tmp_path / "ck"), metadata=big)
    assert not os.path.exists(tmp_path / "ck" / "index.json")
    assert np.__name__  # numpy imported for the readers' columns
