"""Damaged checkpoints fail loudly: CorruptCheckpointError naming file and key, never bad values."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from helpers import flip_byte

import shardsafe
from shardsafe.format.index.versions import decode_index

DATA = "data-r00000-000.safetensors"


def _state() -> dict:
    return {"w": torch.arange(8, dtype=torch.float32), "b": np.arange(3, dtype=np.int16),
            "s": torch.tensor(1.5, dtype=torch.float64), "n": 2}


def _target() -> dict:
    return {"w": torch.zeros(8), "b": np.zeros(3, np.int16), "s": torch.zeros((), dtype=torch.float64), "n": 0}


@pytest.fixture
def ckpt(tmp_path) -> str:
    path = str(tmp_path / "ckpt")
    shardsafe.save(_state(), path)
    return path


def _chunk_ranges(ckpt: str) -> dict[str, tuple[int, int]]:
    with open(os.path.join(ckpt, "index.json"), "rb") as f:
        index = decode_index(f.read())
    return {".".join(map(str, t.key)): (t.chunks[0].offset, t.chunks[0].nbytes) for t in index.tensors}


def test_every_single_byte_flip_in_tensor_data_is_caught(ckpt) -> None:
    data = os.path.join(ckpt, DATA)
    for key, (off, n) in _chunk_ranges(ckpt).items():
        for pos in range(off, off + n):
            flip_byte(data, pos, 0x01)
            for load in (lambda: shardsafe.load(ckpt), lambda: shardsafe.load(ckpt, _target()),
                         lambda: shardsafe.load(ckpt, mmap=True)):
                with pytest.raises(shardsafe.CorruptCheckpointError) as info:
                    load()
                assert info.value.file == DATA and info.value.key == key
                assert DATA in str(info.value) and repr(key) in str(info.value)
            flip_byte(data, pos, 0x01)  # undo
    assert torch.equal(shardsafe.load(ckpt)["w"], torch.arange(8, dtype=torch.float32))


def test_flip_in_second_checksum_block_of_a_large_tensor(tmp_path) -> None:
    path = str(tmp_path / "big")
    n = (16 << 20) // 4 + 1024  # just over one 16 MiB checksum block
    shardsafe.save({"big": torch.ones(n)}, path)
    off, nbytes = _chunk_ranges(path)["big"]
    flip_byte(os.path.join(path, DATA), off + nbytes - 5, 0x80)
    with pytest.raises(shardsafe.CorruptCheckpointError, match="block 1") as info:
        shardsafe.load(path)
    assert info.value.key == "big"


def test_every_single_bit_flip_in_the_index_is_caught(ckpt) -> None:
    with open(os.path.join(ckpt, "index.json"), "rb") as f:
        raw = f.read()
    decode_index(raw)
    for pos in range(len(raw)):
        for bit in (0x01, 0x20, 0x80):
            damaged = bytearray(raw)
            damaged[pos] ^= bit
            with pytest.raises(shardsafe.CorruptCheckpointError) as info:
                decode_index(bytes(damaged))
            assert info.value.file == "index.json"


def test_flipped_index_byte_through_load(ckpt) -> None:
    flip_byte(os.path.join(ckpt, "index.json"), 40, 0x01)
    with pytest.raises(shardsafe.CorruptCheckpointError, match="index") as info:
        shardsafe.load(ckpt)
    assert info.value.file == "index.json"


@pytest.mark.parametrize("keep", [0, 100, 4096, 4096 + 30, -1])
def test_truncated_data_file_names_file_and_key(ckpt, keep: int) -> None:
    data = os.path.join(ckpt, DATA)
    size = os.path.getsize(data)
    os.truncate(data, keep if keep >= 0 else size + keep)
    for load in (lambda: shardsafe.load(ckpt), lambda: shardsafe.load(ckpt, _target()),
                 lambda: shardsafe.load(ckpt, mmap=True)):
        with pytest.raises(shardsafe.CorruptCheckpointError, match="truncated") as info:
            load()
        assert info.value.file == DATA
        assert info.value.key in _chunk_ranges(ckpt)


def test_data_file_with_extra_bytes(ckpt) -> None:
    with open(os.path.join(ckpt, DATA), "ab") as f:
        f.write(b"\0")
    with pytest.raises(shardsafe.CorruptCheckpointError) as info:
        shardsafe.load(ckpt)
    assert info.value.file == DATA


def test_missing_data_file(ckpt) -> None:
    os.remove(os.path.join(ckpt, DATA))
    with pytest.raises(shardsafe.CorruptCheckpointError, match="missing") as info:
        shardsafe.load(ckpt)
    assert info.value.file == DATA and info.value.key is not None


def test_target_is_unchanged_by_a_failed_index(ckpt) -> None:
    flip_byte(os.path.join(ckpt, "index.json"), 10, 0x01)
    target = _target()
    with pytest.raises(shardsafe.CorruptCheckpointError):
        shardsafe.load(ckpt, target)
    assert torch.equal(target["w"], torch.zeros(8)) and target["n"] == 0


def test_directory_without_index_is_not_a_checkpoint(ckpt, tmp_path) -> None:
    os.remove(os.path.join(ckpt, "index.json"))
    with pytest.raises(shardsafe.CheckpointNotFoundError):
        shardsafe.load(ckpt)
    with pytest.raises(FileNotFoundError):  # CheckpointNotFoundError is also a FileNotFoundError
        shardsafe.load(ckpt, _target())


@pytest.mark.parametrize("kind", ["absent", "empty dir", "file", "tmp dir only"])
def test_not_found(tmp_path, kind: str) -> None:
    path = tmp_path / "c"
    if kind == "empty dir":
        path.mkdir()
    elif kind == "file":
        path.write_bytes(b"x")
    elif kind == "tmp dir only":
        path.mkdir()
        (path / ".c.shardsafe-tmp-abc").mkdir()
    with pytest.raises(shardsafe.CheckpointNotFoundError) as info:
        shardsafe.load(str(path))
    assert str(path) in str(info.value)  # the message names the path that holds no checkpoint


def test_error_hierarchy() -> None:
    for cls in (shardsafe.CorruptCheckpointError, shardsafe.CheckpointNotFoundError,
                shardsafe.StateMismatchError, shardsafe.CheckpointTimeoutError):
        assert issubclass(cls, shardsafe.CheckpointError)
    e = shardsafe.CorruptCheckpointError("bad", file="f", key="k")
    assert str(e) == "bad | file='f' | key='k'" and (e.file, e.key) == ("f", "k")


def test_errors_survive_pickling_across_processes() -> None:
    # frameworks pickle exceptions to carry them between processes (multiprocessing, futures);
    # the attributes must come back intact (pickle here is the test's, never shardsafe's)
    import pickle

    e = pickle.loads(pickle.dumps(shardsafe.CorruptCheckpointError("bad", file="f", key="k")))
    assert (str(e), e.file, e.key) == ("bad | file='f' | key='k'", "f", "k")
    m = pickle.loads(pickle.dumps(shardsafe.StateMismatchError(["a: x", "b: y"])))
    assert m.problems == ["a: x", "b: y"] and "2 key path(s)" in str(m)
    n = pickle.loads(pickle.dumps(shardsafe.CheckpointNotFoundError("no checkpoint at 'p'")))
    assert str(n) == "no checkpoint at 'p'" and isinstance(n, FileNotFoundError)


def test_data_file_symlinked_outside_the_checkpoint_is_refused(ckpt, tmp_path) -> None:
    # even with the right size and checksums, loading must not read outside the checkpoint
    outside = tmp_path / "outside.bin"
    os.replace(os.path.join(ckpt, DATA), outside)
    os.symlink(outside, os.path.join(ckpt, DATA))
    for load in (lambda: shardsafe.load(ckpt), lambda: shardsafe.load(ckpt, _target()),
                 lambda: shardsafe.load(ckpt, mmap=True)):
        with pytest.raises(shardsafe.CorruptCheckpointError) as info:
            load()
        assert info.value.file == DATA


def test_checkpoint_directory_itself_may_be_a_symlink(ckpt, tmp_path) -> None:
    link = tmp_path / "latest"
    os.symlink(ckpt, link)
    assert shardsafe.load(str(link))["n"] == 2
