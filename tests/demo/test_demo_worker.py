"""The demo's training script as real processes: SIGTERM saves the current step and exits 0.

This is the preemption contract the demo relies on, checked on the worker directly:
the preempted process reports the step it saved, exits with status 0, and a new
process resumes from exactly that step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

import shardsafe  # noqa: E402

pytestmark = pytest.mark.slow


def _worker(env: dict[str, str], directory: str, steps: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "shardsafe.demo.worker", "--dir", directory,
                             "--steps", str(steps), "--every", "50", "--keep", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _events(proc: subprocess.Popen[str], *, sigterm_at: int | None = None) -> list[dict]:
    """Its events until it exits; SIGTERM once it reports ``sigterm_at`` (killed on failure)."""
    out = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            ev = json.loads(line)
            out.append(ev)
            if sigterm_at is not None and ev == {"event": "step", "step": sigterm_at}:
                os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out


def test_sigterm_saves_the_current_step_exits_0_and_the_next_process_resumes_there(
        tmp_path, subprocess_env) -> None:
    ckpts = str(tmp_path / "run")
    first = _worker(subprocess_env, ckpts, steps=400)
    events = _events(first, sigterm_at=30)
    assert first.wait(timeout=120) == 0, first.stderr.read()
    preempted = [e for e in events if e["event"] == "preempted"]
    assert len(preempted) == 1 and not [e for e in events if e["event"] == "done"]
    saved = preempted[0]["step"]
    last = max(e["step"] for e in events if e["event"] == "step")
    assert 30 <= saved == last < 400  # the step it was at: nothing trained after it is lost
    reasons = [e["reason"] for e in events if e["event"] == "save" and e["step"] == saved]
    # off the schedule unless the signal came right after a scheduled save of that step
    assert reasons == ["preemption"] or (saved % 50 == 0 and reasons == ["schedule"])
    with shardsafe.CheckpointManager(ckpts, read_only=True) as mgr:
        assert mgr.latest_step() == saved

    second = _worker(subprocess_env, ckpts, steps=saved + 3)
    events = _events(second)
    assert second.wait(timeout=120) == 0, second.stderr.read()
    start = events[0]
    assert start["event"] == "start" and start["resumed_from"] == saved == start["step"]
    assert [e["step"] for e in events if e["event"] == "step"] == [saved + 1, saved + 2, saved + 3]
    assert events[-1]["event"] == "done" and events[-1]["step"] == saved + 3
    with shardsafe.CheckpointManager(ckpts, read_only=True) as mgr:
        assert mgr.latest_step() == saved + 3  # the final step is always saved
