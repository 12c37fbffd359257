"""Lossless codecs of chunk blocks: what ``compression=`` stores, and its bounded decoder.

A block is at most a few MiB of one tensor's raw bytes, a whole number of elements. The
index records each block's codec by name (``CODECS``); this module turns raw bytes into
stored bytes and back, nothing else (no I/O, no threads of its own).

Codecs (the stored bytes of one block):

- ``raw``: the raw bytes themselves.
- ``zstd``: one zstd frame (level ``ZSTD_LEVEL``, content size in the header) of the raw
  bytes; any zstd tool decodes it.
- ``planes16`` / ``planes32`` / ``planes64``: float-aware planes of 2/4/8-byte elements
  (bfloat16, float16 and complex32; float32 and complex64; float64 and complex128). Each
  element, read as a little-endian unsigned integer, is rotated left by one bit, which
  moves the sign bit to the bottom and makes the top byte exactly the 8 exponent bits of
  bfloat16 and float32 (the top 8 of float64's 11; float16's 5 with 3 mantissa bits).
  Byte ``j`` of the rotated elements forms plane ``j``. The exponent plane (the top byte)
  carries almost all of the redundancy of trained weights and optimizer state (2.5-3.5
  bits of entropy per element); the mantissa planes are close to random. The exponent
  byte, less an offset byte ``c`` (mod 256, chosen from a sample so that the commonest
  exponents share one 16-value window), is split into its low and high nibbles, each
  packed two elements per byte (the first element in the low nibble; an odd count pads
  the last high half with 0). Packing halves the bytes zstd must scan and removes the
  short matches that make zstd slow (and no better than its Huffman stage) on
  low-entropy bytes: on bf16 weights it is ~5x faster than zstd on the exponent bytes
  and compresses them better.

  Stored layout: ``c`` (1 byte), then for each of the ``2 + k - 1`` planes in the order
  [exponent low nibbles, exponent high nibbles, mantissa plane 0, ..., mantissa plane
  k-2] a mode byte (0 raw, 1 zstd frame) and the plane's stored length (uint32 LE), then
  the planes' stored bytes in that order. A raw plane holds exactly its plane's bytes
  (``ceil(n/2)`` for a nibble plane, ``n`` for a byte plane, ``n`` elements).

``encode`` picks the codec from the dtype: ``"auto"`` uses the planes codec of float
dtypes and ``zstd`` for every other dtype; ``"zstd"`` always uses ``zstd``. Each plane is
entropy-coded only when a sample of it compresses (so random mantissa planes cost one
copy, not a zstd pass), and a block whose coding does not pay is stored ``raw``.

Entropy coder: zstd through the ``zstandard`` package (extra ``zstd``), a binding of the
reference C library: well kept, fast (its Huffman stage runs at GB/s), releases the GIL
while it works (``encode``/``decode`` run on several I/O threads at once), and decodes
into a buffer bounded by a size we choose. One compressor and one decompressor per
thread (``threading.local``): zstd contexts are not thread-safe, and reusing them avoids
re-allocating their tables per block.

Decoding is bounded: the caller passes ``out``, the block's raw size from the index, and
nothing larger than ``len(out)`` is ever allocated or written whatever the stream says
(a frame's declared content size is checked before decoding; a frame that decodes to
more or fewer bytes, trailing data, a bad header or a wrong codec name raise
``CodecError``).
"""

from __future__ import annotations

import threading
from typing import Any, Literal, get_args

import numpy as np

from ..errors import CheckpointError
from .dtypes import lookup

Compression = Literal["zstd", "auto"]
COMPRESSIONS: tuple[str, ...] = get_args(Compression)

# Every codec name an index may record; the order is part of the format (an index may
# store a codec as its position here): append, never reorder.
CODECS: tuple[str, ...] = ("raw", "zstd", "planes16", "planes32", "planes64")
RAW = CODECS[0]
ZSTD = CODECS[1]
ZSTD_LEVEL = 1  # ~2x the speed of level 3 on tensors, for a ratio within 1-2% of it

_PLANES_WIDTH = {"planes16": 2, "planes32": 4, "planes64": 8}
_PLANES_OF_DTYPE = {"bfloat16": "planes16", "float16": "planes16", "complex32": "planes16",
                    "float32": "planes32", "complex64": "planes32",
                    "float64": "planes64", "complex128": "planes64"}
_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_MODE_RAW, _MODE_ZSTD = 0, 1
_PLANE_HEAD = 5  # mode byte + uint32 length
_SAMPLE_WINDOWS, _SAMPLE_WINDOW = 4, 16 << 10
_PAYS = 0.97  # a plane (or block) is coded only when it shrinks to at most this fraction


class CodecError(ValueError):
    """A stored block is malformed, forged or does not decode to its declared size."""


class CompressionUnavailableError(CheckpointError, ImportError):
    """Compression was asked for, or must be decoded, but ``zstandard`` is not installed."""


def available() -> bool:
    """Whether the ``zstandard`` package (extra ``zstd``) can be imported."""
    try:
        _zstd()
    except CompressionUnavailableError:
        return False
    return True


def check_compression(value: object) -> Compression | None:
    """Validates a user's ``compression=`` argument: None, ``"zstd"`` or ``"auto"``.

    Raises ValueError naming the choices for anything else, and
    ``CompressionUnavailableError`` when compression is asked for without ``zstandard``.
    """
    if value is None:
        return None
    if not isinstance(value, str) or value not in COMPRESSIONS:
        raise ValueError(f"compression must be None, 'zstd' or 'auto', got {value!r}")
    _zstd()
    return value  # type: ignore[return-value]


def codec_for(dtype: str, compression: Compression) -> str:
    """The codec ``encode`` tries for a block of ``dtype`` (it may still store ``raw``)."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be 'zstd' or 'auto', got {compression!r}")
    lookup(dtype)
    return _PLANES_OF_DTYPE.get(dtype, ZSTD) if compression == "auto" else ZSTD


def encode(raw: memoryview, dtype: str, compression: Compression) -> tuple[str, bytes | memoryview]:
    """Encodes one block of raw bytes of ``dtype``: ``(codec name, stored bytes)``.

    Returns ``(RAW, raw)`` when coding does not pay. Thread-safe; the bulk of the work
    runs without the GIL.
    """
    codec = codec_for(dtype, compression)
    raw = memoryview(raw).cast("B")
    itemsize = lookup(dtype).itemsize
    if len(raw) % itemsize:
        raise ValueError(f"a block of {dtype} holds a whole number of {itemsize}-byte elements, "
                         f"got {len(raw)} bytes")
    if not raw:
        return RAW, raw
    if codec == ZSTD:
        stored: bytes | None = _compress(raw)
    else:
        stored = _encode_planes(raw, _PLANES_WIDTH[codec])
    if stored is None or len(stored) > _PAYS * len(raw):
        return RAW, raw
    return codec, stored


def decode(codec: str, stored: memoryview, out: memoryview) -> None:
    """Decodes ``stored`` (a block of codec ``codec``) into exactly ``len(out)`` bytes.

    Raises CodecError for an unknown codec or a stream that is malformed, truncated,
    or decodes to anything but ``len(out)`` bytes; never allocates or writes more than
    a small multiple of ``len(out)``, whatever the stream declares.
    """
    stored = memoryview(stored).cast("B")
    out = memoryview(out).cast("B")
    if out.readonly:
        raise ValueError("decode needs a writable output buffer")
    if codec == RAW:
        if len(stored) != len(out):
            raise CodecError(f"a raw block of {len(out)} bytes is stored in {len(stored)} bytes")
        out[:] = stored
        return
    if codec not in CODECS:
        raise CodecError(f"unknown codec {codec!r} (known: {', '.join(CODECS)})")
    if not out:
        raise CodecError(f"an empty block is stored raw, not {codec!r}")
    if codec == ZSTD:
        out[:] = _decompress(stored, len(out))
    else:
        _decode_planes(stored, out, _PLANES_WIDTH[codec])


# --- zstd ---------------------------------------------------------------------------

_local = threading.local()


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError:
        raise CompressionUnavailableError(
            "compression needs the 'zstandard' package: pip install 'shardsafe[zstd]'") from None
    return zstandard


def _compressor() -> Any:
    c = getattr(_local, "cctx", None)
    if c is None:
        c = _local.cctx = _zstd().ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    return c


def _decompressor() -> Any:
    d = getattr(_local, "dctx", None)
    if d is None:
        d = _local.dctx = _zstd().ZstdDecompressor()
    return d


def _compress(data: Any) -> bytes:
    return _compressor().compress(data)


def _decompress(frame: memoryview, size: int) -> bytes:
    """One zstd frame that must decode to exactly ``size`` bytes (allocates ``size``)."""
    zstandard = _zstd()
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise CodecError(f"bad zstd frame header: {e}") from None
    if declared not in (size, zstandard.CONTENTSIZE_UNKNOWN):
        raise CodecError(f"zstd frame declares {declared} bytes, the block has {size}")
    try:
        data = _decompressor().decompress(frame, max_output_size=size, allow_extra_data=False)
    except zstandard.ZstdError as e:
        raise CodecError(f"bad zstd frame: {e}") from None
    if len(data) != size:
        raise CodecError(f"zstd frame decodes to {len(data)} bytes, the block has {size}")
    return data


def _sample_pays(plane: np.ndarray) -> bool:
    """Whether a few windows of ``plane`` compress (cheap: at most 64 KiB of zstd work)."""
    n = len(plane)
    if n <= _SAMPLE_WINDOWS * _SAMPLE_WINDOW:
        sample = plane
    else:
        step = (n - _SAMPLE_WINDOW) // (_SAMPLE_WINDOWS - 1)
        sample = np.concatenate([plane[i * step:i * step + _SAMPLE_WINDOW]
                                 for i in range(_SAMPLE_WINDOWS)])
    return len(_compress(sample)) <= _PAYS * len(sample)


# --- planes -------------------------------------------------------------------------

def _offset(exponent: np.ndarray) -> int:
    """The offset that puts the commonest 16 consecutive exponent values in one window."""
    step = max(1, len(exponent) // 65536)
    hist = np.bincount(exponent[::step], minlength=256)
    window = np.convolve(np.concatenate([hist, hist[:15]]), np.ones(16, dtype=np.int64), "valid")
    return int(np.argmax(window))  # window[c] = count of values c..c+15 (mod 256)


def _nibble_planes(e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Packs the low and the high nibbles of ``e`` two per byte (first element low)."""
    if len(e) % 2:
        e = np.concatenate([e, np.zeros(1, np.uint8)])
    pairs = e.view(np.uint16)
    lo = ((pairs & 0x000F) | ((pairs >> 4) & 0x00F0)).astype(np.uint8)
    hi = (((pairs >> 4) & 0x000F) | ((pairs >> 8) & 0x00F0)).astype(np.uint8)
    return lo, hi


def _unnibble(lo: np.ndarray, hi: np.ndarray, n: int) -> np.ndarray:
    """The inverse of ``_nibble_planes``: ``n`` bytes."""
    lo16, hi16 = lo.astype(np.uint16), hi.astype(np.uint16)
    pairs = (lo16 & 0x000F) | ((hi16 & 0x000F) << 4) | ((lo16 & 0x00F0) << 4) | ((hi16 & 0x00F0) << 8)
    e = pairs.view(np.uint8)
    if len(e) > n and e[n]:
        raise CodecError("the padding nibble of an odd-length block is not zero")
    return e[:n]


def _encode_planes(raw: memoryview, k: int) -> bytes | None:
    bits = 8 * k
    u = np.frombuffer(raw, dtype=_UINT[k])
    n = len(u)
    e = (u >> np.uint8(bits - 9)).astype(np.uint8)  # the rotated value's top byte
    c = _offset(e)
    e -= np.uint8(c)
    planes = list(_nibble_planes(e))
    if k > 1:
        rot = (u << np.uint8(1)) | (u >> np.uint8(bits - 1))
        rb = rot.view(np.uint8).reshape(n, k)
        planes += [np.ascontiguousarray(rb[:, j]) for j in range(k - 1)]
    head = bytearray([c])
    body: list[Any] = []
    for p in planes:
        data: Any = p
        mode = _MODE_RAW
        if _sample_pays(p):
            z = _compress(p)
            if len(z) <= _PAYS * len(p):
                data, mode = z, _MODE_ZSTD
        head += bytes([mode]) + len(memoryview(data).cast("B")).to_bytes(4, "little")
        body.append(data)
    return b"".join([head, *body])


def _decode_planes(stored: memoryview, out: memoryview, k: int) -> None:
    if len(out) % k:
        raise CodecError(f"a block of {k}-byte elements cannot be {len(out)} bytes")
    n = len(out) // k
    sizes = [(n + 1) // 2] * 2 + [n] * (k - 1)
    head = 1 + _PLANE_HEAD * len(sizes)
    if len(stored) < head:
        raise CodecError(f"a {k * 8}-bit planes block is truncated ({len(stored)} bytes)")
    c = stored[0]
    planes: list[np.ndarray] = []
    pos = head
    for i, size in enumerate(sizes):
        at = 1 + _PLANE_HEAD * i
        mode = stored[at]
        length = int.from_bytes(stored[at + 1:at + _PLANE_HEAD], "little")
        if pos + length > len(stored):
            raise CodecError(f"plane {i} ends at {pos + length}, past the block's "
                             f"{len(stored)} stored bytes")
        data = stored[pos:pos + length]
        pos += length
        if mode == _MODE_RAW:
            if length != size:
                raise CodecError(f"raw plane {i} has {length} bytes, not {size}")
            planes.append(np.frombuffer(data, dtype=np.uint8))
        elif mode == _MODE_ZSTD:
            planes.append(np.frombuffer(_decompress(data, size), dtype=np.uint8))
        else:
            raise CodecError(f"plane {i} has unknown mode {mode}")
    if pos != len(stored):
        raise CodecError(f"{len(stored) - pos} bytes follow the last plane")
    e = _unnibble(planes[0], planes[1], n) + np.uint8(c)
    U = _UINT[k]
    bits = 8 * k
    rot = e.astype(U) << np.uint8(bits - 8)
    for j in range(k - 1):
        rot |= planes[2 + j].astype(U) << np.uint8(8 * j)
    res = np.frombuffer(out, dtype=U)
    np.bitwise_or(rot >> np.uint8(1), rot << np.uint8(bits - 1), out=res)
