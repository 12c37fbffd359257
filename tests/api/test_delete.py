"""shardsafe.delete: index first, then data; only committed checkpoints; local and fsspec URLs."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

import shardsafe
from shardsafe.engine.commit import is_committed
from shardsafe.storage import storage_for

from helpers import incremental_steps

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


def _incremental_steps(root) -> dict:  # noqa: ANN001
    """Steps 1-3 of an incremental save: 2 and 3 reference step 1's data file."""
    import torch

    return incremental_steps(root, {"base": torch.arange(4096, dtype=torch.float32).reshape(128, 32),
                                    "head": torch.zeros(4)})


def _later_steps_load(root, state) -> None:  # noqa: ANN001
    import torch

    for s in (2, 3):
        got = shardsafe.load(str(root / f"step_{s:08d}"))
        assert torch.equal(got["base"], state["base"]) and torch.equal(got["head"], torch.full((4,), float(s)))


@pytest.mark.parametrize("spelling", ["step_00000001/.", "step_00000001/", "./step_00000001/./",
                                      "cwd:.", "cwd:./"])
def test_delete_by_another_spelling_keeps_what_later_steps_use(tmp_path, monkeypatch, spelling: str) -> None:  # noqa: ANN001
    state = _incremental_steps(tmp_path)
    if spelling.startswith("cwd:"):
        monkeypatch.chdir(tmp_path / "step_00000001")
        shardsafe.delete(spelling[4:])
    else:
        monkeypatch.chdir(tmp_path)
        shardsafe.delete(spelling)
    assert not is_committed(storage_for(str(tmp_path))[0], str(tmp_path / "step_00000001"))
    _later_steps_load(tmp_path, state)


def test_delete_through_a_symlink_is_refused(tmp_path) -> None:  # noqa: ANN001
    state = _incremental_steps(tmp_path)
    os.symlink(tmp_path / "step_00000001", tmp_path / "latest")
    for link in (tmp_path / "latest", str(tmp_path / "latest") + "/"):
        with pytest.raises(shardsafe.CheckpointError, match="symbolic link"):
            shardsafe.delete(link)
    assert is_committed(storage_for(str(tmp_path))[0], str(tmp_path / "step_00000001"))
    _later_steps_load(tmp_path, state)
    assert shardsafe.load(str(tmp_path / "step_00000001"))["head"][0] == 1
