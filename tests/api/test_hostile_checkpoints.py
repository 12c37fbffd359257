"""Hostile checkpoints (FORMAT.md section 9): nothing outside is read, nothing hangs,
and only CheckpointError comes out. Real symlinks, FIFOs, directories and processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import shardsafe
from shardsafe.manager import CheckpointManager

DATA = "data-r00000-000.safetensors"


def _state() -> dict:
    return {"w": torch.arange(1000, dtype=torch.float32), "n": 2}


@pytest.fixture
def ckpt(tmp_path) -> str:
    path = str(tmp_path / "ckpt")
    shardsafe.save(_state(), path)
    return path


def _forge_small(ckpt: str, size: int) -> None:
    """Re-seals the index (correct checksum) so the data file is ``size`` bytes holding ``w`` =
    four float32 zeros at offset 8: what /dev/zero would supply."""
    from shardsafe.format.checksum import crc32c
    from shardsafe.format.index.versions import decode_index, encode_index

    with open(os.path.join(ckpt, "index.json"), "rb") as f:  # forged in the v1 JSON form
        raw = json.loads(encode_index(decode_index(f.read()), version=1))
    raw.pop("index_checksum")
    raw["files"][0].update(size=size, data_start=8)
    (t,) = raw["tensors"]
    t["chunks"][0].update(offset=8, crc32c=["%08x" % crc32c(bytes(16))])
    prefix = json.dumps(raw, separators=(",", ":"))[:-1].encode()
    with open(os.path.join(ckpt, "index.json"), "wb") as f:
        f.write(prefix + b',"index_checksum":"crc32c:%08x"}\n' % crc32c(prefix))


def test_slash_padded_symlink_to_dev_zero_is_refused(tmp_path) -> None:
    # the link text is padded so the link's lstat size equals the size the index declares
    ckpt = str(tmp_path / "ckpt")
    shardsafe.save({"w": torch.arange(4, dtype=torch.float32)}, ckpt)
    text = "/" * 191 + "dev/zero"
    _forge_small(ckpt, len(text))
    data = os.path.join(ckpt, DATA)
    os.remove(data)
    os.symlink(text, data)
    assert os.lstat(data).st_size == len(text)
    for load in (lambda: shardsafe.load(ckpt), lambda: shardsafe.load(ckpt, mmap=True),
                 lambda: shardsafe.load(ckpt, {"w": torch.ones(4)})):
        with pytest.raises(shardsafe.CorruptCheckpointError) as info:
            load()
        assert info.value.file == DATA and "symbolic link" in str(info.value)


def _loads(ckpt: str) -> list:
    return [lambda: shardsafe.load(ckpt), lambda: shardsafe.load(ckpt, {"w": torch.zeros(1000), "n": 0}),
            lambda: shardsafe.load(ckpt, mmap=True)]


def test_index_symlinked_to_dev_zero_is_refused_unread(ckpt) -> None:
    index = os.path.join(ckpt, "index.json")
    os.remove(index)
    os.symlink("/dev/zero", index)
    for load in _loads(ckpt):
        with pytest.raises(shardsafe.CorruptCheckpointError) as info:
            load()
        assert info.value.file == "index.json"


def test_index_that_is_a_directory_is_corrupt_and_the_manager_falls_back(tmp_path) -> None:
    root = str(tmp_path / "run")
    with CheckpointManager(root) as mgr:
        mgr.save(1, {"x": torch.ones(3)})
        mgr.save(2, {"x": torch.full((3,), 2.0)})
        mgr.wait_until_finished()
    (name,) = [n for n in os.listdir(root) if n.endswith("2") and not n.startswith(".")]
    step2 = os.path.join(root, name)
    index = os.path.join(step2, "index.json")
    os.remove(index)
    os.mkdir(index)
    with pytest.raises(shardsafe.CorruptCheckpointError) as info:
        shardsafe.load(step2)
    assert info.value.file == "index.json" and "directory" in str(info.value)
    with CheckpointManager(root, read_only=True) as mgr:
        state = {"x": torch.zeros(3)}
        assert mgr.restore(state=state) == 1
        assert torch.equal(state["x"], torch.ones(3))


_FIFO_CHILD = textwrap.dedent("""
    import contextlib, io, sys, torch, shardsafe
    from shardsafe.cli import main
    ckpt = sys.argv[1]
    for load in (lambda: shardsafe.load(ckpt), lambda: shardsafe.load(ckpt, mmap=True),
                 lambda: shardsafe.load(ckpt, {"w": torch.zeros(1000), "n": 0})):
        try:
            load()
        except shardsafe.CorruptCheckpointError as e:
            assert "FIFO" in str(e), e
        else:
            sys.exit(5)
    said = io.StringIO()  # shardsafe verify, in the same process
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        code = main(["verify", ckpt])
    assert code != 0 and "FIFO" in said.getvalue(), (code, said.getvalue())
""")


@pytest.mark.parametrize("victim", [DATA, "index.json"])
def test_fifo_is_refused_without_hanging(ckpt, victim) -> None:
    path = os.path.join(ckpt, victim)
    os.remove(path)
    os.mkfifo(path)
    try:  # the loads and `shardsafe verify`, in one child process that must not hang
        r = subprocess.run([sys.executable, "-c", _FIFO_CHILD, ckpt], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a load or shardsafe verify hung on a FIFO in place of {victim}")
    assert r.returncode == 0, r.stderr


def test_socket_and_directory_in_place_of_a_data_file_are_refused(ckpt) -> None:
    import socket

    data = os.path.join(ckpt, DATA)
    os.remove(data)
    os.mkdir(data)
    for load in _loads(ckpt):
        with pytest.raises(shardsafe.CorruptCheckpointError, match="directory"):
            load()
    os.rmdir(data)
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(data)
        for load in _loads(ckpt):
            with pytest.raises(shardsafe.CorruptCheckpointError, match="socket"):
                load()
    finally:
        s.close()


def test_fifo_swapped_in_after_the_index_was_read_does_not_block(ckpt) -> None:
    # the race the lstat check alone would miss: storage.files opens with O_NONBLOCK and fstats
    from shardsafe.storage.files import open_regular

    fifo = os.path.join(ckpt, "late")
    os.mkfifo(fifo)
    with pytest.raises(shardsafe.CorruptCheckpointError, match="FIFO"):
        open_regular(fifo)


_WRITER = textwrap.dedent("""
    import sys, time, torch, shardsafe
    from shardsafe.engine.commit import delete_checkpoint
    from shardsafe.storage import LocalStorage
    path, mode, rounds, N = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    k = 0
    while k < rounds:
        k += 1
        state = {f"t{i}": torch.full((1 << 16,), float(k)) for i in range(N)}
        state["k"] = k
        if mode == "delete":
            shardsafe.save(state, path, overwrite=True)
            delete_checkpoint(LocalStorage(), path)
        else:
            shardsafe.save(state, path, overwrite=True)
    print(k)
""")


_N = 48  # 12 MB in 48 tensors: a load's data phase is long enough to meet a swap


def _race(tmp_path, mode: str, rounds: int) -> dict[str, int]:
    path = str(tmp_path / "race")
    shardsafe.save({f"t{i}": torch.zeros(1 << 16) for i in range(_N)} | {"k": 0}, path)
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, path, mode, str(rounds), str(_N)],
                              stdout=subprocess.PIPE, text=True)
    seen = {"ok": 0, "not_found": 0}
    try:
        while writer.poll() is None:
            try:
                for state in (shardsafe.load(path), shardsafe.load(path, mmap=True)):
                    k = state["k"]
                    for i in range(_N):  # old or new, never a mix
                        assert bool((state[f"t{i}"] == float(k)).all()), (k, i)
                seen["ok"] += 1
            except shardsafe.CheckpointNotFoundError:
                seen["not_found"] += 1
    finally:
        writer.wait(timeout=60)
    assert writer.returncode == 0 and int(writer.stdout.read()) == rounds
    return seen


_ROUNDS = [5, pytest.param(40, marks=pytest.mark.stress)]


@pytest.mark.parametrize("rounds", _ROUNDS)
def test_load_racing_deletion_says_not_found(tmp_path, rounds: int) -> None:
    seen = _race(tmp_path, "delete", rounds)
    assert seen["not_found"] > 0 and seen["ok"] > 0, seen


@pytest.mark.parametrize("rounds", _ROUNDS)
def test_readers_during_overwrite_see_old_or_new(tmp_path, rounds: int) -> None:
    seen = _race(tmp_path, "overwrite", rounds)
    assert seen["ok"] > 0 and seen["not_found"] == 0, seen


_SPARSE = textwrap.dedent("""
    import json, os, resource, sys, torch, shardsafe
    from shardsafe.format.checksum import crc32c
    from shardsafe.format.index.versions import decode_index, encode_index
    ckpt = sys.argv[1]
    shardsafe.save({"w": torch.zeros(4, dtype=torch.uint8)}, ckpt)
    with open(os.path.join(ckpt, "index.json"), "rb") as f:  # forged in the v1 JSON form
        raw = json.loads(encode_index(decode_index(f.read()), version=1))
    raw.pop("index_checksum")
    n = 1 << 40  # a terabyte of tensor over a sparse data file: sizes all agree
    f0 = raw["files"][0]
    f0["size"] = f0["data_start"] + n
    os.truncate(os.path.join(ckpt, f0["name"]), f0["size"])
    raw["block_size"] = 1 << 40
    t = raw["tensors"][0]
    t["shape"] = [n]
    t["chunks"][0].update(offset=f0["data_start"], nbytes=n, shape=[n], crc32c=["00000000"])
    prefix = json.dumps(raw, separators=(",", ":"))[:-1].encode()
    with open(os.path.join(ckpt, "index.json"), "wb") as f:
        f.write(prefix + b',"index_checksum":"crc32c:%08x"}\\n' % crc32c(prefix))
    resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))
    try:
        shardsafe.load(ckpt)
    except shardsafe.CheckpointError as e:
        print("REFUSED", type(e).__name__, e)
""")


def test_sparse_terabyte_checkpoint_fails_with_checkpoint_error(tmp_path) -> None:
    r = subprocess.run([sys.executable, "-c", _SPARSE, str(tmp_path / "ckpt")], capture_output=True,
                       text=True, timeout=300)
    assert r.stdout.startswith("REFUSED CheckpointError cannot allocate"), (r.stdout, r.stderr[-2000:])
