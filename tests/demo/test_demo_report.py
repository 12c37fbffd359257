"""The demo's report from a hand-made result: what it says in each situation."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

from shardsafe.demo.events import SaveEvent, WorkerLog  # noqa: E402
from shardsafe.demo.plan import Interruptions  # noqa: E402
from shardsafe.demo.report import human_bytes, report  # noqa: E402
from shardsafe.demo.run import DemoOptions, DemoResult, ReferenceRun  # noqa: E402
from shardsafe.demo.train import TrainConfig  # noqa: E402


def _result(*, crash_saves: list[SaveEvent], resumed_from: int | None = 100, preempted_step: int = 160,
            resumed_at: int = 160, diffs: tuple[str, ...] = (), directory: str | None = None,
            sync: bool = False) -> DemoResult:
    opts = DemoOptions(steps=300, every=50, keep=3, directory=directory, sync=sync)
    crashed = WorkerLog("crashed", last_step=120, saves=crash_saves, returncode=-9,
                        signal_sent_at=118, wall_s=1.0)
    pre = WorkerLog("preempted", start_step=resumed_from or 0, resumed_from=resumed_from,
                    last_step=preempted_step, preempted_step=preempted_step,
                    preempt_wait_s=0.02, returncode=0, signal_sent_at=158, wall_s=1.0,
                    saves=[SaveEvent(150, 0.002, "schedule", 0.01),
                           SaveEvent(preempted_step, 0.003, "preemption", 0.02)])
    res = WorkerLog("resumed", start_step=resumed_at, resumed_from=resumed_at, last_step=300,
                    fingerprint="ab" * 32, returncode=0, wall_s=2.0,
                    saves=[SaveEvent(s, 0.001, "schedule", 0.01) for s in (200, 250, 300)])
    return DemoResult(opts, TrainConfig(steps=300), Interruptions(118, 158),
                      ReferenceRun({}, "ab" * 32, 300, 1.5), crashed, pre, res,
                      [200, 250, 300], 965_000, list(diffs), wall_s=9.0)


def test_report_of_a_good_run() -> None:
    r = _result(crash_saves=[SaveEvent(50, 0.004, "schedule", 0.02),
                             SaveEvent(100, 0.002, "schedule", 0.01)], directory="/tmp/x")
    assert r.ok and r.steps_lost_to_crash == 20 and r.steps_lost_to_preemption == 0
    text = report(r)
    assert "SIGKILL once step 118 was reported (planned 118); the process had trained 120" in text
    assert "a new process resumed from step 100, the newest committed step" in text
    assert "still being written" not in text
    assert "saved step 160, waited 20.0 ms for the write and exited with status 0" in text
    assert "steps lost   20 to the crash (trained again after resuming), 0 to the preemption" \
        in text
    assert "300 reference + 120 crashed + 60 preempted + 140 resumed = 620" in text
    assert "7 saved (2 + 2 + 3 by the three processes), 3 kept (max_to_keep 3): steps 200, " \
           "250, 300; 942.4 KiB each" in text
    assert "blocked      14.0 ms in all: training waited in save() (async save" in text
    assert "per save 2.0 ms mean, 1.0 ms min, 4.0 ms max" in text
    assert "IDENTICAL" in text and "shardsafe ls /tmp/x" in text and "PROBLEM" not in text


def test_report_names_a_save_lost_in_flight_and_differences() -> None:
    r = _result(crash_saves=[SaveEvent(50, 0.004, "schedule", 0.02),
                             SaveEvent(100, 0.002, "schedule", None)], resumed_from=50,
                diffs=("model.0.weight: values differ",), sync=True)
    text = report(r)
    assert "(the save of step 100 was still being written when the process died" in text
    assert "DIFFERENT: 1 key path(s) differ" in text and "model.0.weight: values differ" in text
    assert "(synchronous save)" in text and "within save()" in text
    assert "Run with --dir DIR" in text
    assert not r.ok


def test_a_resume_from_another_step_than_the_preempted_one_fails_the_demo() -> None:
    r = _result(crash_saves=[], resumed_at=150)
    assert r.identical and not r.ok
    assert r.problems == ["the preempted process saved step 160, but the next process resumed "
                          "from step 150"]
    assert "PROBLEM      the preempted process saved step 160" in report(r)


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"),
                                    (5 * 2**20, "5.0 MiB"), (3 * 2**40, "3072.0 GiB")])
def test_human_bytes(n, text) -> None:
    assert human_bytes(n) == text


def test_report_of_a_crash_before_any_commit() -> None:
    r = _result(crash_saves=[SaveEvent(50, 0.004, "schedule", None)], resumed_from=None)
    assert r.steps_lost_to_crash == 120 and r.ok
    text = report(r)
    assert "a new process found no committed step and started from step 0" in text
    assert "(the save of step 50 was still being written when the process died" in text
