"""A manager directory never deletes or lists through a symlinked step entry.

Each case points a ``step_N`` entry of a manager directory at a directory outside it
(someone else's files, or someone else's committed checkpoint) and checks that the
leftover clean-up of a writable manager, retention, listing and restore leave the
target untouched and ignore the link.
"""

from __future__ import annotations

import os

import pytest
import torch

import shardsafe
from shardsafe import CheckpointManager
from shardsafe.manager.steps import StepDirectory, step_name
from shardsafe.storage import LocalStorage


def _victim(tmp_path) -> str:  # noqa: ANN001
    victim = tmp_path / "elsewhere"
    victim.mkdir()
    (victim / "notes.txt").write_text("not a checkpoint")
    (victim / "data-r00000-000.safetensors").write_bytes(b"\0" * 64)
    return str(victim)


def _other_checkpoint(tmp_path) -> str:  # noqa: ANN001
    other = str(tmp_path / "other_run" / "ckpt")
    shardsafe.save({"w": torch.full((4,), 9.0)}, other)
    with open(os.path.join(other, "unrelated.txt"), "w") as f:
        f.write("keep me")
    return other


def _contents(path: str) -> list[str]:
    return sorted(os.listdir(path))


def test_leftover_cleanup_does_not_follow_a_symlinked_step(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    victim = _victim(tmp_path)
    before = _contents(victim)
    os.symlink(victim, run / step_name(3))  # no index: looks like a half-deleted step
    with CheckpointManager(run, async_save=False) as mgr:  # writable: removes leftovers
        assert mgr.all_steps() == []
        assert mgr.save(5, {"w": torch.ones(2)})
    assert _contents(victim) == before
    assert os.path.islink(run / step_name(3))  # the link itself is left alone too


def test_retention_does_not_delete_a_symlinked_committed_step(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    other = _other_checkpoint(tmp_path)
    before = _contents(other)
    os.symlink(other, run / step_name(1))  # someone else's committed checkpoint, step 1
    with CheckpointManager(run, async_save=False, max_to_keep=1) as mgr:
        assert mgr.all_steps() == []  # not listed: a link is never followed
        for step in (2, 3):
            assert mgr.save(step, {"w": torch.full((4,), float(step))})
        assert mgr.all_steps() == [3]
    assert _contents(other) == before
    assert torch.equal(shardsafe.load(other)["w"], torch.full((4,), 9.0))


def test_restore_does_not_report_a_symlinked_step(tmp_path) -> None:
    run = tmp_path / "run"
    with CheckpointManager(run, async_save=False) as mgr:
        assert mgr.save(100, {"w": torch.full((2,), 100.0)})
    os.symlink(run / step_name(100), run / step_name(200))
    with CheckpointManager(run, read_only=True) as mgr:
        state = {"w": torch.zeros(2)}
        assert mgr.restore(state) == 100
        assert torch.equal(state["w"], torch.full((2,), 100.0))
        assert mgr.all_steps() == [100]


def test_step_directory_skips_links_in_every_listing(tmp_path, caplog) -> None:  # noqa: ANN001
    run = tmp_path / "run"
    run.mkdir()
    other = _other_checkpoint(tmp_path)
    os.symlink(other, run / step_name(7))
    os.symlink(_victim(tmp_path), run / ".step_00000008.shardsafe-tmp-0123456789abcdef")
    steps = StepDirectory(LocalStorage(), str(run))
    with caplog.at_level("WARNING", logger="shardsafe"):
        assert steps.committed() == {}
        assert steps.leftovers() == []
        assert steps.remove_leftovers() == []
        assert steps.sweep() == []
    assert "symbolic link" in caplog.text and step_name(7) in caplog.text
    assert os.path.islink(run / step_name(7)) and _contents(other)


def test_a_fifo_named_like_a_step_is_not_a_leftover(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / step_name(4))
    steps = StepDirectory(LocalStorage(), str(run))
    assert steps.leftovers() == []
    assert steps.remove_leftovers() == []
    assert os.path.exists(run / step_name(4))


@pytest.mark.parametrize("target", ["victim", "checkpoint"])
def test_delete_of_a_step_refuses_a_link(tmp_path, target: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    dest = _victim(tmp_path) if target == "victim" else _other_checkpoint(tmp_path)
    before = _contents(dest)
    os.symlink(dest, run / step_name(1))
    steps = StepDirectory(LocalStorage(), str(run))
    with pytest.raises(shardsafe.CheckpointError, match="symbolic link"):
        steps.delete(1)
    assert _contents(dest) == before


def test_a_copied_step_is_restored_as_the_step_its_index_records(tmp_path, caplog) -> None:  # noqa: ANN001
    import shutil

    run = tmp_path / "run"
    with CheckpointManager(run, async_save=False) as mgr:
        assert mgr.save(100, {"w": torch.full((2,), 100.0)})
    shutil.copytree(run / step_name(100), run / step_name(200))  # a copy named step 200
    with CheckpointManager(run, read_only=True) as mgr:
        with pytest.raises(shardsafe.CorruptCheckpointError, match="holds step 100"):
            mgr.restore({"w": torch.zeros(2)}, step=200)
        state = {"w": torch.zeros(2)}
        assert mgr.restore(state) == 100  # 200 is refused as damaged, 100 restored
        assert torch.equal(state["w"], torch.full((2,), 100.0))
    assert "holds step 100" in caplog.text
