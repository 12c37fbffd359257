"""The block verifier: raw blocks in memory, and a stream of a file's bytes in pieces of
any size checking raw and compressed blocks alike, naming the first bad block of each."""

from __future__ import annotations

import numpy as np
import pytest

from shardsafe.errors import CorruptCheckpointError
from shardsafe.format.block_verify import BlockStream, chunk_spans, verify_blocks
from shardsafe.format.blockfile import code_block
from shardsafe.format.checksum import blocks, crc32c
from shardsafe.format.index.rows import ChunkEntry, StoredBlocks

BS = 4096


def _sums(data: bytes, block: int) -> list[int]:
    return [crc32c(b) for b in blocks(memoryview(data), block)]


def test_verify_blocks_names_the_first_bad_block_with_its_file_bytes() -> None:
    data = bytearray(bytes(range(256)) * 40)  # 10240 bytes: blocks of 4096, 4096, 2048
    sums = _sums(bytes(data), 4096)
    verify_blocks(memoryview(bytes(data)), 4096, sums, offset=8192, file="f", key="k")  # intact
    data[5000] ^= 1  # block 1
    with pytest.raises(CorruptCheckpointError, match=r"block 1 \(file bytes 12288-16384\)") as info:
        verify_blocks(memoryview(bytes(data)), 4096, sums, offset=8192, file="f", key="k")
    assert (info.value.file, info.value.key) == ("f", "k")
    # a slice starting at block 1 is numbered and checked from there
    tail = memoryview(bytes(data))[4096:]
    with pytest.raises(CorruptCheckpointError, match=r"block 1 \(file bytes 4096-8192\)"):
        verify_blocks(tail, 4096, sums, 1, offset=4096)
    verify_blocks(memoryview(bytes(data))[8192:], 4096, sums, 2)  # block 2 is intact


def test_verify_blocks_checks_an_empty_chunk_against_its_one_checksum() -> None:
    verify_blocks(memoryview(b""), 4096, [crc32c(b"")])
    with pytest.raises(CorruptCheckpointError, match="block 0"):
        verify_blocks(memoryview(b""), 4096, [crc32c(b"x")])


def _file() -> tuple[bytes, list]:
    """A file of a 100-byte header, a raw chunk of 2.5 blocks, an empty chunk, padding, and
    a compressed chunk of 3 blocks; its bytes and every block span."""
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, 10_240, dtype=np.uint8).tobytes()
    bf16 = ((rng.standard_normal(6000).astype(np.float32) * 0.02).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    coded = [code_block(memoryview(bf16)[i : i + BS], "bfloat16", "auto") for i in range(0, len(bf16), BS)]
    stored = b"".join(bytes(c.data) for c in coded)
    assert len(stored) < len(bf16)
    head, pad = b"h" * 100, b"p" * 7
    a = ChunkEntry("f", len(head), len(raw), (0,), (len(raw),), tuple(_sums(raw, BS)))
    empty = ChunkEntry("f", len(head) + len(raw), 0, (0,), (0,), (crc32c(b""),))
    off = len(head) + len(raw) + len(pad)
    c = ChunkEntry("f", off, len(bf16), (0,), (6000,), tuple(x.raw_crc for x in coded),
                   StoredBlocks(tuple(x.codec for x in coded), tuple(len(x.data) for x in coded),
                                tuple(x.stored_crc for x in coded)))
    spans = chunk_spans(a, BS, "a") + chunk_spans(empty, BS, "e") + chunk_spans(c, BS, "c")
    return head + raw + pad + stored, spans


def _stream(data: bytes, spans: list, piece: int) -> tuple[list[CorruptCheckpointError], BlockStream]:
    s = BlockStream(reversed(spans), BS)  # any order
    bad = []
    for pos in range(0, len(data), piece):
        bad += s.feed(pos, memoryview(data)[pos : pos + piece])
    return bad, s


@pytest.mark.parametrize("piece", [1, 7, 100, 4096, 5000, 1 << 20])
def test_a_stream_in_pieces_of_any_size_checks_every_block(piece) -> None:  # noqa: ANN001
    data, spans = _file()
    assert len(spans) == 3 + 1 + 3
    bad, s = _stream(data, spans, piece)
    assert bad == [] and s.missing() == []


@pytest.mark.parametrize("piece", [1, 333, 1 << 20])
@pytest.mark.parametrize(("where", "key", "message"), [
    (100 + 4096 + 5, "a", r"checksum mismatch in block 1 \(file bytes 4196-8292\)"),
    (100 + 10_240 + 7 + 3, "c", "stored checksum mismatch in block 0"),
    (-1, "c", "stored checksum mismatch in block 2"),
])
def test_a_flipped_byte_fails_its_block_only(piece, where, key, message) -> None:  # noqa: ANN001
    data, spans = _file()
    damaged = bytearray(data)
    damaged[where] ^= 0x10
    bad, s = _stream(bytes(damaged), spans, piece)
    assert [(e.key, e.file) for e in bad] == [(key, "f")], bad
    assert s.missing() == []
    with pytest.raises(CorruptCheckpointError, match=message):
        raise bad[0]


def test_a_wrong_raw_checksum_of_a_compressed_block_is_found_after_decoding() -> None:
    data, spans = _file()
    c = spans[-1].chunk
    forged = ChunkEntry(c.file, c.offset, c.nbytes, c.offsets, c.shape,
                        (c.checksums[0] ^ 1, *c.checksums[1:]), c.stored)
    spans = [s for s in spans if s.key != "c"] + chunk_spans(forged, BS, "c")
    bad, _ = _stream(data, spans, 1000)
    assert len(bad) == 1 and "block 0" in bad[0].message and "after decoding" in bad[0].message


def test_a_cut_stream_leaves_its_blocks_missing_and_gaps_are_refused() -> None:
    data, spans = _file()
    s = BlockStream(spans, BS)
    assert s.feed(0, memoryview(data)[:5000]) == []
    assert [(m.key, m.number) for m in s.missing()] == [("a", 1), ("a", 2), ("e", 0), ("c", 0), ("c", 1), ("c", 2)]
    with pytest.raises(ValueError, match="does not continue"):
        s.feed(6000, memoryview(data)[6000:])
    late = BlockStream(spans, BS)
    with pytest.raises(ValueError, match="before the stream's first byte"):
        late.feed(200, memoryview(data)[200:])
