"""CheckpointManager(incremental=True): unchanged data written once, references kept alive by
retention, delete and gc, loadable after SIGKILL at any moment, on local disk and S3."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
from helpers import committed_steps, kill_rounds

import shardsafe
from shardsafe import CheckpointManager, CorruptCheckpointError
from shardsafe.engine.commit import is_temporary, read_index
from shardsafe.engine.commit.sweep import marked
from shardsafe.manager.lock import LOCK_NAME
from shardsafe.storage import LocalStorage

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from incremental_child import MAX_TO_KEEP, expected  # noqa: E402

CHILD = os.path.join(HERE, "incremental_child.py")
DATA = "data-r00000-000.safetensors"


def state(step: int, base: torch.Tensor) -> dict:
    return {"model": {"base": base, "adapter": torch.full((1000,), float(step))}, "step": step}


def disk_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs
               if f != LOCK_NAME)


def files_of(path: str) -> list[str]:
    return [f.name for f in read_index(LocalStorage(), path).files]


def assert_loads(path: str, step: int, base: torch.Tensor) -> None:
    out = shardsafe.load(path)  # every chunk's checksums are verified as it is read
    assert torch.equal(out["model"]["base"], base) and out["step"] == step
    assert torch.equal(out["model"]["adapter"], torch.full((1000,), float(step)))


@pytest.mark.parametrize("async_save", [True, False])
def test_frozen_base_is_written_once(tmp_path, async_save: bool) -> None:
    base = torch.randn(1 << 20)  # 4 MiB
    with CheckpointManager(tmp_path, max_to_keep=3, incremental=True, async_save=async_save) as mgr:
        for step in range(10):
            mgr.save(step, state(step, base))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [7, 8, 9]
    assert disk_bytes(str(tmp_path)) <= 1.15 * base.nbytes
    # the base lives in step 0's data file, which is no longer a checkpoint itself
    assert sorted(os.listdir(tmp_path / "step_00000000")) == [DATA]
    for step in (7, 8, 9):
        assert f"step_00000000/{DATA}" in files_of(str(tmp_path / f"step_{step:08d}"))
        assert_loads(str(tmp_path / f"step_{step:08d}"), step, base)


def test_restore_in_place_and_after_a_restart(tmp_path) -> None:
    base = torch.randn(4096)
    with CheckpointManager(tmp_path, max_to_keep=2, incremental=True) as mgr:
        for step in range(3):
            mgr.save(step, state(step, base))
    target = state(0, torch.zeros(4096))
    kept = target["model"]["base"]
    with CheckpointManager(tmp_path, max_to_keep=2, incremental=True) as mgr:
        assert mgr.restore(target) == 2 and target["model"]["base"] is kept
        assert torch.equal(kept, base) and target["step"] == 2
        mgr.save(3, state(3, base))  # after a restart the first save writes everything
        mgr.save(4, state(4, base))
    assert files_of(str(tmp_path / "step_00000003")) == [DATA]
    assert files_of(str(tmp_path / "step_00000004")) == [DATA, f"step_00000003/{DATA}"]
    assert not os.path.exists(tmp_path / "step_00000000")  # nothing references it any more
    assert_loads(str(tmp_path / "step_00000004"), 4, base)


def test_delete_keeps_what_later_steps_reference(tmp_path) -> None:
    base = torch.randn(4096)
    with CheckpointManager(tmp_path, incremental=True) as mgr:
        for step in range(4):
            mgr.save(step, state(step, base))
        mgr.delete(0)
        assert mgr.all_steps() == [1, 2, 3]
        assert os.listdir(tmp_path / "step_00000000") == [DATA]
        shardsafe.delete(str(tmp_path / "step_00000001"))  # the plain API sweeps the same way
        assert not os.path.exists(tmp_path / "step_00000001")  # its own data: referenced by none
        mgr.delete(2)
        assert_loads(str(tmp_path / "step_00000003"), 3, base)
        mgr.delete(3)  # the last step referencing step 0: its data goes too
        assert sorted(os.listdir(tmp_path)) == [LOCK_NAME]
        mgr.save(4, state(4, base))  # the baseline was deleted: a full save
        mgr.wait_until_finished()
        assert files_of(str(tmp_path / "step_00000004")) == [DATA]


def test_rollback_does_not_reference_steps_moved_aside(tmp_path) -> None:
    base = torch.randn(4096)
    with CheckpointManager(tmp_path, incremental=True) as mgr:
        for step in range(4):
            mgr.save(step, state(step, base))
        assert mgr.restore(state(0, torch.zeros(4096)), step=1, rollback=True) == 1
        mgr.save(2, state(2, base))
        mgr.wait_until_finished()
        assert all(f.startswith(("step_00000000/", "step_00000001/")) or f == DATA
                   for f in files_of(str(tmp_path / "step_00000002")))
        assert_loads(str(tmp_path / "step_00000002"), 2, base)
        mgr.save(3, state(3, base), force=True)
    # the rolled-back steps keep referencing step 0, so retention never breaks them
    moved = [n for n in os.listdir(tmp_path) if ".rolled-back-" in n]
    assert len(moved) == 2 and all(shardsafe.load(str(tmp_path / n))["step"] in (2, 3) for n in moved)


def test_a_symlinked_step_directory_is_refused(tmp_path) -> None:
    base = torch.randn(4096)
    with CheckpointManager(tmp_path, incremental=True) as mgr:
        for step in range(2):
            mgr.save(step, state(step, base))
    os.rename(tmp_path / "step_00000000", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", tmp_path / "step_00000000")
    for load in (lambda p: shardsafe.load(p), lambda p: shardsafe.load(p, mmap=True)):
        with pytest.raises(CorruptCheckpointError, match="symbolic link") as e:
            load(str(tmp_path / "step_00000001"))
        assert e.value.file == "step_00000000"


def test_a_missing_referenced_file_is_a_clear_error(tmp_path) -> None:
    base = torch.randn(4096)
    with CheckpointManager(tmp_path, incremental=True) as mgr:
        for step in range(2):
            mgr.save(step, state(step, base))
    shutil.rmtree(tmp_path / "step_00000000")
    with pytest.raises(CorruptCheckpointError, match="missing") as e:
        shardsafe.load(str(tmp_path / "step_00000001"))
    assert e.value.file == f"step_00000000/{DATA}"


def test_memory_object_store_round_trip() -> None:
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://incremental-{os.getpid()}-{time.time_ns()}/run"
    base = torch.randn(4096)
    try:
        with CheckpointManager(url, max_to_keep=2, incremental=True) as mgr:
            for step in range(4):
                mgr.save(step, state(step, base))
            mgr.wait_until_finished()
            assert mgr.all_steps() == [2, 3]
        fs = fsspec.filesystem("memory")
        root = url.split("://", 1)[1]
        assert [p.rsplit("/", 1)[1] for p in fs.ls(f"{root}/step_00000000", detail=False)] == [DATA]
        assert_loads(f"{url}/step_00000003", 3, base)
    finally:
        fsspec.filesystem("memory").rm(url.split("://", 1)[1].split("/")[0], recursive=True)


def test_s3_round_trip(s3) -> None:  # noqa: ANN001, F811
    url = s3.url + "/run"
    base = torch.randn(1 << 16)
    opts = s3.storage_options
    with CheckpointManager(url, max_to_keep=2, incremental=True, storage_options=opts) as mgr:
        for step in range(4):
            mgr.save(step, state(step, base))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [2, 3]
        target = state(0, torch.zeros(1 << 16))
        assert mgr.restore(target) == 3 and torch.equal(target["model"]["base"], base)
    fs = s3.filesystem()
    assert [p.rsplit("/", 1)[1] for p in fs.ls(f"{s3.bucket}/run/step_00000000")] == [DATA]
    assert not fs.exists(f"{s3.bucket}/run/step_00000001")
    index = shardsafe.api.load.read_checkpoint_index(f"{url}/step_00000003", storage_options=opts)
    assert f"step_00000000/{DATA}" in [f.name for f in index.files]


# ------------------------------------------------------------------------------ SIGKILL
def _load_all(directory: str, steps: list[int]) -> None:
    for s in steps:
        out = shardsafe.load(os.path.join(directory, f"step_{s:08d}"))
        want = expected(s)
        assert torch.equal(out["base"], want["base"]) and out["step"] == s
        assert all(torch.equal(out["adapter"][k], v) for k, v in want["adapter"].items())


def _check_after_kill(directory: str, committed: int) -> bool:
    """Every committed step loads bit-exactly (before any cleanup); a new manager sweeps the
    debris, keeps exactly the referenced files, and can save on. Returns whether the kill
    left debris (it landed inside a save or a retention)."""
    keep = marked(LocalStorage(), directory)
    debris = any(is_temporary(n) or not set(os.listdir(os.path.join(directory, n))) <= keep.get(n, set())
                 for n in os.listdir(directory) if n != LOCK_NAME)
    steps = sorted(int(n[5:]) for n in os.listdir(directory)
                   if n.startswith("step_") and os.path.exists(os.path.join(directory, n, "index.json")))
    assert steps and steps[-1] >= committed, (steps, committed)
    _load_all(directory, steps)
    with CheckpointManager(directory, max_to_keep=MAX_TO_KEEP, incremental=True) as mgr:
        assert mgr.all_steps() == steps
        _load_all(directory, steps)  # the start-up clean-up kept what they reference
        names = [n for n in os.listdir(directory) if n != LOCK_NAME]
        assert not [n for n in names if is_temporary(n)], names
        keep = marked(LocalStorage(), directory)
        for n in names:  # what is left is committed, or only files committed steps use
            assert set(os.listdir(os.path.join(directory, n))) <= keep.get(n, set()), n
        nxt = steps[-1] + 1
        mgr.save(nxt, expected(nxt))
        mgr.wait_until_finished()
        out = shardsafe.load(os.path.join(directory, f"step_{nxt:08d}"))
        assert torch.equal(out["base"], expected(nxt)["base"]) and out["step"] == nxt
    return debris


# asynchronous saves by default; synchronous ones too under -m stress
@pytest.mark.parametrize("async_save", [1, pytest.param(0, marks=pytest.mark.stress)])
def test_sigkill_during_incremental_saves_and_retention(tmp_path, python, subprocess_env,
                                                        async_save: int) -> None:
    directory, progress = str(tmp_path / "ckpt"), str(tmp_path / "progress")
    debris = kill_rounds(
        lambda n: subprocess.Popen([python, CHILD, directory, progress, str(async_save)], env=subprocess_env),
        progress, lambda lines: _check_after_kill(directory, max(committed_steps(lines), default=-1)),
        seed=20261125 + async_save, delay=(0.05, 0.6), rounds=3, min_debris=1, max_rounds=8)
    assert debris >= 1  # the kills really landed inside saves or retention
