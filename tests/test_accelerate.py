"""shardsafe.accelerate.training_state with a real Accelerator, across real processes:
N steps + N resumed in a new process == 2N uninterrupted, bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("torchdata")

import torch  # noqa: E402
from helpers import assert_same  # noqa: E402

import shardsafe  # noqa: E402
from shardsafe.harness.processes import child_env  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "accelerate_job.py")
N = 6  # steps per half: the 70-sample loader's epoch (9 batches) ends inside the second half


def run(env: dict[str, str], root: str, steps: int, mode: str) -> dict:
    proc = subprocess.run([sys.executable, JOB, root, str(steps), mode], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return torch.load(os.path.join(root, f"{mode}-{steps}.pt"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, dict, dict]:
    root = tmp_path_factory.mktemp("accelerate")
    env = child_env(OMP_NUM_THREADS="1")
    full = run(env, str(root / "full"), 2 * N, "fresh")
    first = run(env, str(root / "split"), N, "fresh")
    resumed = run(env, str(root / "split"), 2 * N, "resume")
    return str(root), full, first, resumed


def test_a_resumed_process_continues_bit_exactly(runs) -> None:  # noqa: ANN001
    _, full, first, resumed = runs
    assert first["seen"] == full["seen"][:N]
    assert resumed["seen"] == full["seen"][N:]  # the loader went on mid-epoch, same shuffle
    assert resumed["counter"] == full["counter"]  # the registered object came back
    assert resumed["lr"] == full["lr"]  # the scheduler
    for key in ("params", "optim", "rng"):
        assert_same(resumed[key], full[key], key)


def test_training_state_holds_what_save_state_writes(runs) -> None:  # noqa: ANN001
    root = runs[0]
    mgr = shardsafe.CheckpointManager(os.path.join(root, "split", "ckpts"), read_only=True)
    assert mgr.all_steps() == [3, 6, 9, 12]
    ck = shardsafe.load(os.path.join(root, "split", "ckpts", sorted(os.listdir(
        os.path.join(root, "split", "ckpts")))[0]))  # the job saves training_state(acc) itself
    assert sorted(ck) == ["custom", "dataloaders", "models", "optimizers", "rng", "schedulers", "step"]
    assert sorted(ck["models"][0]) == ["0.bias", "0.weight", "3.bias", "3.weight"]
    assert ck["optimizers"][0]["state"][0]["step"] is not None
    assert ck["custom"] == [{"seen": 24}]
    assert list(ck["rng"]) == ["0"]
    assert ck["schedulers"][0]["last_epoch"] == 3
    assert ck["dataloaders"][0]  # the stateful loader's position
