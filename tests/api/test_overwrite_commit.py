"""Commit and overwrite: only complete checkpoints at the final path; nothing else is written over."""

from __future__ import annotations

import os

import pytest
import torch

import shardsafe


def _hidden(parent) -> list[str]:
    return [n for n in os.listdir(parent) if n.startswith(".")]


def test_existing_checkpoint_is_refused_without_overwrite(tmp_path) -> None:
    path = str(tmp_path / "c")
    shardsafe.save({"w": torch.ones(2)}, path)
    with pytest.raises(shardsafe.CheckpointError, match="overwrite=True"):
        shardsafe.save({"w": torch.zeros(2)}, path)
    assert torch.equal(shardsafe.load(path)["w"], torch.ones(2))
    assert _hidden(tmp_path) == []


def test_overwrite_replaces_and_removes_the_old_checkpoint(tmp_path) -> None:
    path = str(tmp_path / "c")
    shardsafe.save({"w": torch.ones(1000), "old": torch.ones(3)}, path)
    old_inode = os.stat(path).st_ino
    shardsafe.save({"w": torch.zeros(10)}, path, overwrite=True)
    got = shardsafe.load(path)
    assert list(got) == ["w"] and torch.equal(got["w"], torch.zeros(10))
    assert os.stat(path).st_ino != old_inode  # a new directory was swapped in
    assert sorted(os.listdir(path)) == ["data-r00000-000.safetensors", "index.json"]
    assert sorted(os.listdir(tmp_path)) == ["c"]  # the replaced one is gone, no temporaries left


def test_overwrite_of_nothing_just_saves(tmp_path) -> None:
    path = str(tmp_path / "c")
    shardsafe.save({"w": 1}, path, overwrite=True)
    assert shardsafe.load(path) == {"w": 1}


@pytest.mark.parametrize("overwrite", [False, True])
def test_non_checkpoint_directory_is_never_written_over(tmp_path, overwrite: bool) -> None:
    path = tmp_path / "c"
    path.mkdir()
    (path / "precious.txt").write_text("keep me")
    with pytest.raises(shardsafe.CheckpointError, match="not a shardsafe checkpoint"):
        shardsafe.save({"w": torch.ones(1)}, str(path), overwrite=overwrite)
    assert os.listdir(path) == ["precious.txt"] and (path / "precious.txt").read_text() == "keep me"
    assert _hidden(tmp_path) == []


@pytest.mark.parametrize("overwrite", [False, True])
def test_existing_file_is_never_replaced(tmp_path, overwrite: bool) -> None:
    path = tmp_path / "c"
    path.write_text("keep me")
    with pytest.raises((shardsafe.CheckpointError, OSError)):
        shardsafe.save({"w": torch.ones(1)}, str(path), overwrite=overwrite)
    assert path.read_text() == "keep me"
    assert _hidden(tmp_path) == []


def test_empty_directory_is_used(tmp_path) -> None:
    path = tmp_path / "c"
    path.mkdir()
    shardsafe.save({"w": 1}, str(path))
    assert shardsafe.load(str(path)) == {"w": 1}


def test_trailing_slash_and_nested_parent(tmp_path) -> None:
    path = str(tmp_path / "a" / "b" / "c") + "/"
    os.makedirs(os.path.dirname(path.rstrip("/")))
    shardsafe.save({"w": 2}, path)
    assert shardsafe.load(path) == {"w": 2}
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["c"]


@pytest.mark.parametrize("suffix", ["/.", "/./"])
def test_a_path_ending_in_a_dot_names_its_directory(tmp_path, suffix: str) -> None:
    os.makedirs(tmp_path / "c")  # an empty directory the user made, as "." from inside it
    path = str(tmp_path / "c") + suffix  # a string: pathlib would drop the "."
    shardsafe.save({"w": 1}, path)
    shardsafe.save({"w": 2}, path, overwrite=True)
    assert shardsafe.load(path) == {"w": 2}
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    assert not [n for n in os.listdir(os.path.realpath(path)) if n.startswith(".")]


def test_leftover_temporary_of_a_crashed_save_is_not_a_checkpoint(tmp_path) -> None:
    stale = tmp_path / ".c.shardsafe-tmp-deadbeef"
    stale.mkdir()
    (stale / "data-r00000-000.safetensors").write_bytes(b"partial")
    path = str(tmp_path / "c")
    with pytest.raises(shardsafe.CheckpointNotFoundError):
        shardsafe.load(path)
    shardsafe.save({"w": 3}, path)
    assert shardsafe.load(path) == {"w": 3}


def test_index_is_published_last_and_files_are_complete(tmp_path) -> None:
    path = str(tmp_path / "c")
    shardsafe.save({"w": torch.ones(5)}, path)
    st_index = os.stat(os.path.join(path, "index.json"))
    st_data = os.stat(os.path.join(path, "data-r00000-000.safetensors"))
    assert st_index.st_mtime_ns >= st_data.st_mtime_ns
    assert not [n for n in os.listdir(path) if ".tmp" in n]
