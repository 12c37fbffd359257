"""A local checkpoint as one message and back; malformed messages are refused."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import shardsafe
from shardsafe.errors import CorruptCheckpointError
from shardsafe.format import INDEX_NAME
from shardsafe.manager import peer_copy


def test_roundtrip_loads_and_verifies(tmp_path) -> None:
    state = {"w": torch.arange(1000, dtype=torch.float32), "step": 3}
    shardsafe.save(state, str(tmp_path / "src"))
    msg = peer_copy.pack(3, 1, str(tmp_path / "src"))
    m = peer_copy.unpack(msg)
    assert (m.step, m.rank, m.error) == (3, 1, None)
    assert INDEX_NAME in m.files and len(m.files) == len(os.listdir(tmp_path / "src"))
    path = peer_copy.write_step(m.files, str(tmp_path / "dst"), "step_00000003")
    out = {"w": torch.zeros(1000), "step": 0}
    shardsafe.load(path, out)
    assert torch.equal(out["w"], state["w"]) and out["step"] == 3
    # a flipped byte in transit is caught by the checksums when loading
    bad = msg.copy()
    bad[-10] ^= 0xFF
    path = peer_copy.write_step(peer_copy.unpack(bad).files, str(tmp_path / "dst"), "step_00000003")
    with pytest.raises(CorruptCheckpointError):
        shardsafe.load(path, {"w": torch.zeros(1000), "step": 0})


def test_error_notice_and_malformed() -> None:
    m = peer_copy.unpack(peer_copy.pack(5, 2, None, "disk full"))
    assert (m.step, m.rank, m.error, m.files) == (5, 2, "disk full", {})
    with pytest.raises(CorruptCheckpointError, match="malformed"):
        peer_copy.unpack(np.frombuffer(b"\x05\x00\x00\x00\x00\x00\x00\x00{\"a\"", dtype=np.uint8))
    msg = peer_copy.pack(5, 2, None, "x")
    with pytest.raises(CorruptCheckpointError, match="left over"):
        peer_copy.unpack(np.concatenate([msg, np.zeros(3, dtype=np.uint8)]))
