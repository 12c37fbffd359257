"""`shardsafe demo --nproc 2`: an FSDP2 job on 2 ranks, SIGKILLed, preempted, resumed,
compared. The whole demo (four jobs) runs under -m stress; by default one preempted job
checks the ranks' agreement on the step they save."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

pytest.importorskip("torchdata")

from shardsafe import CheckpointManager  # noqa: E402
from shardsafe.demo.distributed import run_job  # noqa: E402

pytestmark = pytest.mark.slow


def _demo(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardsafe", "demo", "--nproc", "2", *args],
                          env=env, capture_output=True, text=True, timeout=400)


def test_a_preempted_job_saves_one_agreed_step_on_every_rank(tmp_path) -> None:  # noqa: ANN001
    ckpts = str(tmp_path / "checkpoints")
    log = run_job("preempted", 2, ["--steps", "40", "--seed", "0", "--dir", ckpts, "--every", "8"],
                  timeout_s=300, signal_at=(10, signal.SIGTERM))
    assert log.returncode == 0 and log.preempted_step is not None and log.preempted_step >= 10, log
    with CheckpointManager(ckpts, read_only=True) as mgr:
        assert mgr.latest_step() == log.preempted_step
    step_dir = os.path.join(ckpts, f"step_{log.preempted_step:08d}")
    assert sorted(n for n in os.listdir(step_dir) if n.startswith("data-")) == [
        "data-r00000-000.safetensors", "data-r00001-000.safetensors"]


@pytest.mark.stress
def test_distributed_demo_resumes_bit_identically(tmp_path, subprocess_env) -> None:  # noqa: ANN001
    keep = tmp_path / "run"
    proc = _demo(subprocess_env, "--steps", "40", "--every", "8", "--dir", str(keep))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "IDENTICAL" in out and "on 2 ranks" in out and "problem" not in out
    crash = int(re.search(r"once step (\d+) was reported \(planned \d+\); the next job resumed "
                          r"from step (\d+)", out).group(1))
    resumed_from = int(re.search(r"the next job resumed from step (\d+)", out).group(1))
    assert 8 < crash < 40 and resumed_from == crash - crash % 8
    agreed = re.search(r"the ranks agreed on step (\d+), saved it and exited; the next job "
                       r"resumed from step (\d+)", out)
    assert agreed and agreed.group(1) == agreed.group(2)  # resumed from exactly that step
    # one data file per rank in every committed step
    step_dir = keep / "checkpoints" / "step_00000040"
    assert sorted(p.name for p in step_dir.iterdir() if p.name.startswith("data-")) == [
        "data-r00000-000.safetensors", "data-r00001-000.safetensors"]


@pytest.mark.stress
def test_distributed_demo_reports_a_wrong_resume(tmp_path, subprocess_env) -> None:  # noqa: ANN001
    proc = _demo(subprocess_env, "--steps", "40", "--every", "8", "--corrupt-resume")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DIFFERENT" in proc.stdout
    assert re.search(r"rng\.[01]\.torch: values differ", proc.stdout)


def test_nproc_must_be_positive(cli) -> None:  # noqa: ANN001
    proc = cli("demo", "--nproc", "0")
    assert proc.returncode == 2 and "--nproc must be at least 1" in proc.stderr, proc.stderr
