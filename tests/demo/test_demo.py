"""`shardsafe demo` end to end: a real SIGKILL, a real resume in a new process, the report."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

pytestmark = pytest.mark.slow


def _demo(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardsafe", "demo", *args], env=env,
                          capture_output=True, text=True, timeout=240)


def test_demo_crashes_resumes_and_reports_identical(tmp_path, subprocess_env) -> None:
    keep = tmp_path / "run"
    proc = _demo(subprocess_env, "--steps", "120", "--every", "20", "--seed", "3",
                 "--dir", str(keep))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "IDENTICAL" in out and "DIFFERENT" not in out
    crash = int(re.search(r"SIGKILL after step (\d+)", out).group(1))
    resumed_from = int(re.search(r"newest committed checkpoint: step (\d+)", out).group(1))
    lost = int(re.search(r"steps lost\s+(\d+)", out).group(1))
    assert 20 < crash < 120 and crash % 20 != 0  # after a checkpoint, between checkpoints
    assert resumed_from % 20 == 0 and resumed_from < crash
    assert lost == crash - resumed_from > 0
    assert re.search(r"checkpoints\s+6 written", out)  # steps 20, 40, ..., 120
    assert re.search(r"blocked\s+[\d.]+ ms in all by checkpointing; per save [\d.]+ ms mean", out)
    # --dir keeps the checkpoints: the crashed and the resumed run wrote the same steps
    steps = sorted(p.name for p in (keep / "checkpoints").iterdir() if not p.name.startswith("."))
    assert steps == [f"step-{s:08d}" for s in range(20, 121, 20)]


def test_demo_reports_a_wrong_resume_as_different(tmp_path, subprocess_env) -> None:
    # the hidden --corrupt-resume forgets the RNG state when resuming: dropout masks change
    env = dict(subprocess_env, TMPDIR=str(tmp_path))
    proc = _demo(env, "--steps", "60", "--every", "10", "--corrupt-resume")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DIFFERENT" in proc.stdout and "IDENTICAL" not in proc.stdout
    assert re.search(r"^\s+model\.\d\.weight: values differ", proc.stdout, re.M)
    assert re.search(r"^\s+rng\.torch: values differ", proc.stdout, re.M)
    # the default temporary directory is removed (torch may leave its own cache there)
    assert not [n for n in os.listdir(tmp_path) if n.startswith("shardsafe-demo-")]


def test_demo_rejects_options_that_leave_no_room_for_a_crash(subprocess_env) -> None:
    proc = _demo(subprocess_env, "--steps", "10", "--every", "10")
    assert proc.returncode == 2
    assert "leaves no room for a crash" in proc.stderr


def test_demo_refuses_a_non_empty_directory(tmp_path, subprocess_env) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    proc = _demo(subprocess_env, "--dir", str(tmp_path))
    assert proc.returncode != 0
    assert "not empty" in proc.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"
