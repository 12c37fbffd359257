"""The manager's INFO lines: a commit with its size and time, a restore, a fresh start,
a preemption; nothing on stdout."""

from __future__ import annotations

import logging
import os
import re
import signal

import torch

import shardsafe


def _info(caplog) -> list[str]:  # noqa: ANN001
    return [r.getMessage() for r in caplog.records if r.name == "shardsafe" and r.levelno == logging.INFO]


def test_commit_restore_and_fresh_start(tmp_path, caplog, capsys) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    with caplog.at_level(logging.INFO, logger="shardsafe"):
        with shardsafe.CheckpointManager(run, async_save=True) as mgr:
            assert mgr.restore({"w": torch.zeros(512, 1024)}) is None
            mgr.save(4, {"w": torch.randn(512, 1024)})
            mgr.wait_until_finished()
            assert mgr.restore({"w": torch.zeros(512, 1024)}) == 4
    lines = _info(caplog)
    assert f"no committed step in {run}: starting fresh" in lines
    committed = [x for x in lines if x.startswith("committed step 4")]
    assert len(committed) == 1
    assert re.fullmatch(rf"committed step 4 in {re.escape(run)}: 2\.0 MiB in \d+\.\d\d s \([\d.]+ [KMG]iB/s\), "
                        rf"blocked \d+\.\d\d s", committed[0]), committed
    assert any(re.fullmatch(rf"restored step 4 from {re.escape(run)}/step_00000004 in \d+\.\d\d s", x)
               for x in lines), lines
    assert capsys.readouterr().out == ""


def test_a_preemption_is_logged_once(tmp_path, caplog) -> None:  # noqa: ANN001
    with caplog.at_level(logging.INFO, logger="shardsafe"):
        with shardsafe.CheckpointManager(str(tmp_path / "run"), save_interval_steps=100,
                                         preemption_signals=(signal.SIGTERM,)) as mgr:
            assert not mgr.should_save(1)
            os.kill(os.getpid(), signal.SIGTERM)
            assert mgr.should_save(2)
            mgr.save(2, {"w": torch.ones(2)})
            assert mgr.reached_preemption(2)
            mgr.should_save(3)
    lines = [x for x in _info(caplog) if x.startswith("preemption")]
    assert lines == ["preemption: SIGTERM received; saving step 2"]
