"""CheckpointManager on S3 (a real moto server through s3fs): retention, deletion, restore,
and a manager run SIGKILLed mid-upload that leaves no committed step behind."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from shardsafe import manager


def _names(s3, prefix: str) -> list[str]:  # noqa: ANN001
    return sorted(p.rsplit("/", 1)[-1] for p in s3.filesystem().ls(f"{s3.bucket}/{prefix}"))


def test_manager_retention_delete_and_restore_on_s3(s3) -> None:  # noqa: ANN001
    url, opts = s3.url + "/run", s3.storage_options
    with manager.CheckpointManager(url, max_to_keep=2, storage_options=opts) as mgr:
        for step in range(1, 6):
            assert mgr.save(step, {"w": torch.full((3,), float(step)), "step": step},
                            metrics={"loss": 1.0 / step})
        mgr.wait_until_finished()
        assert mgr.all_steps() == [4, 5]
        # deleted on the server (the lock file is the open manager's, removed by close)
        assert _names(s3, "run") == [".shardsafe-manager.lock", "step_00000004", "step_00000005"]
        assert mgr.metrics(5) == {"loss": 0.2}
        mgr.delete(5)
        assert mgr.all_steps() == [4]
    assert _names(s3, "run") == ["step_00000004"]
    with manager.CheckpointManager(url, read_only=True, storage_options=opts) as reader:
        state = {"w": torch.zeros(3), "step": 0}
        assert reader.restore(state) == 4
        assert torch.equal(state["w"], torch.full((3,), 4.0)) and state["step"] == 4


_CHILD = """
import json, sys, torch
from shardsafe.manager import CheckpointManager
opts = json.loads(sys.argv[2])
with CheckpointManager(sys.argv[1], async_save=False, storage_options=opts) as mgr:
    mgr.save(1, {"w": torch.ones(4)})
    print("step 1 committed", flush=True)
    mgr.save(2, {"w": torch.ones(int(sys.argv[3]) // 4)})
    print("step 2 committed", flush=True)
"""


def test_manager_killed_mid_upload_leaves_only_committed_steps(s3, subprocess_env) -> None:  # noqa: ANN001
    url, opts = s3.url + "/run", s3.storage_options
    child = subprocess.Popen([sys.executable, "-c", _CHILD, url, json.dumps(opts), str(320 << 20)],
                             env=subprocess_env, stdout=subprocess.PIPE)
    s3.kill_during_upload(child)
    assert child.stdout.read().decode().splitlines() == ["step 1 committed"]
    with manager.CheckpointManager(url, read_only=True, storage_options=opts) as mgr:
        assert mgr.all_steps() == [1]
        state = {"w": torch.zeros(4)}
        assert mgr.restore(state) == 1 and torch.equal(state["w"], torch.ones(4))
