"""shardsafe.delete: index first, then data; only committed checkpoints; local and fsspec URLs."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

import shardsafe
from shardsafe.engine.commit import is_committed
from shardsafe.storage import storage_for

STATE = {"w": np.arange(1000, dtype=np.float32), "step": 3}


def test_delete_removes_a_local_checkpoint(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "ckpt"
    shardsafe.save(STATE, str(path))
    shardsafe.delete(path)  # os.PathLike is accepted
    assert not path.exists()
    assert os.listdir(tmp_path) == []
    with pytest.raises(shardsafe.CheckpointNotFoundError):
        shardsafe.load(str(path))
    shardsafe.save(STATE, str(path))  # the path is free again: no overwrite needed
    assert shardsafe.load(str(path))["step"] == 3


def test_delete_refuses_what_is_not_committed(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(shardsafe.CheckpointNotFoundError):
        shardsafe.delete(str(tmp_path / "absent"))
    plain = tmp_path / "plain"  # a directory of the user's, not a checkpoint: left untouched
    plain.mkdir()
    (plain / "notes.txt").write_text("mine")
    with pytest.raises(shardsafe.CheckpointNotFoundError):
        shardsafe.delete(str(plain))
    assert (plain / "notes.txt").read_text() == "mine"


def test_delete_uncommits_before_removing_data(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """A crash after the first removal leaves an uncommitted directory, never a checkpoint
    with missing data: the first thing deleted is the index."""
    path = str(tmp_path / "ckpt")
    shardsafe.save(STATE, path)
    from shardsafe.storage.local import LocalStorage

    order: list[str] = []
    real = LocalStorage.delete

    def recording(self, p: str) -> None:  # noqa: ANN001
        order.append(os.path.relpath(p, path))
        real(self, p)
        if len(order) == 1:
            # the moment after the first removal: the data is all there, yet nothing
            # counts as committed any more
            assert not is_committed(self, path)
            assert any(n.endswith(".safetensors") for n in os.listdir(path))

    monkeypatch.setattr(LocalStorage, "delete", recording)
    shardsafe.delete(path)
    assert order[0] == "index.json"
    assert order[-1] == "."
    assert not os.path.exists(path)


def test_delete_on_an_fsspec_url() -> None:
    pytest.importorskip("fsspec")
    url = f"memory://shardsafe-delete-{uuid.uuid4().hex}/ckpt"
    shardsafe.save(STATE, url)
    storage, spath = storage_for(url)
    assert is_committed(storage, spath)
    shardsafe.delete(url)
    assert not is_committed(storage, spath)
    assert storage.list(spath) == []
    with pytest.raises(shardsafe.CheckpointNotFoundError):
        shardsafe.delete(url)
