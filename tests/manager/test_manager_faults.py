"""Fault tolerance with real processes: SIGKILL mid-save, SIGTERM preemption, a full disk,
and a reader next to a writer. The trainer is tests/manager/manager_child.py."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest
import torch
from helpers import committed_steps, kill_rounds, read_progress, wait_for

from shardsafe import CheckpointError, CheckpointManager
from shardsafe.engine.commit import is_temporary
from shardsafe.manager.lock import LOCK_NAME

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from manager_child import expected_state  # noqa: E402

CHILD = os.path.join(HERE, "manager_child.py")
NUMEL = 1 << 17  # 4 tensors x 1 MiB per step


def last_committed(lines: list[str]) -> int:
    return max(committed_steps(lines), default=-1)


def check_directory(directory: str, committed: int) -> bool:
    """A new writable manager starts cleanly; every listed step restores and verifies.

    Returns whether the kill left debris (an unfinished save or delete) to clean up.
    """
    # the killed manager's lock is stale (dead pid) and taken over, not debris of a save
    before = [n for n in os.listdir(directory) if n != LOCK_NAME] if os.path.isdir(directory) else []
    debris = any(is_temporary(n) or not os.path.exists(os.path.join(directory, n, "index.json"))
                 for n in before)
    with CheckpointManager(directory, max_to_keep=2, keep_period=7) as mgr:
        names = os.listdir(directory)
        assert LOCK_NAME in names  # held by this manager, whatever the killed one left
        names.remove(LOCK_NAME)
        assert not [n for n in names if is_temporary(n)], names
        steps = mgr.all_steps()
        assert sorted(f"step_{s:08d}" for s in steps) == sorted(names), names  # nothing half-done
        if committed >= 0:
            assert steps and steps[-1] >= committed, (steps, committed)
        out = expected_state(0, NUMEL)
        for s in steps:
            assert mgr.restore(out, step=s) == s
            want = expected_state(s, NUMEL)
            for k, v in want["model"].items():
                assert torch.equal(out["model"][k], v), (s, k)
            assert out["step"] == s and out["tag"] == f"step-{s}"
    return debris


def kill_cycles(tmp: str, cycles: int, python: str, env: dict, seed: int,
                min_debris: int = 0, max_cycles: int | None = None) -> int:
    """Runs kill/check rounds in one directory (see ``helpers.kill_rounds``); returns how
    many left debris. The child saves asynchronously, synchronously every third round."""
    directory, progress = os.path.join(tmp, "ckpt"), os.path.join(tmp, "progress")

    def start(n: int) -> subprocess.Popen:
        async_save = n % 3 != 2  # mostly async, sometimes synchronous saves
        return subprocess.Popen([python, CHILD, "steady", directory, progress, "--numel", str(NUMEL),
                                 "--max-to-keep", "2", "--keep-period", "7",
                                 "--async-save", str(int(async_save))], env=env)

    return kill_rounds(start, progress, lambda lines: check_directory(directory, last_committed(lines)),
                       seed=seed, delay=(0.0, 0.8), rounds=cycles, min_debris=min_debris,
                       max_rounds=max_cycles)


def test_sigkill_during_saves(tmp_path, python, subprocess_env) -> None:
    debris = kill_cycles(str(tmp_path), 3, python, subprocess_env, seed=1234, min_debris=2,
                         max_cycles=10)
    # the kills really hit unfinished saves/deletes (not only idle moments) and were recovered
    assert debris >= 2, debris


@pytest.mark.stress
@pytest.mark.timeout(3600)
def test_sigkill_during_saves_stress(tmp_path, python, subprocess_env) -> None:
    seed = int(time.time())
    debris = kill_cycles(str(tmp_path), 60, python, subprocess_env, seed=seed)
    print(f"seed {seed}: {debris}/60 kills landed inside a save or delete")
    assert debris >= 5  # the kills really hit unfinished saves/deletes, not only idle moments


def test_sigterm_preemption_saves_and_resumes_exactly(tmp_path, python, subprocess_env) -> None:
    common = ["--steps", "60", "--interval", "10", "--sleep", "0.02", "--numel", "4096"]
    pre_dir, pre_prog = str(tmp_path / "pre"), str(tmp_path / "pre.txt")
    ref_prog = str(tmp_path / "ref.txt")  # the uninterrupted reference runs alongside
    ref = subprocess.Popen([python, CHILD, "train", str(tmp_path / "ref"), ref_prog, *common],
                           env=subprocess_env)
    proc = subprocess.Popen([python, CHILD, "train", pre_dir, pre_prog, "--preempt", *common],
                            env=subprocess_env)
    try:
        wait_for(pre_prog, lambda ln: any(x.startswith("step 13") for x in ln), proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        lines = read_progress(pre_prog)
        preempted = [int(x.split()[1]) for x in lines if x.startswith("preempted ")]
        assert len(preempted) == 1 and preempted[0] >= 13, lines[-4:]
        with CheckpointManager(pre_dir, read_only=True) as ro:
            assert ro.latest_step() == preempted[0]
        # a new process resumes from exactly that step and ends where an uninterrupted run ends
        subprocess.run([python, CHILD, "train", pre_dir, pre_prog, "--preempt", *common],
                       env=subprocess_env, check=True, timeout=120)
        assert ref.wait(timeout=120) == 0
    finally:
        for p in (proc, ref):
            if p.poll() is None:
                p.kill()
                p.wait()
    resumed = read_progress(pre_prog)
    assert f"resumed {preempted[0]}" in resumed
    finals = [x for x in resumed if x.startswith("final ")]
    assert finals and finals == [x for x in read_progress(ref_prog) if x.startswith("final ")]


def test_reader_never_sees_a_partial_step(tmp_path, python, subprocess_env, caplog) -> None:
    directory, progress = str(tmp_path / "ckpt"), str(tmp_path / "progress")
    numel = 1 << 15
    reader = CheckpointManager(directory, read_only=True)
    proc = subprocess.Popen([python, CHILD, "steady", directory, progress, "--numel", str(numel),
                             "--max-to-keep", "2"], env=subprocess_env)
    restored: list[int] = []
    try:
        wait_for(progress, lambda ln: last_committed(ln) >= 1, proc)
        out = expected_state(0, numel)
        deadline = time.monotonic() + 3.0
        with caplog.at_level(logging.WARNING, logger="shardsafe"):
            while time.monotonic() < deadline:
                step = reader.restore(out)
                assert step is not None
                want = expected_state(step, numel)
                for k, v in want["model"].items():
                    assert torch.equal(out["model"][k], v), (step, k)
                assert out["step"] == step
                restored.append(step)
                assert all(s >= step - 2 for s in reader.all_steps())
    finally:
        proc.kill()
        proc.wait()
        reader.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert len(set(restored)) >= 3, restored  # the trainer really was writing meanwhile


# ---------------------------------------------------------------------- full disk
def _mount(kind: str, where: str, tmp: str) -> bool:
    if kind == "tmpfs":
        cmd = ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", where]
    else:
        image = os.path.join(tmp, "disk.img")
        with open(image, "wb") as f:
            f.truncate(8 << 20)
        if shutil.which("mkfs.ext4") is None:
            return False
        r = subprocess.run(["mkfs.ext4", "-q", "-F", image], capture_output=True)
        if r.returncode != 0:
            return False
        cmd = ["mount", "-o", "loop", image, where]
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False


@pytest.fixture
def small_fs() -> Iterator[str]:
    """An 8 MiB filesystem (tmpfs, else a loop-mounted ext4 image); skipped if neither mounts."""
    tmp = tempfile.mkdtemp(prefix="shardsafe-fullfs-")
    where = os.path.join(tmp, "mnt")
    os.mkdir(where)
    if not (_mount("tmpfs", where, tmp) or _mount("ext4", where, tmp)):
        shutil.rmtree(tmp)
        pytest.skip("cannot mount a small filesystem here (see test_file_size_limit for EFBIG)")
    try:
        yield where
    finally:
        subprocess.run(["umount", where], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def big_state(step: int) -> dict:
    return {"w": torch.full((3 << 18,), float(step), dtype=torch.float32)}  # 3 MiB


@pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])
def test_full_disk(small_fs, async_save) -> None:
    directory = os.path.join(small_fs, "ckpt")
    with CheckpointManager(directory, async_save=async_save) as mgr:
        mgr.save(0, big_state(0))
        mgr.save(1, big_state(1))
        if async_save:
            assert mgr.save(2, big_state(2))  # staged in memory; the write fails behind it
            with pytest.raises(CheckpointError, match="step 2.*No space left on device"):
                mgr.save(3, big_state(3))  # the next save raises the failure it waited for
        else:
            with pytest.raises(CheckpointError, match="step 2.*No space left on device"):
                mgr.save(2, big_state(2))
        assert mgr.all_steps() == [0, 1]
        assert sorted(os.listdir(directory)) == [LOCK_NAME, "step_00000000", "step_00000001"]  # no debris
        for s in (0, 1):
            out = big_state(-1)
            assert mgr.restore(out, step=s) == s and torch.equal(out["w"], big_state(s)["w"])
        mgr.delete(0)  # free space
        assert mgr.save(2, big_state(2))
        mgr.wait_until_finished()
        out = big_state(-1)
        assert mgr.restore(out) == 2 and torch.equal(out["w"], big_state(2)["w"])


def test_file_size_limit(tmp_path, python, subprocess_env) -> None:
    """EFBIG from RLIMIT_FSIZE: a real write failure that needs no mount privileges."""
    progress = str(tmp_path / "progress")
    subprocess.run([python, CHILD, "fsize", str(tmp_path / "ckpt"), progress],
                   env=subprocess_env, check=True, timeout=120)
    lines = read_progress(progress)
    assert lines[-1] == "ok"
    assert any(x.startswith("failed saving step 1") and "File too large" in x for x in lines), lines
