"""shardsafe.torchtitan.ShardsafeCheckpointManager with torchtitan's own ModelWrapper,
OptimizersContainer and LRSchedulersContainer around an FSDP2 model, on 2 gloo ranks: a
run killed with SIGKILL mid-training and resumed by a new job ends bit for bit where the
uninterrupted run ends; the model-only export and explicit steps load as torchtitan's
checkpointer would. (torchtitan's Trainer itself needs a CUDA device: see the guide.)"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

pytest.importorskip("torchtitan")

import torch  # noqa: E402
from dist_harness import run_job, run_script  # noqa: E402
from helpers import assert_same  # noqa: E402

from shardsafe.torchtitan import (  # noqa: E402
    EXPORT_DTYPE,
    EXPORT_DTYPES,
    MODEL_ONLY,
    ShardsafeCheckpointManager,
)

JOB = "torchtitan_job.py"


def _run(root: str, async_mode: str) -> None:
    first = run_job(JOB, 2, root, "first", async_mode, timeout=240)
    assert not first.hung and first.codes == [-signal.SIGKILL] * 2, first.logs()
    run_script(JOB, 2, root, "resume", async_mode, timeout=240)
    for rank in range(2):
        full = torch.load(os.path.join(root, f"first-r{rank}.pt"))
        resumed = torch.load(os.path.join(root, f"resume-r{rank}.pt"))
        # the newest step committed before the kill (an async save of step 4 may not be)
        assert resumed["resumed_at"] == 4 or (async_mode != "disabled" and resumed["resumed_at"] == 2)
        for key in ("model", "optim", "lr", "ts"):
            assert_same(resumed[key], full[key], key)
        assert resumed["steps"] == [6, 8]  # keep_latest_k=2
        assert resumed["export_metrics"] == {MODEL_ONLY: 1, EXPORT_DTYPE: EXPORT_DTYPES.index(torch.bfloat16)}
        want = {k: v.to(torch.bfloat16) for k, v in full["model"].items()}
        assert_same(resumed["export_model"], {k: v.float() for k, v in want.items()}, "export")


def test_killed_and_resumed_bit_exact_async(tmp_path) -> None:  # noqa: ANN001
    _run(str(tmp_path), "async")


@pytest.mark.stress
def test_killed_and_resumed_bit_exact_sync(tmp_path) -> None:  # noqa: ANN001
    _run(str(tmp_path), "disabled")


def test_config_checks() -> None:
    with pytest.raises(ValueError, match="Hugging Face"):
        ShardsafeCheckpointManager.Config(enable=True, last_save_in_hf=True)
    with pytest.raises(ValueError, match="keep_latest_k"):  # torchtitan's own checks still run
        ShardsafeCheckpointManager.Config(keep_latest_k=-1)
    disabled = ShardsafeCheckpointManager.Config().build(
        dataloader=None, model_parts=[], optimizers=None, lr_schedulers=None, states={}, sd_adapter=None)
    assert isinstance(disabled, ShardsafeCheckpointManager) and disabled.save(10) is False


_UNCLOSED = """
import sys, torch
from shardsafe.torchtitan import ShardsafeCheckpointManager as M
ck = M(M.Config(enable=True, folder="ck", interval=1), dataloader=None, model_parts=[torch.nn.Linear(2, 2)],
       optimizers=None, lr_schedulers=None, states={}, sd_adapter=None, base_folder=sys.argv[1])
keep = [ck]  # referenced until the interpreter tears down, as a trainer's attribute is
raise RuntimeError("an error of the user's own")
"""


def test_an_unclosed_checkpointer_prints_nothing_of_its_own(tmp_path, python, subprocess_env) -> None:  # noqa: ANN001
    proc = subprocess.run([python, "-c", _UNCLOSED, str(tmp_path)], capture_output=True, text=True,
                          env=subprocess_env, timeout=120)
    assert proc.returncode == 1
    assert "Exception ignored" not in proc.stderr and "NoneType" not in proc.stderr, proc.stderr
    assert proc.stderr.rstrip().endswith("RuntimeError: an error of the user's own"), proc.stderr
