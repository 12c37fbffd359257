"""`shardsafe demo` end to end: a real SIGKILL and SIGTERM, real resumes in new processes.

The run with a wrong resume (reported DIFFERENT) runs under -m stress; the report's
rendering of differences is checked by test_demo_report.py."""

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


def _int(pattern: str, text: str) -> int:
    m = re.search(pattern, text)
    assert m is not None, f"{pattern!r} not in:\n{text}"
    return int(m.group(1))


def test_demo_crashes_preempts_resumes_and_reports_identical(tmp_path, subprocess_env, cli) -> None:  # noqa: ANN001
    keep = tmp_path / "run"
    proc = _demo(subprocess_env, "--steps", "120", "--every", "20", "--keep", "2", "--seed", "3",
                 "--dir", str(keep))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "IDENTICAL" in out and "DIFFERENT" not in out and "PROBLEM" not in out
    # the crash: SIGKILL between checkpoints, resume from the newest committed step
    killed = _int(r"the process had trained (\d+) steps", out)
    # (an async save still in flight at the kill never commits: the new process may even
    # find no committed step and start from step 0)
    after_crash = _int(r"crash .*\n\s+a new process (?:resumed from|found .*started from) "
                       r"step (\d+)", out)
    assert 20 < killed < 100 and after_crash % 20 == 0 and after_crash < killed
    assert _int(r"steps lost\s+(\d+) to the crash", out) == killed - after_crash
    # the preemption: SIGTERM, the current step saved, exit 0, resumed from exactly it
    signalled = _int(r"SIGTERM once step (\d+) was reported", out)
    saved = _int(r"the process saved step (\d+)", out)
    assert _int(r"and exited with status (-?\d+)", out) == 0
    assert _int(r"preemption .*\n\s+a new process resumed from step (\d+)", out) == saved
    assert signalled <= saved < 120 and saved > after_crash
    assert _int(r"(\d+) to the preemption", out) == 0
    assert _int(r"steps run\s+120 reference \+ \d+ crashed \+ \d+ preempted \+ \d+ resumed = (\d+)",
                out) >= 240
    # the manager's retention: max_to_keep 2 of the steps saved, the final step among them
    assert re.search(r"checkpoints\s+\d+ saved \(\d+ \+ \d+ \+ \d+ by the three processes\), "
                     r"2 kept \(max_to_keep 2\): steps 100, 120; [\d.]+ KiB each", out), out
    assert re.search(r"blocked\s+[\d.]+ ms in all: training waited in save\(\) \(async", out)
    assert re.search(r"durable\s+per save [\d.]+ ms mean", out)
    # the local tier: the same state restored from /dev/shm and from a cold directory
    assert re.search(r"from the local tier .*:\s+[\d.]+ s\n.*cold page cache:\s+[\d.]+ s\n"
                     r".*local tier is [\d.]+x faster", out), out
    # --dir keeps a manager directory that the other commands understand
    assert f"shardsafe ls {keep}" in out and f"shardsafe verify {keep}" in out
    assert sorted(p.name for p in keep.iterdir()) == ["step_00000100", "step_00000120"]
    ls = cli("ls", keep)
    assert ls.returncode == 0 and re.search(r"step_00000120\s+committed\s+120", ls.stdout)
    verify = cli("verify", keep)
    assert verify.returncode == 0 and verify.stdout.count("OK ") == 2, verify.stdout


@pytest.mark.stress
def test_demo_reports_a_wrong_resume_as_different(tmp_path, subprocess_env) -> None:
    # the hidden --corrupt-resume forgets the RNG state when resuming: dropout masks change
    env = dict(subprocess_env, TMPDIR=str(tmp_path))
    proc = _demo(env, "--steps", "60", "--every", "10", "--corrupt-resume")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DIFFERENT" in proc.stdout and "IDENTICAL" not in proc.stdout
    assert re.search(r"^\s+model\.\d\.weight: values differ", proc.stdout, re.M)
    assert re.search(r"^\s+rng\.torch: values differ", proc.stdout, re.M)
    assert "Run with --dir DIR to keep the checkpoints" in proc.stdout
    # the default temporary directory is removed (torch may leave its own cache there)
    assert not [n for n in os.listdir(tmp_path) if n.startswith("shardsafe-demo-")]


@pytest.mark.parametrize("args,message", [
    (("--steps", "10", "--every", "10"), "leaves no room for a crash"),
    (("--keep", "0"), "--keep must be at least 1"),
    (("--nproc", "0"), "--nproc must be at least 1"),
])
def test_demo_rejects_bad_options(cli, args, message) -> None:  # noqa: ANN001
    proc = cli("demo", *args)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_demo_refuses_a_non_empty_directory(tmp_path, cli) -> None:  # noqa: ANN001
    (tmp_path / "precious.txt").write_text("keep me")
    proc = cli("demo", "--dir", tmp_path)
    assert proc.returncode != 0
    assert "not empty" in proc.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"
