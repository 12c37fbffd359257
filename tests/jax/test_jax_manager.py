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
    from jax_train_child import digest, options, update

    d, progress = tmp_path / "ckpt", tmp_path / "progress"
    first = _run(d, progress, 12, 7)
    assert first.returncode == -9, first.stderr[-3000:]
    assert progress.read_text().startswith("resumed 0 ")
    # resume here, as the restarted job would: from the newest step of the fastest tier
    state = {"train": train_state(mesh42, seed=9), "step": 0}
    mgr = shardsafe.CheckpointManager(d, **options(d))
    start = mgr.restore(state)
    assert start in (6, 7) and mgr.last_restore.tier == "local", mgr.last_restore  # the SIGKILL may beat step 7
    assert state["step"] == start and isinstance(state["train"].params["embed"], jax.Array)
    for step in range(start + 1, 13):
        state["train"], state["step"] = update(state["train"]), step
        mgr.save(step, state)
    mgr.wait_until_finished()
    assert mgr.all_steps() == [10, 12]  # every 2 steps, 2 kept
    mgr.close()
    # the same 12 steps without a crash
    ref = {"train": train_state(mesh42), "step": 12}
    for _ in range(12):
        ref["train"] = update(ref["train"])
    assert digest(state) == digest(ref)
    assert_same_tree(state["train"], ref["train"])
    got, want = state["train"].params["dense"]["kernel"], ref["train"].params["dense"]["kernel"]
    assert got.sharding == want.sharding
    target = {"train": train_state(mesh42, seed=5), "step": 0}
    assert shardsafe.CheckpointManager(d, read_only=True).restore(target) == 12
    assert_same_tree(target, ref)
