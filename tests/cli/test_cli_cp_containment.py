"""``shardsafe cp`` writes nothing outside its destination: an incremental step's referenced
files travel inside the copy (even when a forged reference names someone else's
directory), and a destination that is a symbolic link is refused with a message that says
so, before anything is written."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import shardsafe
from shardsafe.cli import main
from shardsafe.engine.commit import read_index
from shardsafe.format import INDEX_NAME
from shardsafe.format.index.versions import encode_renamed
from shardsafe.storage import LocalStorage


def _incremental_run(run) -> None:  # noqa: ANN001
    with shardsafe.CheckpointManager(run, incremental=True, async_save=False) as mgr:
        for step in (1, 2):
            mgr.save(step, {"base": torch.arange(4096.0), "head": torch.full((8,), float(step))})


def _files(root) -> list[str]:  # noqa: ANN001
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_a_copied_step_carries_the_files_it_references(tmp_path) -> None:  # noqa: ANN001
    run, out = tmp_path / "run", tmp_path / "out"
    _incremental_run(run)
    want = shardsafe.load(str(run / "step_00000002"))
    assert any(f.reference for f in read_index(LocalStorage(), str(run / "step_00000002")).files)
    assert main(["cp", str(run / "step_00000002"), str(out / "copy")]) == 0
    assert os.listdir(out) == ["copy"]  # no step_00000001 beside it
    index = read_index(LocalStorage(), str(out / "copy"))
    assert not any(f.reference for f in index.files)
    shutil.rmtree(run)
    got = shardsafe.load(str(out / "copy"))
    assert torch.equal(got["base"], want["base"]) and torch.equal(got["head"], want["head"])
    assert main(["verify", str(out / "copy")]) == 0
    assert main(["cp", str(out / "copy"), str(tmp_path / "again")]) == 0  # and copies on as it is


def test_a_forged_reference_does_not_make_cp_write_beside_the_destination(tmp_path) -> None:  # noqa: ANN001
    run, out = tmp_path / "run", tmp_path / "out"
    _incremental_run(run)
    shutil.copytree(run / "step_00000001", run / "victim_000001")  # what the forged reference names
    step = str(run / "step_00000002")
    index = read_index(LocalStorage(), step)
    names = [f"victim_000001/{f.reference[1]}" if f.reference else f.name for f in index.files]
    with open(os.path.join(step, INDEX_NAME), "wb") as f:
        f.write(encode_renamed(index, names))  # a valid index (checksums recomputed)
    assert {f.reference[0] for f in read_index(LocalStorage(), step).files if f.reference} == {"victim_000001"}
    assert main(["cp", step, str(out / "copy")]) == 0
    assert sorted(os.listdir(out)) == ["copy"], _files(out)  # no out/victim_000001
    assert all("/" not in f and not f.startswith("..") for f in _files(out / "copy"))
    got = shardsafe.load(str(out / "copy"))
    assert torch.equal(got["base"], torch.arange(4096.0)) and torch.equal(got["head"], torch.full((8,), 2.0))


@pytest.mark.parametrize("target", ["empty-directory", "nowhere"])
def test_a_symlinked_destination_is_refused_saying_so(tmp_path, capsys, target: str) -> None:  # noqa: ANN001
    src = tmp_path / "src"
    shardsafe.save({"w": torch.ones(3)}, src)
    if target == "empty-directory":
        (tmp_path / target).mkdir()
    os.symlink(tmp_path / target, tmp_path / "dst")
    assert main(["cp", str(src), str(tmp_path / "dst")]) != 0
    err = capsys.readouterr().err
    assert "symbolic link" in err and "two writers" not in err, err
    assert sorted(os.listdir(tmp_path)) == sorted({"src", "dst", target} - {"nowhere"})  # nothing written
    if target == "empty-directory":
        assert os.listdir(tmp_path / target) == []


def test_a_save_onto_a_symlink_says_so_too(tmp_path) -> None:  # noqa: ANN001
    os.symlink(tmp_path / "nowhere", tmp_path / "dst")
    with pytest.raises(shardsafe.CheckpointError, match="symbolic link"):
        shardsafe.save({"w": torch.ones(3)}, tmp_path / "dst")
