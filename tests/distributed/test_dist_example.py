"""The torchrun example of docs/guides/fsdp2.md runs, checkpoints, and resumes on another world size."""

from __future__ import annotations

import os
import subprocess
import sys

from dist_harness import SRC

from shardsafe.comm import free_loopback_port
from shardsafe.harness.processes import child_env

EXAMPLE = os.path.join(os.path.dirname(SRC), "examples", "fsdp_torchrun.py")


def torchrun(nproc: int, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                          f"--master_port={free_loopback_port()}", EXAMPLE, *args], env=child_env(OMP_NUM_THREADS="1"),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out.stdout


def test_example_trains_saves_and_resumes_on_more_ranks(tmp_path) -> None:  # noqa: ANN001
    ckpt = str(tmp_path / "ckpt")
    first = torchrun(2, "--dir", ckpt, "--steps", "6", "--every", "2")
    assert "starting at step 0 (restored: None)" in first
    assert "stopped at step 6, checkpoints: [2, 4, 6]" in first
    second = torchrun(3, "--dir", ckpt, "--steps", "9", "--every", "2")
    assert "starting at step 6 (restored: 6)" in second
    assert "stopped at step 9, checkpoints: [4, 6, 8]" in second
