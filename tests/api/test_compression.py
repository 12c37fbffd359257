"""save/async_save/load with compression=: bit-exact round trips, detection of damage, misuse."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import shardsafe
from shardsafe.format.blockfile import MAGIC
from shardsafe.format.dtypes import DTYPES
from shardsafe.format.index.versions import decode_index
from shardsafe.plan.layout import block_file_name

from helpers import assert_same, flip_byte
from roundtrip_helpers import random_tensor

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")

BLOCKS = block_file_name(0)
BIG = (80 << 10)  # bytes: above the 64 KiB from which tensors are compressed


def _low_entropy(dtype: torch.dtype, nbytes: int, seed: int) -> torch.Tensor:
    """Bytes drawn from {0..3}: compressible bit patterns of any dtype (NaN payloads too)."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 4, (nbytes,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        return (raw & 1).bool()
    return raw.view(dtype)


def _every_dtype_state() -> dict:
    state: dict = {}
    for i, name in enumerate(sorted(n for n, d in DTYPES.items() if d.torch)):  # (JAX's: tests/jax)
        dt = getattr(torch, name)
        size = torch.empty((), dtype=dt).element_size()
        state[name] = {
            "low": _low_entropy(dt, BIG, i).reshape(-1, 4 // min(size, 4) if size < 4 else 1),
            "random": random_tensor(dt, (BIG // size,), seed=i),
            "small": random_tensor(dt, (3,), seed=i),
            "empty": torch.empty((0, 2), dtype=dt),
        }
    state["weights"] = (torch.randn(256, 512) * 0.02).to(torch.bfloat16)
    state["adam"] = {"exp_avg_sq": torch.rand(128, 256) * 1e-6, "step": 10}
    state["numpy"] = np.arange(40_000, dtype=np.int32)
    return state


def _index(path: str):
    with open(os.path.join(path, "index.json"), "rb") as f:
        return decode_index(f.read())


def _codecs(path: str) -> set[str]:
    return {n for t in _index(path).tensors for c in t.chunks
            for n in (c.stored.codecs if c.stored is not None else ("raw",))}


@pytest.mark.parametrize("compression", [None, "zstd", "auto"])
@pytest.mark.parametrize("how", ["sync", "async-blocking", "async-background"])
def test_every_dtype_round_trips_bit_exactly(tmp_path, compression, how) -> None:
    state = _every_dtype_state()
    path = str(tmp_path / "ckpt")
    if how == "sync":
        shardsafe.save(state, path, compression=compression)
    else:
        shardsafe.async_save(state, path, compression=compression,
                             staging=how.removeprefix("async-")).result()  # type: ignore[arg-type]
    assert_same(shardsafe.load(path), state)
    target = _every_dtype_state()
    for v in [target["weights"], target["numpy"]] + [v for d in target.values() if isinstance(d, dict)
                                                     for v in d.values()]:
        if isinstance(v, torch.Tensor):
            v.view(torch.uint8).zero_()  # any dtype, also those torch cannot fill
        elif isinstance(v, np.ndarray):
            v[...] = 0
    shardsafe.load(path, target)
    assert_same(target, state)
    if compression is None:
        assert not os.path.exists(os.path.join(path, BLOCKS))
        assert _codecs(path) == {"raw"}
    else:
        with open(os.path.join(path, BLOCKS), "rb") as f:
            assert f.read(len(MAGIC)) == MAGIC
        assert _codecs(path) - {"raw"}, "nothing was compressed"
        if compression == "auto":  # float-aware planes for the bf16 weights
            assert any(n.startswith("planes") for n in _codecs(path))


def test_compression_shrinks_bf16_weights(tmp_path) -> None:
    state = {"w": (torch.randn(1024, 1024) * 0.02).to(torch.bfloat16)}
    sizes = {}
    for comp in (None, "zstd", "auto"):
        path = str(tmp_path / str(comp))
        shardsafe.save(state, path, compression=comp)
        sizes[comp] = sum(f.size for f in _index(path).files)
    assert sizes["auto"] < sizes["zstd"] < sizes[None]
    assert sizes[None] / sizes["auto"] > 1.3


def test_mmap_load_decodes_compressed_tensors(tmp_path) -> None:
    state = {"w": (torch.randn(300, 200) * 0.02).to(torch.bfloat16), "tiny": torch.arange(4.0)}
    path = str(tmp_path / "ckpt")
    shardsafe.save(state, path, compression="auto")
    assert_same(shardsafe.load(path, mmap=True), state)


@pytest.mark.parametrize("mmap", [False, True])
def test_flipped_byte_in_compressed_data_names_file_and_key(tmp_path, mmap) -> None:
    state = {"w": (torch.randn(300, 200) * 0.02).to(torch.bfloat16)}
    path = str(tmp_path / "ckpt")
    shardsafe.save(state, path, compression="zstd")
    (c,) = _index(path).tensors[0].chunks
    assert c.stored is not None
    for pos in (c.offset, c.offset + c.stored.nbytes // 2, c.offset + c.stored.nbytes - 1):
        flip_byte(os.path.join(path, BLOCKS), pos, 0x10)
        with pytest.raises(shardsafe.CorruptCheckpointError) as e:
            shardsafe.load(path, mmap=mmap)
        assert e.value.file == BLOCKS and e.value.key == "w"
        assert "stored checksum mismatch" in str(e.value)
        flip_byte(os.path.join(path, BLOCKS), pos, 0x10)  # undo
    assert_same(shardsafe.load(path, mmap=mmap), state)


def test_truncated_block_file_is_refused(tmp_path) -> None:
    path = str(tmp_path / "ckpt")
    shardsafe.save({"w": torch.zeros(100_000)}, path, compression="zstd")
    f = os.path.join(path, BLOCKS)
    os.truncate(f, os.path.getsize(f) - 1)
    with pytest.raises(shardsafe.CorruptCheckpointError) as e:
        shardsafe.load(path)
    assert e.value.file == BLOCKS


@pytest.mark.parametrize("bad", ["gzip", "ZSTD", True, 3])
def test_unknown_compression_is_refused_before_writing(tmp_path, bad) -> None:
    path = str(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="compression"):
        shardsafe.save({"w": torch.zeros(3)}, path, compression=bad)
    with pytest.raises(ValueError, match="compression"):
        shardsafe.async_save({"w": torch.zeros(3)}, path, compression=bad)
    assert not os.path.exists(path)
