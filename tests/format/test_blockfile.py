"""Compressed chunks in the index (v2 coding columns) and the per-block decoder: round trips,
and forged indexes and streams refused with a clear CorruptCheckpointError."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard

from shardsafe.errors import CorruptCheckpointError
from shardsafe.format import codec
from shardsafe.format.block_verify import decode_block
from shardsafe.format.blockfile import DATA_START, MAX_CODED_BLOCK, code_block
from shardsafe.format.checksum import crc32c
from shardsafe.format.index.objects import Index, TensorEntry
from shardsafe.format.index.rows import ChunkEntry, FileEntry
from shardsafe.format.index.versions import decode_index, encode_index
from shardsafe.format.index.rows import StoredBlocks

from v2_forge import seal_v2, split_v2

BS = 4096  # the smallest block size: several blocks per small chunk
BLOCKS, ST = "data-r00000-000.blocks", "data-r00000-000.safetensors"


def _chunk(raw: bytes, dtype: str, offset: int, shape: tuple[int, ...]) -> tuple[ChunkEntry, bytes]:
    """A compressed chunk of ``raw`` at ``offset`` of the block file, and its stored bytes."""
    coded = [code_block(memoryview(raw)[i : i + BS], dtype, "auto") for i in range(0, len(raw), BS)]
    stored = StoredBlocks(tuple(c.codec for c in coded), tuple(len(c.data) for c in coded),
                          tuple(c.stored_crc for c in coded))
    entry = ChunkEntry(BLOCKS, offset, len(raw), (0,) * len(shape), shape,
                       tuple(c.raw_crc for c in coded), stored)
    return entry, b"".join(bytes(c.data) for c in coded)


def _index() -> tuple[Index, bytes, bytes]:
    """An index of a bf16 tensor compressed over 3 blocks plus a raw tensor, and the two
    raw byte strings."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(5000).astype(np.float32) * 0.02).view(np.uint32) >> 16
    raw_w = w.astype(np.uint16).tobytes()  # bf16 bit patterns, 10,000 bytes = 3 blocks
    raw_s = np.arange(4, dtype=np.float32).tobytes()
    cw, stored = _chunk(raw_w, "bfloat16", DATA_START, (5000,))
    cs = ChunkEntry(ST, 4096, 16, (0,), (4,), (crc32c(raw_s),))
    index = Index(
        tree={"t": "dict", "k": ["w", "s"], "v": [{"t": "tensor", "id": 0}, {"t": "tensor", "id": 1}]},
        tensors=(TensorEntry(("w",), "torch", "bfloat16", (5000,), (cw,)),
                 TensorEntry(("s",), "torch", "float32", (4,), (cs,))),
        files=(FileEntry(ST, 4096 + 16, 4096, 0), FileEntry(BLOCKS, DATA_START + len(stored), DATA_START, 0)),
        block_size=BS)
    return index, raw_w, stored


def test_compressed_chunk_round_trips_through_v2() -> None:
    index, _, stored = _index()
    c = index.tensors[0].chunks[0]
    assert len(c.checksums) == 3 and c.stored is not None and c.stored.nbytes == len(stored)
    assert set(c.stored.codecs) - {"raw"}, "the bf16 blocks should compress"
    back = decode_index(encode_index(index, version=2))
    assert back.tensors[0].chunks[0] == c
    assert back.tensors[1].chunks[0].stored is None
    assert back.table is not None and back.table.coding is not None


def test_uncompressed_index_has_no_coding_columns() -> None:
    index, _, _ = _index()
    plain = Index(tree=index.tree, tensors=(index.tensors[1], TensorEntry(("w",), "torch", "float32", (0,), (
        ChunkEntry(ST, 4096, 0, (0,), (0,), (0,)),))), files=index.files[:1], block_size=BS)
    js, cols = split_v2(encode_index(Index(tree={"t": "dict", "k": ["s"], "v": [{"t": "tensor", "id": 0}]},
                                           tensors=plain.tensors[:1], files=plain.files, block_size=BS),
                                     version=2))
    assert "codecs" not in js and "codec" not in js["columns"]


def test_version_1_cannot_hold_compressed_chunks() -> None:
    index, _, _ = _index()
    with pytest.raises(ValueError, match="version 2"):
        encode_index(index, version=1)


def _forged(edit) -> bytes:  # noqa: ANN001 - edit(js, cols) changes them in place
    index, _, _ = _index()
    js, cols = split_v2(encode_index(index, version=2))
    edit(js, cols)
    return seal_v2(js, cols)


def _set(col: str, i: int, v: int):  # noqa: ANN202
    def edit(js, cols) -> None:  # noqa: ANN001
        cols[col] = cols[col].copy()
        cols[col][i] = v
    return edit


@pytest.mark.parametrize("edit, message", [
    (_set("stored", 0, 4097), "stored bytes"),  # more than the block's raw size: absurd
    (_set("stored", 1, 0), "stored bytes"),
    (_set("codec", 2, 9), "names codec"),
    (lambda js, cols: js.update(codecs=["raw", "zstd", "lz77"]), "unknown or repeated codec"),
    (lambda js, cols: js.update(codecs=["raw", "raw", "planes16"]), "unknown or repeated codec"),
    (lambda js, cols: js.update(codecs="zstd"), "codecs must be a list"),
    (lambda js, cols: [cols.pop(n) for n in ("codec", "stored", "stored_crc32c")], "without the coding"),
    (lambda js, cols: cols.update(stored=cols["stored"][:2]), "coding columns hold 4/2/4 values"),
    # a compressed chunk in the safetensors file (data_start 4096), not in a block file
    (lambda js, cols: js["files"][1].update(data_start=4096, size=4096 + js["files"][1]["size"]),
     "not a block file"),
    # the chunk's stored blocks end past the end of the file
    (lambda js, cols: js["files"][1].update(size=js["files"][1]["size"] - 1), "outside"),
])
def test_forged_coding_is_refused(edit, message) -> None:
    data = _forged(edit)
    with pytest.raises(CorruptCheckpointError, match=message) as e:
        decode_index(data)
    assert e.value.file == "index.json"


def test_compressed_chunks_need_a_bounded_block_size() -> None:
    raw = b"\1" * 4096
    payload = zstandard.ZstdCompressor().compress(raw)
    index = Index(tree={"t": "dict", "k": ["w"], "v": [{"t": "tensor", "id": 0}]},
                  tensors=(TensorEntry(("w",), "torch", "uint8", (4096,), (_zstd_chunk(payload, raw),)),),
                  files=(FileEntry(BLOCKS, DATA_START + len(payload), DATA_START, 0),),
                  block_size=MAX_CODED_BLOCK * 2)
    with pytest.raises(CorruptCheckpointError, match="block_size"):
        decode_index(encode_index(index, version=2))
    decode_index(encode_index(Index(tree=index.tree, tensors=index.tensors, files=index.files,
                                    block_size=MAX_CODED_BLOCK), version=2))


def test_raw_blocks_must_store_their_raw_size_and_checksum() -> None:
    index, _, _ = _index()
    js, cols = split_v2(encode_index(index, version=2))
    raw = js["codecs"].index("raw")
    last = int(np.flatnonzero(cols["codec"] == raw)[-1])  # the raw tensor's block
    for col, v in (("stored", int(cols["stored"][last]) + 1), ("stored_crc32c", 0x1234)):
        c = {k: a.copy() for k, a in cols.items()}
        c[col][last] = v
        with pytest.raises(CorruptCheckpointError, match="stored bytes"):
            decode_index(seal_v2(js, c))


def _decode(c: ChunkEntry, j: int, stored: bytes) -> bytes:
    out = bytearray(min(BS, c.nbytes - j * BS))
    decode_block(c, j, memoryview(stored), memoryview(out), key="w")
    return bytes(out)


def test_decode_block_checks_stored_bytes_before_and_raw_bytes_after() -> None:
    index, raw, stored = _index()
    c = index.tensors[0].chunks[0]
    starts = c.stored.starts
    got = b"".join(_decode(c, j, stored[s : s + n]) for j, (s, n) in enumerate(zip(starts, c.stored.sizes)))
    assert got == raw
    block = bytearray(stored[starts[0] : starts[0] + c.stored.sizes[0]])
    block[len(block) // 2] ^= 1
    with pytest.raises(CorruptCheckpointError, match="stored checksum mismatch in block 0") as e:
        _decode(c, 0, bytes(block))
    assert (e.value.file, e.value.key) == (BLOCKS, "w")


def _zstd_chunk(payload: bytes, raw: bytes) -> ChunkEntry:
    """A one-block zstd chunk whose stored checksum matches ``payload`` (a forged stream)
    and whose raw checksum is that of ``raw``."""
    return ChunkEntry(BLOCKS, DATA_START, len(raw), (0,), (len(raw),), (crc32c(raw),),
                      StoredBlocks(("zstd",), (len(payload),), (crc32c(payload),)))


@pytest.mark.parametrize("payload", [
    zstandard.ZstdCompressor().compress(b"\1" * 100),  # decodes to fewer bytes than declared
    zstandard.ZstdCompressor().compress(b"\1" * 100_000),  # to far more (a bomb): bounded
    zstandard.ZstdCompressor(write_content_size=False).compress(b"\1" * 5000),  # size unknown, too long
    b"\x28\xb5\x2f\xfd garbage",  # a frame header and nonsense
    b"",
])
def test_forged_streams_are_refused_in_bounded_memory(payload) -> None:
    raw = b"\1" * 4096
    with pytest.raises(CorruptCheckpointError, match="cannot decode block 0") as e:
        _decode(_zstd_chunk(payload, raw), 0, payload)
    assert (e.value.file, e.value.key) == (BLOCKS, "w")


def test_stream_that_decodes_to_other_bytes_fails_the_raw_checksum() -> None:
    raw = b"\1" * 4096
    payload = zstandard.ZstdCompressor().compress(b"\2" * 4096)
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch in block 0.*after decoding"):
        _decode(_zstd_chunk(payload, raw), 0, payload)


def test_unknown_codec_name_in_a_chunk_is_refused_by_the_decoder() -> None:
    raw = b"\1" * 4096
    payload = zstandard.ZstdCompressor().compress(raw)
    c = ChunkEntry(BLOCKS, DATA_START, len(raw), (0,), (len(raw),), (crc32c(raw),),
                   StoredBlocks(("lz4",), (len(payload),), (crc32c(payload),)))
    with pytest.raises(CorruptCheckpointError, match="cannot decode"):
        _decode(c, 0, payload)


def test_code_block_stores_incompressible_blocks_raw() -> None:
    raw = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    b = code_block(memoryview(raw), "uint8", "zstd")
    assert b.codec == codec.RAW and bytes(b.data) == raw and b.raw_crc == b.stored_crc == crc32c(raw)
