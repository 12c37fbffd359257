"""Lossless codecs of chunk blocks: what ``compression=`` stores, and its bounded decoder.

A block is at most 16 MiB of one tensor's raw bytes, a whole number of elements. The
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
  Byte ``j < k-1`` of the rotated elements forms mantissa plane ``j`` (plane 0 holds
  the sign in its lowest bit). The exponent byte carries almost all of the redundancy of
  trained weights and optimizer state (2.5-3.5 bits of entropy per element); the
  mantissa planes are close to random. It is stored in one of two layouts, whichever
  codes a sample of the block better (nibbles unless whole bytes save 3%):

  - ``NIBBLES`` (0): the exponent byte less an offset ``c`` (mod 256, chosen from a
    sample so that the commonest exponents share one 16-value window) is split into its
    low and high nibbles, each plane packed two elements per byte (the first element in
    the low nibble; an odd count pads with a zero nibble). Packing halves the bytes zstd
    scans and removes the short matches that make zstd slow on low-entropy bytes: on
    bf16 weights zstd runs ~5x faster on the nibble planes than on the exponent bytes,
    and codes them ~10% smaller.
  - ``BYTE`` (1): the exponent byte whole (``c`` is 0), for float16, whose top byte holds
    5 exponent and 3 mantissa bits that a nibble split would cut apart.

  Stored layout: the layout byte, ``c``, then for each plane in the order [exponent
  planes of the layout (low nibbles, high nibbles; or the byte), mantissa plane 0, ...,
  k-2] a mode byte (0 raw, 1 zstd frame) and the plane's stored length (uint32 LE), then
  the planes' stored bytes in that order. A raw plane holds exactly its plane's bytes
  (``ceil(n/2)`` for a nibble plane, ``n`` for a byte plane, for ``n`` elements).

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

The planes transform runs as one pass of C without the GIL where ``make`` built it
(``planes_kernel``), else as numpy passes over cache-sized pieces; both write the same bytes.

Decoding is bounded: the caller passes ``out``, the block's raw size from the index;
nothing is written beyond ``out`` and at most a small multiple of ``len(out)`` is
allocated, whatever the stream says (a frame's declared content size and window, which the decoder allocates, are checked
before decoding; a frame that decodes to more or fewer bytes, trailing data, a bad
header or a wrong codec name raise ``CodecError``).
"""

from __future__ import annotations

import threading
from typing import Any, Literal, get_args

import numpy as np

from .._scratch import ScratchPool
from ..errors import CheckpointError
from . import planes_kernel
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
_UINT = {2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}  # the format is little-endian
_MODE_RAW, _MODE_ZSTD = 0, 1
_PLANE_HEAD = 5  # mode byte + uint32 length
_SAMPLE_WINDOWS, _SAMPLE_WINDOW = 4, 8192  # elements a planes block is planned on
_PAYS = 0.97  # a plane (or block) is coded only when it shrinks to at most this fraction
_MAX_WINDOW = 1 << 20  # zstd windows beyond a block's size are refused above this (level 1: 512 KiB)


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

    Returns ``(RAW, raw)`` when coding does not pay. Coded bytes belong to the caller
    (never a view of scratch that a later call reuses), so they may be kept while more
    blocks are coded. Thread-safe; the bulk of the work runs without the GIL.
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
        stored: bytes | memoryview | None = _compress(raw)
    else:
        planes = _encode_planes(raw, _PLANES_WIDTH[codec])
        stored = None if planes is None else memoryview(planes)
    if stored is None or len(stored) > _PAYS * len(raw):
        return RAW, raw
    return codec, stored


def decode(codec: str, stored: memoryview, out: memoryview) -> None:
    """Decodes ``stored`` (a block of codec ``codec``) into exactly ``len(out)`` bytes.

    Raises CodecError for an unknown codec or a stream that is malformed, truncated,
    or decodes to anything but ``len(out)`` bytes, before writing to ``out``; never
    writes beyond ``out`` or allocates more than a small multiple of ``len(out)``,
    whatever the stream declares.
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
        params = zstandard.get_frame_parameters(frame)
    except zstandard.ZstdError as e:
        raise CodecError(f"bad zstd frame header: {e}") from None
    declared = params.content_size
    if declared not in (size, zstandard.CONTENTSIZE_UNKNOWN):
        raise CodecError(f"zstd frame declares {declared} bytes, the block has {size}")
    if params.window_size > max(size, _MAX_WINDOW):  # the decoder would allocate the window
        raise CodecError(f"zstd frame declares a {params.window_size}-byte window for {size} bytes")
    try:
        data = _decompressor().decompress(frame, max_output_size=size, allow_extra_data=False)
    except zstandard.ZstdError as e:
        raise CodecError(f"bad zstd frame: {e}") from None
    if len(data) != size:
        raise CodecError(f"zstd frame decodes to {len(data)} bytes, the block has {size}")
    return data


# --- planes -------------------------------------------------------------------------
#
# Planes of a block of n k-byte elements, by key: "lo" and "hi" the exponent's low and
# high nibbles (ceil(n/2) bytes each; layout NIBBLES) or "exp" the exponent byte (n bytes;
# layout BYTE), and j = 0..k-2 byte j of the rotated elements (n bytes each). The
# transform runs over pieces of ``_PIECE`` bytes so that its temporaries stay in the CPU
# cache: numpy passes over whole 16 MiB blocks would be bound by memory bandwidth.

_PIECE = 512 << 10
NIBBLES, BYTE = 0, 1
_LAYOUTS: dict[int, tuple[str, ...]] = {NIBBLES: ("lo", "hi"), BYTE: ("exp",)}
_BYTE_PAYS = 0.97  # the exponent is coded whole only when that saves 3% over its nibbles


def _plane_keys(layout: int, k: int) -> list[Any]:
    return [*_LAYOUTS[layout], *range(k - 1)]


def _plane_size(key: Any, n: int) -> int:
    return (n + 1) // 2 if key in ("lo", "hi") else n


class _Planes:
    """The planes transform of k-byte elements: the C kernel where it is built, else numpy
    passes over pieces with scratch for one piece."""

    def __init__(self, k: int) -> None:
        self.k, self.bits, self.U = k, 8 * k, _UINT[k]
        self.piece = _PIECE // k  # elements per piece (even)
        self.wide = np.empty(self.piece, self.U)
        self.rot = np.empty(self.piece, self.U)
        self.e = np.empty(self.piece, np.uint8)
        self.pairs = np.empty(self.piece // 2, _UINT[2])
        self.pairs2 = np.empty(self.piece // 2, _UINT[2])
        self.pairs3 = np.empty(self.piece // 2, _UINT[2])

    def exponent(self, x: np.ndarray, c: int, out: np.ndarray | None = None) -> np.ndarray:
        """The rotated elements' top byte less ``c`` (mod 256), into ``out`` or scratch."""
        w = self.wide[:len(x)]
        e = self.e[:len(x)] if out is None else out
        np.right_shift(x, self.bits - 9, out=w)
        np.copyto(e, w, casting="unsafe")  # keeps the low 8 bits
        if c:
            np.subtract(e, np.uint8(c), out=e)
        return e

    def split(self, x: np.ndarray, c: int, targets: dict[Any, np.ndarray]) -> None:
        """Writes the planes named in ``targets`` (key -> array of its size) from ``x``."""
        lib = planes_kernel.loaded()
        if lib is not None:
            planes_kernel.split(lib, self.k, x, c, targets)
            return
        nib = [i for i in ("lo", "hi") if i in targets]
        mant = [i for i in targets if isinstance(i, int)]
        for s in range(0, len(x), self.piece):
            xs = x[s:s + self.piece]
            m = len(xs)
            if "exp" in targets:
                self.exponent(xs, c, targets["exp"][s:s + m])
            if nib:
                e = self.e[:m + (m & 1)]
                e[m:] = 0
                self.exponent(xs, c)
                pr, t = e.view(_UINT[2]), self.pairs2[:len(e) // 2]
                for i in nib:
                    q = self.pairs[:len(pr)]
                    if i == "lo":  # the low nibbles of a pair of bytes (a, b) -> 0xba
                        np.bitwise_and(pr, 0x000F, out=q)
                        np.right_shift(pr, 4, out=t)
                    else:
                        np.right_shift(pr, 4, out=q)
                        np.bitwise_and(q, 0x000F, out=q)
                        np.right_shift(pr, 8, out=t)
                    np.bitwise_and(t, 0x00F0, out=t)
                    np.bitwise_or(q, t, out=q)
                    np.copyto(targets[i][s // 2:s // 2 + len(pr)], q, casting="unsafe")
            if mant:
                r, w = self.rot[:m], self.wide[:m]
                np.left_shift(xs, 1, out=r)
                np.right_shift(xs, self.bits - 1, out=w)
                np.bitwise_or(r, w, out=r)
                for j in mant:
                    src = np.right_shift(r, 8 * j, out=w) if j else r
                    np.copyto(targets[j][s:s + m], src, casting="unsafe")

    def _unnibble(self, lo: np.ndarray, hi: np.ndarray, m: int) -> np.ndarray:
        """``m`` exponent bytes from pieces of the nibble planes (a view of scratch)."""
        half = len(lo)
        pr, t = self.pairs[:half], self.pairs2[:half]
        np.copyto(pr, lo)  # low nibbles 0xba of a pair of bytes (a, b) -> 0x0b0a
        np.left_shift(pr, 4, out=t)
        np.bitwise_or(pr, t, out=pr)
        np.bitwise_and(pr, 0x0F0F, out=pr)
        np.copyto(t, hi)  # high nibbles 0xba -> 0xb0a0
        np.bitwise_or(t, np.left_shift(t, 4, out=self.pairs3[:half]), out=t)
        np.bitwise_and(t, 0x0F0F, out=t)
        np.left_shift(t, 4, out=t)
        np.bitwise_or(pr, t, out=pr)
        return pr.view(np.uint8)[:m]

    def join(self, c: int, planes: dict[Any, np.ndarray], out: np.ndarray) -> None:
        """The inverse of ``split``: the elements ``out`` from all planes of a layout."""
        n = len(out)
        nibbles = "lo" in planes
        if nibbles and n & 1 and (planes["lo"][-1] | planes["hi"][-1]) & 0xF0:
            raise CodecError("the padding nibble of an odd-length block is not zero")
        lib = planes_kernel.loaded()
        if lib is not None:
            planes_kernel.join(lib, self.k, c, planes, out)
            return
        for s in range(0, n, self.piece):
            o = out[s:s + self.piece]
            m = len(o)
            if nibbles:
                h = s // 2
                e = self._unnibble(planes["lo"][h:h + (m + 1) // 2], planes["hi"][h:h + (m + 1) // 2], m)
            else:
                e = self.e[:m]
                np.copyto(e, planes["exp"][s:s + m])
            if c:
                np.add(e, np.uint8(c), out=e)
            r, w = self.rot[:m], self.wide[:m]
            np.copyto(r, e)
            np.left_shift(r, self.bits - 8, out=r)
            for j in range(self.k - 1):
                np.copyto(w, planes[j][s:s + m])
                if j:
                    np.left_shift(w, 8 * j, out=w)
                np.bitwise_or(r, w, out=r)
            np.left_shift(r, self.bits - 1, out=w)
            np.right_shift(r, 1, out=o)
            np.bitwise_or(o, w, out=o)


def _transform(k: int) -> _Planes:
    """This thread's planes transform of k-byte elements (its scratch is reused)."""
    key = f"planes{k}"
    tr = getattr(_local, key, None)
    if tr is None:
        tr = _Planes(k)
        setattr(_local, key, tr)
    return tr


def _offset(exponent: np.ndarray) -> int:
    """The offset that puts the commonest 16 consecutive exponent values in one window."""
    hist = np.bincount(exponent, minlength=256)
    window = np.convolve(np.concatenate([hist, hist[:15]]), np.ones(16, dtype=np.int64), "valid")
    return int(np.argmax(window))  # window[c] = count of values c..c+15 (mod 256)


def _sample(x: np.ndarray) -> np.ndarray:
    """A few windows of elements spread over ``x`` (all of a small block)."""
    n = len(x)
    if n <= _SAMPLE_WINDOWS * _SAMPLE_WINDOW:
        return x
    step = (n - _SAMPLE_WINDOW) // (_SAMPLE_WINDOWS - 1) & ~1
    return np.concatenate([x[i * step:i * step + _SAMPLE_WINDOW] for i in range(_SAMPLE_WINDOWS)])


def _plan(tr: _Planes, x: np.ndarray) -> tuple[int, int, list[Any]]:
    """From a sample of ``x``: the layout, the exponent offset and the planes worth coding."""
    xs = _sample(x)
    c = _offset(tr.exponent(xs, 0))
    keys = ["lo", "hi", "exp", *range(tr.k - 1)]
    sample = {i: np.empty(_plane_size(i, len(xs)), np.uint8) for i in keys}
    tr.split(xs, c, sample)
    cost = {i: min(len(p), len(_compress(p))) for i, p in sample.items()}
    layout = BYTE if cost["exp"] < _BYTE_PAYS * (cost["lo"] + cost["hi"]) else NIBBLES
    coded = [i for i in _plane_keys(layout, tr.k) if cost[i] <= _PAYS * len(sample[i])]
    return layout, (c if layout == NIBBLES else 0), coded


_scratch = ScratchPool().get  # a block's planes to code (at most 16 MiB in the engine), one per block coded


def _encode_planes(raw: memoryview, k: int) -> np.ndarray | None:
    """The stored block, or None. One pass of the transform: the raw planes after the last
    plane to code go straight to the end of a buffer with room for the block uncoded; the
    stored block is the tail of it that the header and coded planes complete."""
    tr = _transform(k)
    x = np.frombuffer(raw, dtype=tr.U)
    layout, c, coded = _plan(tr, x)
    if not coded:  # the header alone makes the block larger than 97% of its raw size
        return None
    with _scratch(sum(_plane_size(i, len(x)) for i in coded)) as scratch:
        return _encode_into(tr, x, layout, c, coded, scratch, len(raw))


def _encode_into(tr: _Planes, x: np.ndarray, layout: int, c: int, coded: list[Any], scratch: np.ndarray,
                 nbytes: int) -> np.ndarray | None:
    """``_encode_planes`` once planned, with ``scratch`` for the planes to code."""
    keys = _plane_keys(layout, tr.k)
    sizes = {i: _plane_size(i, len(x)) for i in keys}
    t = len(keys)
    while t and keys[t - 1] not in coded:
        t -= 1
    head, rest = 2 + _PLANE_HEAD * len(keys), sum(sizes[i] for i in keys[t:])
    buf = np.empty(head + sum(sizes.values()), np.uint8)
    planes, at = {}, 0
    for i in coded:
        planes[i], at = scratch[at:at + sizes[i]], at + sizes[i]
    at = len(buf) - rest
    for i in keys[t:]:
        planes[i], at = buf[at:at + sizes[i]], at + sizes[i]
    tr.split(x, c, planes)
    frames = {i: f for i in coded if len(f := _compress(planes[i])) <= _PAYS * sizes[i]}  # the frames that pay
    lengths = [len(frames[i]) if i in frames else sizes[i] for i in keys]
    total = head + sum(lengths)
    if total > _PAYS * nbytes:
        return None
    out = buf[len(buf) - total:]
    out[0], out[1] = layout, c
    for at, i, length in zip(range(2, head, _PLANE_HEAD), keys, lengths):
        out[at] = _MODE_ZSTD if i in frames else _MODE_RAW
        out[at + 1:at + _PLANE_HEAD] = np.frombuffer(length.to_bytes(4, "little"), np.uint8)
    pos, middle = head, {}
    for i, length in zip(keys[:t], lengths):
        if i in frames:
            out[pos:pos + length] = np.frombuffer(frames[i], np.uint8)
        elif i in planes:  # coded, but its frame did not pay
            out[pos:pos + length] = planes[i]
        else:  # raw, before a plane to code: a second pass
            middle[i] = out[pos:pos + length]
        pos += length
    if middle:
        tr.split(x, c, middle)
    return out


def _decode_planes(stored: memoryview, out: memoryview, k: int) -> None:
    if len(out) % k:
        raise CodecError(f"a block of {k}-byte elements cannot be {len(out)} bytes")
    n = len(out) // k
    if len(stored) < 2 or stored[0] not in _LAYOUTS:
        raise CodecError(f"a {k * 8}-bit planes block is truncated or has no known layout")
    layout, c = stored[0], stored[1]
    keys = _plane_keys(layout, k)
    head = 2 + _PLANE_HEAD * len(keys)
    if len(stored) < head:
        raise CodecError(f"a {k * 8}-bit planes block is truncated ({len(stored)} bytes)")
    planes: dict[Any, np.ndarray] = {}
    pos = head
    for at, i in zip(range(2, head, _PLANE_HEAD), keys):
        mode, size = stored[at], _plane_size(i, n)
        length = int.from_bytes(stored[at + 1:at + _PLANE_HEAD], "little")
        if pos + length > len(stored):
            raise CodecError(f"plane {i!r} ends at {pos + length}, past the block's "
                             f"{len(stored)} stored bytes")
        data = stored[pos:pos + length]
        pos += length
        if mode == _MODE_RAW:
            if length != size:
                raise CodecError(f"raw plane {i!r} has {length} bytes, not {size}")
            planes[i] = np.frombuffer(data, dtype=np.uint8)
        elif mode == _MODE_ZSTD:
            planes[i] = np.frombuffer(_decompress(data, size), dtype=np.uint8)
        else:
            raise CodecError(f"plane {i!r} has unknown mode {mode}")
    if pos != len(stored):
        raise CodecError(f"{len(stored) - pos} bytes follow the last plane")
    _transform(k).join(c, planes, np.frombuffer(out, dtype=_UINT[k]))
