"""CheckpointManager on a JAX state, unchanged: a SIGKILLed training process resumes
bit-exactly from the newest step on its local or persistent tier."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
from jax_states import assert_same_tree, train_state

import shardsafe
from shardsafe.harness.processes import child_env

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(HERE, "jax_train_child.py"), *map(str, args)],
                          env=child_env(HERE), capture_output=True, text=True, timeout=240)


def test_sigkilled_jax_training_resumes_bit_exactly(tmp_path, mesh42) -> None:
    d, progress = tmp_path / "ckpt", tmp_path / "progress"
    first = _run(d, progress, 12, 7)
    assert first.returncode == -9, first.stderr[-3000:]
    second = _run(d, progress, 12)
    assert second.returncode == 0, second.stderr[-3000:]
    lines = progress.read_text().splitlines()
    assert lines[0].startswith("resumed 0 ")
    assert lines[1] in ("resumed 7 local", "resumed 6 local"), lines  # the SIGKILL may beat the last local save
    # the same 12 steps without a crash, in this process
    from jax_train_child import digest, update

    state = {"train": train_state(mesh42), "step": 12}
    for _ in range(12):
        state["train"] = update(state["train"])
    assert lines[2] == f"final {digest(state)}"
    mgr = shardsafe.CheckpointManager(d, read_only=True)
    assert mgr.all_steps() == [10, 12]  # every 2 steps, 2 kept
    target = {"train": train_state(mesh42, seed=9), "step": 0}
    assert mgr.restore(target) == 12
    assert_same_tree(target["train"], state["train"])
    assert target["train"].params["dense"]["kernel"].sharding == state["train"].params["dense"]["kernel"].sharding
    assert isinstance(target["train"].params["embed"], jax.Array)
