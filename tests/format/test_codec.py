"""format.codec: bit-exact round trips for every dtype, and a bounded decoder that rejects forged streams."""

from __future__ import annotations

import struct
import threading
import time
import tracemalloc

import numpy as np
import pytest
from helpers import compiled_kernel
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsafe.errors import CheckpointError
from shardsafe.format import codec, planes_kernel
from shardsafe.format.codec import CODECS, CodecError, decode, encode
from shardsafe.format.dtypes import DTYPES

zstandard = pytest.importorskip("zstandard")

FLOATS = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}
SPECIALS = {  # bit patterns: +-0, +-inf, NaN with payloads, subnormals, max, min normal
    2: [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0xFFFF, 0x7F81, 0x0001, 0x807F, 0x7F7F, 0x0080,
        0x7C00, 0xFC00, 0x7E01, 0x03FF],
    4: [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFFFFFFF, 0x7F800001, 1, 0x807FFFFF,
        0x7F7FFFFF, 0x00800000],
    8: [0, 1 << 63, 0x7FF0 << 48, 0xFFF0 << 48, (0x7FF8 << 48) | 5, (1 << 64) - 1, 1, 0x000FFFFFFFFFFFFF,
        0x7FEFFFFFFFFFFFFF],
}
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


@pytest.fixture(scope="module", autouse=True, params=["C kernel", "numpy"])
def planes_transform(request):
    """Runs every test of this module with the compiled planes kernel and with numpy."""
    if request.param == "numpy":
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(planes_kernel, "loaded", lambda: None)
            yield request.param
        return
    compiled_kernel()
    yield request.param


def weights(dtype: str, n: int, seed: int = 0) -> bytes:
    """N(0, 0.02) values of a float dtype, with every special bit pattern mixed in."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.02, n).astype(np.float32)
    if dtype == "bfloat16":
        bits = (w.view(np.uint32) >> 16).astype(np.uint16)
    else:
        bits = w.astype(dtype).view(UINT[FLOATS[dtype]])
    sp = np.array(SPECIALS[FLOATS[dtype]], dtype=np.uint64).astype(bits.dtype)
    k = min(len(sp), n)
    bits[rng.choice(n, k, replace=False)] = sp[:k]
    return bits.tobytes()


def roundtrip(data: bytes, dtype: str, compression: str) -> tuple[str, int]:
    name, stored = encode(memoryview(data), dtype, compression)
    assert name in CODECS
    out = bytearray(len(data))
    decode(name, memoryview(bytes(stored)), memoryview(out))
    assert bytes(out) == data
    return name, len(stored)


@pytest.mark.parametrize("compression", ["zstd", "auto"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("count", [0, 1, 3, 1001, 40_000])
def test_round_trip_every_dtype(dtype, compression, count):
    size = DTYPES[dtype].itemsize
    rng = np.random.default_rng(count)
    random_bytes = rng.integers(0, 256, count * size, dtype=np.uint8).tobytes()
    roundtrip(random_bytes, dtype, compression)
    small = (rng.integers(0, 3, count * size, dtype=np.uint8)).tobytes()  # compressible
    name, stored = roundtrip(small, dtype, compression)
    if count >= 1001:
        assert name != "raw" and stored < len(small)


@pytest.mark.parametrize("dtype", sorted(FLOATS))
@pytest.mark.parametrize("count", [1, 2, 7, 4097, 300_001])
def test_float_weights_with_special_values_round_trip(dtype, count):
    data = weights(dtype, count)
    name, _ = roundtrip(data, dtype, "auto")
    if count > 4096:
        assert name == codec.codec_for(dtype, "auto")


def test_bf16_weights_compress_like_zipnn():
    data = weights("bfloat16", 1 << 20)
    name, stored = roundtrip(data, "bfloat16", "auto")
    assert name == "planes16"
    assert len(data) / stored > 1.49  # zstd on the raw bytes: ~1.28x
    _, plain = roundtrip(data, "bfloat16", "zstd")
    assert plain > stored * 1.1


def test_random_bytes_are_stored_raw():
    data = np.random.default_rng(3).integers(0, 256, 1 << 16, dtype=np.uint8).tobytes()
    for dtype in ("float32", "int64", "bfloat16"):
        for comp in ("zstd", "auto"):
            name, stored = encode(memoryview(data), dtype, comp)
            assert name == "raw" and bytes(stored) == data


def test_codec_for():
    assert codec.codec_for("bfloat16", "auto") == "planes16"
    assert codec.codec_for("float32", "auto") == "planes32"
    assert codec.codec_for("complex128", "auto") == "planes64"
    assert codec.codec_for("int64", "auto") == "zstd"
    assert codec.codec_for("float32", "zstd") == "zstd"
    assert CODECS[0] == "raw" and len(set(CODECS)) == len(CODECS)


def test_check_compression():
    assert codec.check_compression(None) is None
    assert codec.check_compression("zstd") == "zstd"
    assert codec.check_compression("auto") == "auto"
    for bad in ("gzip", "", 1, True, "AUTO"):
        with pytest.raises(ValueError, match="'zstd' or 'auto'"):
            codec.check_compression(bad)
    assert codec.available()
    assert issubclass(codec.CompressionUnavailableError, CheckpointError)


def test_encode_rejects_partial_elements_and_unknown_dtypes():
    with pytest.raises(ValueError, match="whole number"):
        encode(memoryview(b"abc"), "float32", "auto")
    with pytest.raises(ValueError):
        encode(memoryview(b"abcd"), "float31", "auto")
    with pytest.raises(ValueError):
        encode(memoryview(b"abcd"), "float32", "lz4")


def test_encode_and_decode_run_concurrently():
    blocks = [weights(d, 50_000 + i, seed=i) for i, d in enumerate(["bfloat16", "float32"] * 4)]
    dtypes = ["bfloat16", "float32"] * 4
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(5):
                roundtrip(blocks[i], dtypes[i], "auto")
        except BaseException as e:  # collected and re-raised by the test
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(blocks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# --- forged streams ---------------------------------------------------------------

def zstd_frame(data: bytes, content_size: bool = True) -> bytes:
    return zstandard.ZstdCompressor(level=1, write_content_size=content_size).compress(data)


def frame_declaring(size: int, body: bytes = b"") -> bytes:
    """A zstd frame header declaring ``size`` content bytes (8-byte field), then ``body``."""
    fhd = 0b11_1_0_0_0_00  # FCS field 8 bytes, single segment, no checksum, no dict id
    return struct.pack("<IBQ", 0xFD2FB528, fhd, size) + body


def expect_codec_error(name: str, stored: bytes, size: int, match: str | None = None) -> None:
    out = bytearray(size)
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(CodecError, match=match):
            decode(name, memoryview(stored), memoryview(out))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 2.0
    assert peak < 8 * size + (1 << 20), peak
    assert not any(out)  # nothing was written before the stream was found bad


def test_zstd_frame_declaring_a_huge_size_is_rejected_before_allocating():
    expect_codec_error("zstd", frame_declaring(1 << 40, b"\x01\x00\x00"), 4096, "declares")
    expect_codec_error("zstd", frame_declaring(4097, zstd_frame(b"x" * 4097)[6:]), 4096, "declares")


def test_zstd_bomb_without_content_size_stops_at_the_block_size():
    bomb = zstd_frame(bytes(64 << 20), content_size=False)  # 16,384x the block
    assert len(bomb) < 16 << 10
    expect_codec_error("zstd", bomb, 4096)


def test_zstd_frame_declaring_a_huge_window_is_rejected():
    data = bytes(range(256)) * 16
    frame = bytearray(zstd_frame(data, content_size=False))
    assert frame[4] & 0x20 == 0  # not single-segment: byte 5 is the window descriptor
    out = bytearray(len(data))
    decode("zstd", memoryview(bytes(frame)), memoryview(out))
    assert bytes(out) == data
    frame[5] = 17 << 3  # a 2**27-byte window: the decoder would allocate 128 MiB
    assert zstandard.get_frame_parameters(bytes(frame)).window_size == 1 << 27
    expect_codec_error("zstd", bytes(frame), len(data), "window")


@pytest.mark.parametrize("content_size", [True, False])
def test_zstd_frame_of_the_wrong_size_is_rejected(content_size):
    data = bytes(range(256)) * 64
    expect_codec_error("zstd", zstd_frame(data, content_size), len(data) + 1)
    expect_codec_error("zstd", zstd_frame(data, content_size), len(data) - 1)


def test_zstd_concatenated_frames_and_trailing_bytes_are_rejected():
    data = b"abcd" * 1000
    good = zstd_frame(data)
    out = bytearray(len(data))
    decode("zstd", memoryview(good), memoryview(out))
    assert bytes(out) == data
    expect_codec_error("zstd", good + zstd_frame(data), len(data))
    expect_codec_error("zstd", good + zstd_frame(b""), len(data))
    expect_codec_error("zstd", good + b"\x00", len(data))
    half = zstd_frame(data[:2000], content_size=False)
    expect_codec_error("zstd", half + zstd_frame(data[2000:], content_size=False), len(data))


def test_zstd_truncated_or_garbage_is_rejected():
    data = bytes(range(256)) * 64
    good = zstd_frame(data)
    for cut in (0, 3, 5, len(good) // 2, len(good) - 1):
        expect_codec_error("zstd", good[:cut], len(data))
    expect_codec_error("zstd", b"\x00" * 100, len(data))
    expect_codec_error("zstd", np.random.default_rng(0).bytes(1000), len(data))


def test_wrong_codec_name_and_raw_length():
    expect_codec_error("lz4", b"abcd", 4, "unknown codec")
    expect_codec_error("raw", b"abc", 4, "raw block")
    expect_codec_error("raw", b"abcde", 4, "raw block")
    expect_codec_error("zstd", zstd_frame(b""), 0, "empty block")
    expect_codec_error("planes16", b"", 0, "empty block")


def planes_block(n: int = 5001, dtype: str = "float32") -> tuple[bytes, bytes]:
    data = weights(dtype, n)
    name, stored = encode(memoryview(data), dtype, "auto")
    assert name == codec.codec_for(dtype, "auto")
    return data, bytes(stored)


def plane_headers(stored: bytes) -> list[tuple[int, int]]:
    """(mode, stored length) of each plane of a planes block."""
    count = {0: 2, 1: 1}[stored[0]] + {"planes16": 1, "planes32": 3, "planes64": 7}[WIDTH]
    return [(stored[2 + 5 * i], int.from_bytes(stored[3 + 5 * i:7 + 5 * i], "little"))
            for i in range(count)]


WIDTH = "planes32"


def test_planes_block_layout_is_as_documented():
    data, stored = planes_block()
    assert stored[0] == 0  # exponent nibbles
    heads = plane_headers(stored)
    assert heads[0][0] == 1  # the exponent's low nibbles are coded
    assert all(mode == 0 for mode, _ in heads[2:])  # random mantissa planes stay raw
    assert [n for _, n in heads[2:]] == [5001] * 3
    assert 2 + 5 * 5 + sum(n for _, n in heads) == len(stored)


def mixed(n: int) -> np.ndarray:
    """n pseudo-random 32-bit values from splitmix64 (no RNG stream that versions may change)."""
    z = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return ((z ^ (z >> np.uint64(31))) >> np.uint64(32)).astype(np.uint32)


def stored_planes(stored: bytes) -> list[tuple[int, bytes]]:
    """(mode, stored bytes) of each plane of a float32 planes block."""
    heads = plane_headers(stored)
    pos, out = 2 + 5 * len(heads), []
    for mode, n in heads:
        out.append((mode, stored[pos:pos + n]))
        pos += n
    assert pos == len(stored)
    return out


def mantissa_plane(x: np.ndarray, j: int) -> bytes:
    """Byte j of float32 bit patterns rotated left by one bit, computed here, not by the codec."""
    r = (x << np.uint32(1)) | (x >> np.uint32(31))
    return ((r >> np.uint32(8 * j)) & np.uint32(0xFF)).astype(np.uint8).tobytes()


def float32_bits(n: int, constant_mantissa: int) -> np.ndarray:
    """Four exponents, a random sign and low 7 bits, ``constant_mantissa`` in bits 7-22."""
    h = mixed(n)
    return ((np.uint32(120) + h % np.uint32(4)) << np.uint32(23) | (h >> np.uint32(31) << np.uint32(31))
            | np.uint32(constant_mantissa) | (h >> np.uint32(8)) & np.uint32(0x7F))


def test_a_raw_plane_between_coded_planes_is_stored_in_place():
    x = float32_bits(1 << 16, 0x2A5A80)  # plane 0 random, planes 1 and 2 constant
    name, stored = encode(memoryview(x.tobytes()), "float32", "auto")
    planes = stored_planes(bytes(stored))
    assert name == "planes32" and [m for m, _ in planes] == [1, 1, 0, 1, 1]
    assert planes[2][1] == mantissa_plane(x, 0)
    assert roundtrip(x.tobytes(), "float32", "auto")[0] == "planes32"


def test_a_plane_coded_in_the_sample_but_not_in_the_block_is_stored_raw():
    n, w = 1 << 21, codec._SAMPLE_WINDOW  # the sample windows are 1.6% of the block
    x = float32_bits(n, 0)
    x |= mixed(n)[::-1] & np.uint32(0x7FFF80)  # planes 1 and 2 random ...
    step = (n - w) // (codec._SAMPLE_WINDOWS - 1) & ~1
    for i in range(codec._SAMPLE_WINDOWS):  # ... but constant where the sample looks
        x[i * step:i * step + w] = x[i * step:i * step + w] & np.uint32(0xFF80007F) | np.uint32(0x2A5A80)
    assert {1, 2} <= set(codec._plan(codec._Planes(4), x)[2])
    name, stored = encode(memoryview(x.tobytes()), "float32", "auto")
    planes = stored_planes(bytes(stored))
    assert name == "planes32" and [m for m, _ in planes][2:] == [0, 0, 0]
    assert [p for _, p in planes[2:]] == [mantissa_plane(x, j) for j in range(3)]
    assert roundtrip(x.tobytes(), "float32", "auto")[0] == "planes32"


def test_planes_golden_streams_decode_as_documented():
    # bf16 1.0, -2.0, 0.5 = 0x3F80, 0xC000, 0x3F00; rotated left by one bit: 0x7F00, 0x8001,
    # 0x7E00: exponent bytes 7F 80 7E, mantissa plane 0 (sign in bit 0) 00 01 00
    want = struct.pack("<3H", 0x3F80, 0xC000, 0x3F00)
    byte_layout = bytes([1, 0, 0, 3, 0, 0, 0, 0, 3, 0, 0, 0, 0x7F, 0x80, 0x7E, 0x00, 0x01, 0x00])
    # nibbles, offset 0x70: exponents 0F 10 0E (+ a zero pad); low nibbles F,0 | E,0 -> 0F 0E,
    # high nibbles 0,1 | 0,0 -> 10 00
    nibbles = bytes([0, 0x70, 0, 2, 0, 0, 0, 0, 2, 0, 0, 0, 0, 3, 0, 0, 0,
                     0x0F, 0x0E, 0x10, 0x00, 0x00, 0x01, 0x00])
    for stream in (byte_layout, nibbles):
        out = bytearray(6)
        decode("planes16", memoryview(stream), memoryview(out))
        assert bytes(out) == want


def test_float16_codes_its_exponent_byte_whole_and_bfloat16_in_nibbles():
    # float16's top byte holds 5 exponent and 3 mantissa bits: nibbles would cut the exponent
    _, fp16 = planes_block(100_000, "float16")
    _, bf16 = planes_block(100_000, "bfloat16")
    assert fp16[0] == 1 and fp16[1] == 0 and bf16[0] == 0


def test_planes_forged_streams_are_rejected():
    data, stored = planes_block()
    n = len(data)
    heads = plane_headers(stored)
    expect_codec_error("planes32", stored[:20], n, "truncated")
    expect_codec_error("planes32", stored[:1], n, "truncated")
    expect_codec_error("planes32", stored[:-1], n, "past")
    expect_codec_error("planes32", stored + b"\x00", n, "follow")
    expect_codec_error("planes32", stored, n + 4)
    expect_codec_error("planes32", stored, n - 4)
    expect_codec_error("planes32", stored, n + 2, "cannot be")
    expect_codec_error("planes16", stored, n)
    bad_layout = bytearray(stored)
    bad_layout[0] = 2
    expect_codec_error("planes32", bytes(bad_layout), n, "layout")
    bad_mode = bytearray(stored)
    bad_mode[2] = 7
    expect_codec_error("planes32", bytes(bad_mode), n, "unknown mode")
    lying = bytearray(stored)  # raw mantissa plane 0 claims one byte fewer, plane 1 one more
    lying[2 + 5 * 2 + 1:2 + 5 * 2 + 5] = (heads[2][1] - 1).to_bytes(4, "little")
    lying[2 + 5 * 3 + 1:2 + 5 * 3 + 5] = (heads[3][1] + 1).to_bytes(4, "little")
    expect_codec_error("planes32", bytes(lying), n, "raw plane")
    huge = bytearray(stored)
    huge[3:7] = (0xFFFFFFFF).to_bytes(4, "little")
    expect_codec_error("planes32", bytes(huge), n, "past")


def test_planes_zstd_plane_of_the_wrong_size_is_rejected():
    data, stored = planes_block()
    heads = plane_headers(stored)
    start = 2 + 5 * 5
    frame = stored[start:start + heads[0][1]]
    plane = zstandard.ZstdDecompressor().decompress(frame)
    forged_frame = zstd_frame(plane + b"\x00", content_size=False)
    forged = bytearray(stored[:start]) + forged_frame + stored[start + heads[0][1]:]
    forged[3:7] = len(forged_frame).to_bytes(4, "little")
    expect_codec_error("planes32", bytes(forged), len(data))


def raw_planes(stored: bytes) -> list[bytearray]:
    """Every plane of a planes32 block, decoded."""
    pos, planes = 2 + 5 * len(plane_headers(stored)), []
    for mode, length in plane_headers(stored):
        data = stored[pos:pos + length]
        pos += length
        planes.append(bytearray(zstandard.ZstdDecompressor().decompress(data) if mode else data))
    return planes


def planes_stream(layout: int, offset: int, planes: list[bytes]) -> bytes:
    """A planes block that stores every plane raw."""
    head = bytes([layout, offset]) + b"".join(b"\x00" + len(p).to_bytes(4, "little") for p in planes)
    return head + b"".join(planes)


def test_planes_nonzero_padding_nibble_is_rejected():
    data, stored = planes_block(4001)
    planes = raw_planes(stored)
    out = bytearray(len(data))
    decode("planes32", memoryview(planes_stream(0, stored[1], planes)), memoryview(out))
    assert bytes(out) == data  # all-raw planes decode the same
    planes[1][-1] |= 0x10
    expect_codec_error("planes32", planes_stream(0, stored[1], planes), len(data), "padding")


def test_mutated_streams_decode_exactly_or_raise_codec_error():
    rng = np.random.default_rng(7)
    blocks = [(planes_block(3000)[0], "float32"), (weights("bfloat16", 3001), "bfloat16"),
              (bytes(range(200)) * 30, "int64")]
    for data, dtype in blocks:
        name, stored = encode(memoryview(data), dtype, "auto")
        assert name != "raw"
        for _ in range(150):
            forged = bytearray(stored)
            for _ in range(int(rng.integers(1, 4))):
                forged[int(rng.integers(len(forged)))] ^= 1 << int(rng.integers(8))
            out = bytearray(len(data))
            try:
                decode(name, memoryview(bytes(forged)), memoryview(out))
            except CodecError:
                continue
            assert len(out) == len(data)



# --- properties -------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(dtype=st.sampled_from(sorted(FLOATS) + ["int64", "complex64"]),
       compression=st.sampled_from(["zstd", "auto"]), count=st.integers(0, 3000),
       spread=st.integers(1, 256), seed=st.integers(0, 2**32 - 1))
def test_any_bytes_round_trip(dtype, compression, count, spread, seed):
    size = DTYPES[dtype].itemsize  # small spreads make compressible blocks
    raw = np.random.default_rng(seed).integers(0, spread, count * size, dtype=np.uint16)
    roundtrip(raw.astype(np.uint8).tobytes(), dtype, compression)


@settings(max_examples=300, deadline=None)
@given(codec_name=st.sampled_from(CODECS), stored=st.binary(max_size=300), size=st.integers(0, 64))
def test_decoding_arbitrary_bytes_raises_only_codec_error(codec_name, stored, size):
    out = bytearray(size * 8)
    try:
        decode(codec_name, memoryview(stored), memoryview(out))
    except CodecError:
        return
    assert len(out) == size * 8
