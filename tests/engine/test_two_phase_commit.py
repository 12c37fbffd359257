"""The store-based two-phase commit refuses parts that do not cover every tensor.

The save runs through the real pipeline (``prepare``, then ``run``: begin, feed,
checksums, sinks, ``ends.Commit``) with a store channel, so the commit goes through
``engine.commit.two_phase`` exactly as a collective save's coordinator does; only the
plan of this rank's data file is cut short, as a planner bug would leave it.
"""

from __future__ import annotations

import os

import pytest
import torch

import shardsafe
from shardsafe.comm import LocalChannel, SingleProcessComm
from shardsafe.engine.buffers import BouncePool
from shardsafe.engine.commit import is_committed
from shardsafe.engine.save.feeds import PoolFeed
from shardsafe.engine.save.prepare import PreparedSave, prepare
from shardsafe.engine.save.ends import Commit
from shardsafe.engine.save.request import SaveRequest
from shardsafe.engine.save.run import Pipeline, run
from shardsafe.engine.save.units import UNIT_SIZE
from shardsafe.errors import CheckpointError
from shardsafe.plan.layout import data_file_name, plan_file


def _state() -> dict:
    return {"a": torch.arange(1000, dtype=torch.float32), "b": torch.ones(3, 5, dtype=torch.int64)}


def _collective_save(path: str, *, drop_last_item: bool) -> PreparedSave:
    """Saves ``_state()`` through the store-based commit; optionally loses tensor "b"."""
    prep = prepare(SaveRequest(state=_state(), path=path), SingleProcessComm(), None)
    prep.channel, prep.timeout = LocalChannel(), 10.0  # the coordinator's side of the store
    if drop_last_item:
        items = prep.plans[0].items
        prep.plans = [plan_file(data_file_name(0), items[:-1])]
    pipe = Pipeline(prep, [], PoolFeed(BouncePool(UNIT_SIZE, 2)), Commit(prep), unit_size=UNIT_SIZE,
                    block_unit=UNIT_SIZE, window=1)
    for _ in run(pipe):
        pass
    return prep


def test_complete_parts_commit(tmp_path) -> None:
    path = str(tmp_path / "ok")
    prep = _collective_save(path, drop_last_item=False)
    assert is_committed(prep.storage, path)
    got = shardsafe.load(path)
    assert torch.equal(got["a"], _state()["a"]) and torch.equal(got["b"], _state()["b"])


def test_a_tensor_without_chunks_is_never_committed(tmp_path) -> None:
    path = str(tmp_path / "lost")
    with pytest.raises(CheckpointError, match=r"chunks of 'b' hold 0 elements.*needs 15"):
        _collective_save(path, drop_last_item=True)
    assert not os.path.exists(path)  # neither committed nor left half-written at the final path
    assert os.listdir(tmp_path) == []  # the working directory is gone too


def test_entries_above_the_store_limit_travel_as_a_checked_file(tmp_path, monkeypatch) -> None:
    """Rank 1's entries, larger than the store may carry, go as a file of the working
    directory; rank 0 refuses one that changed on the way and removes the file it read."""
    from types import SimpleNamespace

    from shardsafe.engine.commit import begin, plan_transaction, two_phase
    from shardsafe.engine.commit.entries import encode as encode_entries
    from shardsafe.errors import CorruptCheckpointError
    from shardsafe.storage import LocalStorage

    captured = []
    real = two_phase.commit_collective
    monkeypatch.setattr(two_phase, "commit_collective", lambda prep, local: (captured.append(local), real(prep, local)))
    _collective_save(str(tmp_path / "ok"), drop_last_item=False)
    data = encode_entries(captured[0])
    monkeypatch.setattr(two_phase, "STORE_MAX", len(data) - 1)
    storage = LocalStorage()
    txn = plan_transaction(storage, str(tmp_path / "big"), overwrite=False, token="t")
    begin(txn)
    rank1 = SimpleNamespace(txn=txn, comm=SimpleNamespace(rank=1))
    message = two_phase._message(rank1, data)
    file = os.path.join(txn.workdir, "entries-r1")
    assert message[:1] == b"F" and len(message) < 200 and os.path.getsize(file) == len(data)
    with open(file, "r+b") as f:  # one flipped byte
        f.seek(len(data) // 2)
        b = f.read(1)
        f.seek(len(data) // 2)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(CorruptCheckpointError, match="CRC32C mismatch: rank 1"):
        two_phase._entries(rank1, 1, message)
    two_phase._message(rank1, data)  # written again, whole
    with pytest.raises(CorruptCheckpointError, match="entries named"):
        two_phase._entries(rank1, 2, message)  # rank 2 must not hand in rank 1's file
    got = two_phase._entries(rank1, 1, message)
    assert encode_entries(got) == data and not os.path.exists(file)
    assert two_phase._message(rank1, data[: len(data) - 1])[:1] == b"R"  # at the limit: the store
