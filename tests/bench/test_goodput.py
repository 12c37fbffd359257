"""The goodput benchmark: its failure schedule and its metrics; one tiny real run (trainer
processes killed and restarted) under -m stress."""

from __future__ import annotations

import json
import signal

import pytest

from shardsafe.bench import goodput
from shardsafe.bench.goodput_run import Attempt, Failure, JobRun, failure_schedule


def test_failure_schedule_is_seeded_spaced_and_mixed() -> None:
    a = failure_schedule(3, 300, 4, 1)
    assert a == failure_schedule(3, 300, 4, 1)
    assert a != failure_schedule(4, 300, 4, 1)
    assert [f.kind for f in a].count("node") == 1
    steps = [f.step for f in a]
    assert steps == sorted(steps) and 30 <= steps[0] and steps[-1] < 270
    assert all(b - x >= 15 for x, b in zip(steps, steps[1:]))
    assert all(0 <= f.frac < 1 for f in a)
    with pytest.raises(ValueError, match="do not fit"):
        failure_schedule(0, 100, 20, 0)
    with pytest.raises(ValueError, match="node losses"):
        failure_schedule(0, 100, 2, 3)


def test_outcome_counts_recomputed_steps_recovery_and_blocking() -> None:
    # 10-step job: steps 1-6 done, killed, restored from 4, steps 5-10 done
    first = Attempt(go=100.0, restored_step=0, tier="none", restored_at=100.0,
                    steps=[(s, 100.0 + s, 0.25 if s == 4 else 0.0) for s in range(1, 7)],
                    killed_at=106.5, failure=Failure(6, 0.5, "kill"))
    second = Attempt(go=107.0, restored_step=4, tier="local", restored_at=107.5,
                     steps=[(s, 103.0 + s, 0.0) for s in range(5, 11)])
    o = goodput.outcome(JobRun("x", 100.0, 113.0, [first, second]), 10, useful_s=10.0)
    assert o.steps_lost == 2 and o.executed_steps == 12
    assert o.ettr == pytest.approx(10 / 13)
    assert o.recovery_s == pytest.approx(1.0)  # go at 107, first new step (5) ends at 108
    assert o.blocked_s == pytest.approx(0.25)
    assert o.restores == [(4, "local")]
    assert set(o.summary()) == {"ettr", "steps_lost", "recovery_s", "blocked_s"}


def test_step_period_is_the_median_pace_from_go() -> None:
    steps = [(1, 10.1, 0.0), (2, 10.2, 0.0), (3, 10.9, 0.0), (4, 11.0, 0.0)]  # one slow step
    run = JobRun("none", 10.0, 11.0, [Attempt(go=10.0, steps=steps)])
    assert goodput.step_period(run) == pytest.approx(0.1)


def test_table_marks_an_unavailable_strategy() -> None:
    text = goodput.table(["local tier not built"], ["shardsafe+local"])
    assert "| shardsafe+local | unavailable: local tier not built |" in text


@pytest.mark.stress
def test_tiny_real_run_kills_restarts_and_plots(tmp_path) -> None:
    out = tmp_path / "plot.png"
    # seed 13 puts the failure 0.29 steps after step 5 of 12: torch.save (every 2) resumes from 4
    assert [(f.step, f.kind) for f in failure_schedule(13, 12, 1, 1)] == [(5, "node")]
    args = goodput.parse_args([
        "--strategies", "none,torch.save", "--steps", "12", "--step-time", "0.1", "--width", "16",
        "--failures", "1", "--node-losses", "1", "--every", "2", "--local-every", "1",
        "--seed", "13", "--out", str(out), "--dir", str(tmp_path)])
    rep = goodput.run(args)
    for run in rep.runs:  # the trainer really died by SIGKILL and a new one took over
        first, second = run.attempts
        assert first.exit_code == -signal.SIGKILL and first.failure == rep.failures[0]
        assert [s for s, _, _ in first.steps] == [1, 2, 3, 4, 5]
        assert first.steps[-1][1] < first.killed_at < second.go <= second.steps[0][1]
        assert second.exit_code == 0 and second.steps[-1][0] == 12
    assert [(a.restored_step, a.tier) for a in rep.runs[1].attempts] == [(0, "none"), (4, "persistent")]

    lines = goodput.render(rep, str(out), 1.0).splitlines()
    result = json.loads(lines[-1])
    assert list(result) == ["none", "torch.save"]
    for m in result.values():
        assert set(m) == {"ettr", "steps_lost", "recovery_s", "blocked_s"}
        assert 0 < m["ettr"] < 1.5 and m["recovery_s"] > 0
    assert result["none"]["steps_lost"] == 5 and result["torch.save"]["steps_lost"] == 1
    assert result["torch.save"]["blocked_s"] > 10 * result["none"]["blocked_s"]
    assert any(line.startswith("| torch.save |") and line.endswith("| 4 persistent |")
               for line in lines)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
