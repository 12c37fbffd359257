"""engine.commit.diagnose: what a path that holds no committed checkpoint is, said by load,
by the CLI's readers and by a save refusing to write over a file."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import shardsafe
from shardsafe.engine.commit import begin, plan_transaction
from shardsafe.engine.commit.diagnose import describe
from shardsafe.storage import LocalStorage, storage_for


def _manager_dir(path: str, steps=(100, 200, 300)) -> str:
    with shardsafe.CheckpointManager(path) as mgr:
        for s in steps:
            mgr.save(s, {"w": torch.full((3,), float(s))})
    return path


def _unfinished(path: str) -> None:
    """A save that began (working directory, a data file) and never committed."""
    txn = plan_transaction(LocalStorage(), path, overwrite=False)
    begin(txn)
    with open(os.path.join(txn.workdir, "data-r00000-000.safetensors"), "wb") as f:
        f.write(b"\0" * 64)


def _dcp_dir(path: str) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({"w": torch.ones(3)}, checkpoint_id=path)


def _cases(tmp_path) -> dict[str, tuple[str, str]]:  # noqa: ANN001
    """name -> (path, what its message must say)."""
    d = str(tmp_path)
    torch.save({"w": torch.ones(3)}, f"{d}/model.pt")
    torch.save({"w": torch.ones(3)}, f"{d}/legacy.pt", _use_new_zipfile_serialization=False)
    from safetensors.torch import save_file
    save_file({"w": torch.ones(3)}, f"{d}/model.safetensors")
    _dcp_dir(f"{d}/dcp")
    _manager_dir(f"{d}/run")
    _unfinished(f"{d}/half")
    os.makedirs(f"{d}/empty")
    with open(f"{d}/notes.txt", "w") as f:
        f.write("hello")
    shardsafe.save({"w": torch.ones(3)}, f"{d}/ok")
    return {
        "missing": (f"{d}/absent", "does not exist"),
        "torch.save": (f"{d}/model.pt", "is a torch.save file, not a shardsafe checkpoint: `shardsafe import` converts it"),
        "legacy torch.save": (f"{d}/legacy.pt", "is a torch.save file"),
        "safetensors": (f"{d}/model.safetensors", "is a safetensors file, not a shardsafe checkpoint: `shardsafe import`"),
        "dcp": (f"{d}/dcp", "is a DCP checkpoint"),
        "manager": (f"{d}/run", f"is a directory of checkpoints (steps 100, 200, 300), not a checkpoint: "
                                f"load one of them (the newest: '{d}/run/step_00000300'), or restore with "
                                f"`CheckpointManager.restore`"),
        "unfinished": (f"{d}/half", "only an unfinished save"),
        "empty": (f"{d}/empty", "is an empty directory"),
        "other file": (f"{d}/notes.txt", "is a file, not a shardsafe checkpoint"),
        "index file": (f"{d}/ok/index.json", f"load the directory that holds it ('{d}/ok')"),
    }


def test_load_says_what_each_path_is_without_a_chained_traceback(tmp_path) -> None:  # noqa: ANN001
    for name, (path, says) in _cases(tmp_path).items():
        with pytest.raises(shardsafe.CheckpointNotFoundError) as info:
            shardsafe.load(path)
        assert says in str(info.value), name
        assert str(info.value).startswith(repr(path)), name
        assert "deleted" not in str(info.value), name
        assert info.value.__cause__ is None and info.value.__suppress_context__, name


def test_in_place_load_and_the_manager_directory(tmp_path) -> None:  # noqa: ANN001
    run = _manager_dir(str(tmp_path / "run"), steps=(1,))
    with pytest.raises(shardsafe.CheckpointNotFoundError, match=r"directory of checkpoints \(step 1\)"):
        shardsafe.load(run, {"w": torch.zeros(3)})


def test_a_manager_directory_of_many_steps_is_summarised(tmp_path) -> None:  # noqa: ANN001
    run = _manager_dir(str(tmp_path / "run"), steps=range(1, 9))
    text = describe(LocalStorage(), run)
    assert "(8 steps: 1, 2, 3, ..., 8)" in text and "step_00000008" in text


def test_the_half_written_save_inside_a_manager_directory(tmp_path) -> None:  # noqa: ANN001
    run = tmp_path / "run"
    run.mkdir()
    _unfinished(str(run / "step_00000005"))
    assert "holds only an unfinished save" in describe(LocalStorage(), str(run))


def test_object_store_paths(s3) -> None:  # noqa: ANN001
    so = s3.storage_options
    with pytest.raises(shardsafe.CheckpointNotFoundError, match="does not exist"):
        shardsafe.load(s3.url + "/absent", storage_options=so)
    for step in (10, 20):
        shardsafe.save({"w": torch.ones(2)}, f"{s3.url}/run/step_{step:08d}", storage_options=so)
    with pytest.raises(shardsafe.CheckpointNotFoundError,
                       match=rf"directory of checkpoints \(steps 10, 20\).*'{s3.url}/run/step_00000020'"):
        shardsafe.load(s3.url + "/run", storage_options=so)
    shardsafe.save({"w": torch.ones(2)}, f"{s3.url}/half", storage_options=so)
    s3.filesystem().rm(f"{s3.bucket}/half/index.json")  # as if the save died before its commit
    with pytest.raises(shardsafe.CheckpointNotFoundError, match="holds only an unfinished save"):
        shardsafe.load(s3.url + "/half", storage_options=so)
    storage, spath = storage_for(s3.url + "/half", so)
    assert describe(storage, spath, s3.url + "/half").startswith(repr(s3.url + "/half"))


def test_saving_onto_an_existing_file_says_so_and_keeps_it(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "model.pt"
    path.write_bytes(b"precious")
    for overwrite in (False, True):
        with pytest.raises(shardsafe.CheckpointError, match="is an existing file, not a checkpoint directory"):
            shardsafe.save({"w": torch.ones(2)}, str(path), overwrite=overwrite)
    assert path.read_bytes() == b"precious"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]  # no working directory left behind
