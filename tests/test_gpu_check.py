"""``make gpu-check`` (scripts/gpu-check) on a machine without a GPU: it says that no GPU is
present, exits 0 and measures and writes nothing. On a GPU machine it measures instead
(docs/development.md, "GPU check"), which this test does not start."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: gpu-check would measure")
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_gpu_check_without_a_gpu_says_so_and_measures_nothing(tmp_path) -> None:
    out = tmp_path / "gpu-out"
    env = dict(os.environ, PYTHON=sys.executable)
    r = subprocess.run(["make", "-s", "gpu-check", f"GPU_OUT={out}"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gpu-check: no GPU is present" in r.stdout and "nothing measured" in r.stdout, r.stdout
    assert "CUDA tests" not in r.stdout and "benchmark" not in r.stdout
    assert not out.exists()


def test_gpu_check_needs_an_output_directory() -> None:
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu-check")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "usage: scripts/gpu-check OUT_DIR" in r.stderr
