"""A local checkpoint as a byte stream and back; malformed streams and unsafe steps are refused."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
import torch

import shardsafe
from shardsafe.errors import CorruptCheckpointError
from shardsafe.format import INDEX_NAME
from shardsafe.manager import peer_copy
from shardsafe.manager.steps import step_name


def stream(out: peer_copy.Outgoing) -> bytes:
    return b"".join(bytes(memoryview(s).cast("B")) for s in out.segments)


def receive(data: bytes, parent: str, chunk: int) -> peer_copy.Received:
    inc = peer_copy.Incoming(parent, step_name)
    for at in range(0, len(data), chunk):
        inc.feed(memoryview(data)[at : at + chunk])
    return inc.done()


@pytest.mark.parametrize("chunk", [1 << 20, 7, 4096])
def test_roundtrip_loads_and_verifies(tmp_path, chunk: int) -> None:
    state = {"w": torch.arange(1000, dtype=torch.float32), "step": 3}
    shardsafe.save(state, str(tmp_path / "src"))
    out = peer_copy.outgoing(3, 1, str(tmp_path / "src"))
    data = stream(out)
    out.close()
    got = receive(data, str(tmp_path / "dst"), chunk)
    assert (got.step, got.rank, got.error) == (3, 1, None)
    assert got.path == str(tmp_path / "dst" / "step_00000003")
    assert sorted(os.listdir(got.path)) == sorted(os.listdir(tmp_path / "src"))
    loaded = {"w": torch.zeros(1000), "step": 0}
    shardsafe.load(got.path, loaded)
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 3
    # a flipped byte in transit is caught by the checksums when loading (the copy replaces
    # the old): one of the tensor's bytes by a load in place; one of the index's last bytes
    # (in rank 0's part of a version 4 index, which this load does not need: "w" is one
    # chunk, in the global part) by a load that reads the whole index
    at = data.index(state["w"].numpy().tobytes()) + 100
    for flip, load in ((at, lambda p: shardsafe.load(p, {"w": torch.zeros(1000), "step": 0})),
                       (len(data) - 10, shardsafe.load)):
        bad = bytearray(data)
        bad[flip] ^= 0xFF
        got = receive(bytes(bad), str(tmp_path / "dst"), chunk)
        with pytest.raises(CorruptCheckpointError):
            load(got.path)


def test_error_notice_and_malformed(tmp_path) -> None:
    got = receive(stream(peer_copy.outgoing(5, 2, None, "disk full")), str(tmp_path), 3)
    assert (got.step, got.rank, got.error, got.path) == (5, 2, "disk full", None)
    with pytest.raises(CorruptCheckpointError, match="malformed"):
        receive(b"\x05\x00\x00\x00\x00\x00\x00\x00{\"a\"", str(tmp_path), 100)
    with pytest.raises(CorruptCheckpointError, match="left over"):
        receive(stream(peer_copy.outgoing(5, 2, None, "x")) + b"abc", str(tmp_path), 100)
    head = b'{"step": 1, "rank": 0, "error": null, "files": [["../x", 3], ["index.json", 2]]}'
    with pytest.raises(CorruptCheckpointError, match="bad file"):
        receive(struct.pack("<Q", len(head)) + head + b"abcde", str(tmp_path), 100)
    assert not os.path.exists(tmp_path / "x")


def test_a_stream_cut_short_commits_nothing(tmp_path) -> None:
    shardsafe.save({"w": torch.ones(4096)}, str(tmp_path / "src"))
    out = peer_copy.outgoing(7, 0, str(tmp_path / "src"))
    data = stream(out)
    out.close()
    inc = peer_copy.Incoming(str(tmp_path / "dst"), step_name)
    inc.feed(memoryview(data)[: len(data) // 2])
    with pytest.raises(CorruptCheckpointError, match="ended early"):
        inc.done()
    assert os.listdir(tmp_path / "dst") == []  # no step, no working directory


def test_fifo_inside_a_step_is_refused_without_blocking(tmp_path) -> None:
    shardsafe.save({"w": torch.ones(10)}, str(tmp_path / "src"))
    os.mkfifo(tmp_path / "src" / "zz-fifo")
    with pytest.raises(CorruptCheckpointError, match="FIFO"):
        peer_copy.outgoing(1, 0, str(tmp_path / "src"))


def test_symlink_inside_a_step_ships_nothing_of_its_target(tmp_path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"do not ship me")
    shardsafe.save({"w": torch.ones(10)}, str(tmp_path / "src"))
    data = max((tmp_path / "src").iterdir(), key=lambda p: p.stat().st_size)
    os.replace(data, tmp_path / "moved")
    os.symlink(secret, data)
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        peer_copy.outgoing(1, 0, str(tmp_path / "src"))
    assert INDEX_NAME in os.listdir(tmp_path / "src")


def test_segments_are_mapped_not_copied(tmp_path) -> None:
    shardsafe.save({"w": torch.ones(1 << 18)}, str(tmp_path / "src"))  # 1 MiB
    out = peer_copy.outgoing(1, 0, str(tmp_path / "src"))
    big = max(out.segments[2:], key=len)
    assert not isinstance(big, (bytes, bytearray, np.ndarray)) and len(big) >= 1 << 20
    out.close()
