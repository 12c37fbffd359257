"""format.planes_kernel: the compiled planes transform writes exactly what numpy writes, it
checks the buffers it is given, and a missing or foreign module falls back to numpy."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest
from helpers import compiled_kernel

import shardsafe.format
from shardsafe.format import codec, planes_kernel

UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


@pytest.fixture
def kernel():
    return compiled_kernel()


def elements(k: int, n: int, seed: int) -> np.ndarray:
    """Float-like elements (a few common exponents) mixed with arbitrary bit patterns."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.02, n)
    x = (w.astype(np.float64).view(np.uint64) >> np.uint64(64 - 8 * k)).astype(UINT[k])
    wild = rng.random(n) < 0.05
    x[wild] = rng.integers(0, 1 << (8 * k - 1), int(wild.sum()), dtype=np.uint64).astype(UINT[k])
    return x


def planes_of(k: int, n: int) -> dict:
    keys = ["lo", "hi", "exp", *range(k - 1)]
    return {i: np.full(codec._plane_size(i, n), 0xAB, np.uint8) for i in keys}


@pytest.mark.parametrize("k", [2, 4, 8])
@pytest.mark.parametrize("n", [1, 2, 7, 2047, 2048, 2049, 6145])
@pytest.mark.parametrize("c", [0, 0x71, 0xFF])
def test_split_and_join_match_numpy(kernel, monkeypatch, k, n, c):
    x = elements(k, n, seed=n * k + c)
    tr = codec._Planes(k)
    fast, slow = planes_of(k, n), planes_of(k, n)
    planes_kernel.split(kernel, k, x, c, fast)
    with monkeypatch.context() as m:
        m.setattr(planes_kernel, "loaded", lambda: None)
        tr.split(x, c, slow)
    for key in fast:
        assert np.array_equal(fast[key], slow[key]), key
    for layout in (codec.NIBBLES, codec.BYTE):
        planes = {i: fast[i] for i in codec._plane_keys(layout, k)}
        out = np.zeros(n, UINT[k])
        planes_kernel.join(kernel, k, c, planes, out)
        assert np.array_equal(out, x)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_split_writes_only_the_planes_asked_for(kernel, k):
    n = 3001
    x = elements(k, n, seed=k)
    full = planes_of(k, n)
    planes_kernel.split(kernel, k, x, 9, full)
    for key in full:
        one = {key: np.full(codec._plane_size(key, n), 0xAB, np.uint8)}
        planes_kernel.split(kernel, k, x, 9, one)
        assert np.array_equal(one[key], full[key]), key


@pytest.mark.parametrize("k", [2, 4, 8])
def test_buffers_are_checked_before_anything_is_written(kernel, k):
    n = 1001
    x = elements(k, n, seed=3)
    good = planes_of(k, n)
    mant = tuple(good[j] for j in range(k - 1))
    for short in ("lo", "hi", "exp", 0):
        planes = {**good, short: np.zeros(codec._plane_size(short, n) - 1, np.uint8)}
        with pytest.raises(ValueError, match="bytes, .* are needed"):
            planes_kernel.split(kernel, k, x, 0, planes)
        with pytest.raises(ValueError, match="bytes, .* are needed"):
            planes_kernel.join(kernel, k, 0, {**planes, "exp": None} if short != "exp" else planes,
                               np.zeros(n, UINT[k]))
    with pytest.raises(ValueError, match="whole number"):
        kernel.split(k, x.view(np.uint8)[1:], 0, None, None, good["exp"], mant)
    with pytest.raises(ValueError, match="not 2, 4 or 8"):
        kernel.split(3, x, 0, None, None, good["exp"], mant)
    with pytest.raises(TypeError, match="tuple of"):
        kernel.split(k, x, 0, None, None, good["exp"], mant[:-1] if k > 2 else ())
    with pytest.raises((TypeError, BufferError)):  # a read-only target
        kernel.split(k, x, 0, None, None, bytes(n), mant)
    with pytest.raises(ValueError, match="come together"):
        kernel.join(k, np.zeros(n, UINT[k]), 0, good["lo"], None, None, mant)
    with pytest.raises(ValueError, match="mantissa plane is required"):
        kernel.join(k, np.zeros(n, UINT[k]), 0, None, None, good["exp"], (None,) * (k - 1))
    assert all(np.array_equal(good[key], planes_of(k, n)[key]) for key in good)  # nothing written


def _numpy_codec_round_trip() -> None:
    data = elements(4, 5000, seed=1).tobytes()
    name, stored = codec.encode(memoryview(data), "float32", "auto")
    out = bytearray(len(data))
    codec.decode(name, memoryview(bytes(stored)), memoryview(out))
    assert name == "planes32" and bytes(out) == data


def test_missing_or_foreign_module_falls_back_to_numpy(monkeypatch, tmp_path, caplog):
    name = "shardsafe.format._planes"
    monkeypatch.setattr(planes_kernel, "_kernel", planes_kernel._UNSET)
    monkeypatch.setitem(sys.modules, name, None)  # not built: importing it fails
    with caplog.at_level(logging.DEBUG, logger="shardsafe"):
        assert planes_kernel.loaded() is None and planes_kernel.describe().startswith("numpy")
        planes_kernel.loaded()
    # the first use says which transform runs, once
    assert [r.getMessage()[:32] for r in caplog.records] == ["planes transform: numpy (the com"]
    _numpy_codec_round_trip()
    # a foreign file where the module would be (a stale build, another platform's)
    monkeypatch.delitem(sys.modules, name)
    (tmp_path / "_planes.so").write_bytes(b"\x7fELF not a library")
    monkeypatch.setattr(shardsafe.format, "__path__", [str(tmp_path)])
    monkeypatch.setattr(planes_kernel, "_kernel", planes_kernel._UNSET)
    assert planes_kernel.loaded() is None
    _numpy_codec_round_trip()


def test_the_first_use_logs_the_compiled_kernel_and_its_file(kernel, monkeypatch, caplog):
    monkeypatch.setattr(planes_kernel, "_kernel", planes_kernel._UNSET)
    with caplog.at_level(logging.DEBUG, logger="shardsafe"):
        assert planes_kernel.loaded() is kernel and planes_kernel.describe() == "compiled kernel"
    assert [r.getMessage() for r in caplog.records] == [f"planes transform: compiled kernel {kernel.__file__}"]
