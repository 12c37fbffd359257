"""CheckpointManager semantics in one process: schedules, errors, metrics, retention, listing."""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest
import torch
from helpers import flip_byte

import shardsafe
from shardsafe import CheckpointError, CheckpointManager, CheckpointNotFoundError


def make_state(step: int) -> dict:
    return {"model": {"w": torch.full((64, 8), float(step)), "b": torch.arange(8) + step},
            "opt": {"m": np.full(16, step, dtype=np.float32)}, "step": step, "name": f"run-{step}"}


def assert_state(state: dict, step: int) -> None:
    want = make_state(step)
    assert torch.equal(state["model"]["w"], want["model"]["w"])
    assert torch.equal(state["model"]["b"], want["model"]["b"])
    assert np.array_equal(state["opt"]["m"], want["opt"]["m"])
    assert state["step"] == step and state["name"] == f"run-{step}"


@pytest.fixture(params=[True, False], ids=["async", "sync"])
def async_save(request) -> bool:
    return request.param


def test_save_restore_roundtrip(tmp_path, async_save) -> None:
    with CheckpointManager(tmp_path, async_save=async_save) as mgr:
        assert mgr.restore(make_state(0)) is None and mgr.latest_step() is None
        for s in (0, 1, 2):
            assert mgr.save(s, make_state(s))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [0, 1, 2] and mgr.latest_step() == 2
        st = make_state(99)
        assert mgr.restore(st) == 2
        assert_state(st, 2)
        assert mgr.restore(st, step=1) == 1
        assert_state(st, 1)
        with pytest.raises(CheckpointNotFoundError):
            mgr.restore(st, step=7)
    assert sorted(os.listdir(tmp_path)) == ["step_00000000", "step_00000001", "step_00000002"]


def test_async_save_captures_state_when_it_returns(tmp_path) -> None:
    st = make_state(1)
    with CheckpointManager(tmp_path) as mgr:
        assert mgr.save(1, st)
        st["model"]["w"].fill_(-5.0)  # training continues while the write is in flight
        st["opt"]["m"][:] = -5
        mgr.wait_until_finished()
        out = make_state(0)
        mgr.restore(out)
    assert_state(out, 1)


def test_should_save_rules(tmp_path) -> None:
    with CheckpointManager(tmp_path, save_interval_steps=10, save_on_steps=(3, 25)) as mgr:
        assert [s for s in range(31) if mgr.should_save(s)] == [0, 3, 10, 20, 25, 30]
        assert not mgr.save(7, make_state(7))  # not due
        assert mgr.save(7, make_state(7), force=True)
        assert mgr.save(10, make_state(10))
        # steps not newer than the newest saved step are never due
        assert not mgr.should_save(3) and not mgr.should_save(10) and mgr.should_save(20)
        mgr.wait_until_finished()
        assert mgr.all_steps() == [7, 10]


def test_should_save_by_time(tmp_path) -> None:
    with CheckpointManager(tmp_path, save_interval_steps=None, save_interval_seconds=0.3) as mgr:
        assert not mgr.should_save(1) and not mgr.save(1, make_state(1))
        time.sleep(0.35)
        assert mgr.should_save(2) and mgr.save(2, make_state(2))
        assert not mgr.should_save(3)  # the clock restarted at the save
        time.sleep(0.35)
        assert mgr.should_save(4)
    # a fresh manager measures from the newest checkpoint's save time, not from its start
    with CheckpointManager(tmp_path, save_interval_steps=None, save_interval_seconds=0.3) as mgr:
        assert mgr.should_save(5)


def test_existing_and_older_steps_are_refused(tmp_path, async_save) -> None:
    with CheckpointManager(tmp_path, async_save=async_save) as mgr:
        assert mgr.save(5, make_state(5))
        # not due, like should_save: no error, nothing written
        assert mgr.save(5, make_state(5)) is False and mgr.save(4, make_state(4)) is False
        assert not mgr.should_save(4) and not mgr.should_save(5)
        with pytest.raises(CheckpointError, match="step 5 already exists"):
            mgr.save(5, make_state(5), force=True)
        with pytest.raises(CheckpointError, match="refusing to save step 4.*newest step there is 5"):
            mgr.save(4, make_state(4), force=True)
        with pytest.raises(ValueError, match="non-negative int"):
            mgr.save(-1, make_state(0), force=True)
        mgr.wait_until_finished()
        assert mgr.all_steps() == [5]


def test_metrics_round_trip(tmp_path) -> None:
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, make_state(1), metrics={"loss": torch.tensor(0.25), "acc": np.float32(0.5),
                                            "tokens": np.int64(7), "bad": float("nan"),
                                            "best": float("inf"), "tag": "x", "ok": True})
        mgr.save(2, make_state(2))
        mgr.wait_until_finished()
        m = mgr.metrics(1)
        assert m is not None and m["loss"] == 0.25 and m["acc"] == 0.5 and m["tokens"] == 7
        assert np.isnan(m["bad"]) and m["best"] == float("inf") and m["tag"] == "x" and m["ok"] is True
        assert mgr.metrics(2) is None
        with pytest.raises(CheckpointNotFoundError, match="step 3"):
            mgr.metrics(3)
        with pytest.raises(TypeError, match="metrics\\['x'\\]"):
            mgr.save(4, make_state(4), metrics={"x": [1, 2]})
        assert mgr.all_steps() == [1, 2]
    # stored atomically with the step, readable by anyone through the index
    md = shardsafe.api.load.read_checkpoint_index(str(tmp_path / "step_00000001")).metadata
    assert md["shardsafe.manager"]["step"] == 1 and md["shardsafe.manager"]["metrics"]["bad"] == "NaN"


def test_retention_latest_and_period(tmp_path, async_save) -> None:
    with CheckpointManager(tmp_path, max_to_keep=2, keep_period=4, async_save=async_save) as mgr:
        for s in range(11):
            mgr.save(s, make_state(s))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [0, 4, 8, 9, 10]


def test_retention_best(tmp_path) -> None:
    losses = {0: 0.9, 1: 0.3, 2: 0.5, 3: 0.1, 4: 0.8, 5: 0.7}
    with CheckpointManager(tmp_path, max_to_keep=2, best_fn=lambda m: m["loss"], best_mode="min") as mgr:
        for s, v in losses.items():
            mgr.save(s, make_state(s), metrics={"loss": v})
        mgr.save(6, make_state(6))  # no metrics: kept (keep_checkpoints_without_metrics)
        mgr.save(7, make_state(7), metrics={"loss": 0.95})
        mgr.wait_until_finished()
        assert mgr.all_steps() == [1, 3, 6, 7]  # two best, the one without metrics, the newest
        assert mgr.best_step() == 3
    with CheckpointManager(tmp_path) as mgr:  # without best_fn: the latest
        assert mgr.best_step() == 7


def test_retention_error_reaches_the_caller(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path, max_to_keep=1, best_fn=lambda m: m["acc"])
    mgr.save(1, make_state(1), metrics={"acc": 1.0})
    mgr.save(2, make_state(2), metrics={"loss": 1.0})  # best_fn raises KeyError in the worker
    with pytest.raises(CheckpointError, match="step 2 was saved, but retention failed.*step 2"):
        mgr.wait_until_finished()
    mgr.wait_until_finished()  # reported once
    assert mgr.all_steps() == [1, 2]
    mgr.close()


def test_uncollected_background_error_is_logged_at_exit(tmp_path, caplog) -> None:
    mgr = CheckpointManager(tmp_path, max_to_keep=1, best_fn=lambda m: m["acc"])
    mgr.save(1, make_state(1), metrics={"acc": 1.0})
    mgr.save(2, make_state(2), metrics={"loss": 1.0})  # best_fn raises in the worker
    while mgr._writers[0].slot.job is not None and not mgr._writers[0].slot.job.settled.is_set():
        time.sleep(0.01)
    assert mgr._finalizer.atexit  # Python runs it at interpreter exit; run it now instead
    with caplog.at_level(logging.ERROR, logger="shardsafe"):
        mgr._finalizer()
    assert "step 2 failed and nobody called wait_until_finished()" in caplog.text


def test_damaged_index_does_not_stop_retention(tmp_path, caplog) -> None:
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, make_state(1))
        mgr.save(2, make_state(2))
    flip_byte(tmp_path / "step_00000001" / "index.json", 20)
    with caplog.at_level(logging.WARNING, logger="shardsafe"):
        with CheckpointManager(tmp_path, max_to_keep=2) as mgr:
            mgr.save(3, make_state(3))
            mgr.wait_until_finished()
            assert mgr.all_steps() == [2, 3]
    assert "step 1" in caplog.text and "damaged index" in caplog.text


def test_delete(tmp_path) -> None:
    with CheckpointManager(tmp_path) as mgr:
        for s in range(3):
            mgr.save(s, make_state(s))
        mgr.delete(1)  # does not wait for step 2, which may still be in flight
        mgr.wait_until_finished()
        assert mgr.all_steps() == [0, 2]
        with pytest.raises(CheckpointNotFoundError):
            mgr.delete(1)
        mgr.save(3, make_state(3))
        mgr.delete(3)  # in flight: waits for the commit, then deletes
        assert mgr.all_steps() == [0, 2]


def test_read_only_manager(tmp_path) -> None:
    ro = CheckpointManager(tmp_path / "none", read_only=True)
    assert ro.all_steps() == [] and not (tmp_path / "none").exists()
    assert ro.restore(make_state(0)) is None
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(3, make_state(3), metrics={"loss": 1.0})
    os.makedirs(tmp_path / ".step_00000009.shardsafe-tmp-0123")
    with CheckpointManager(tmp_path, read_only=True) as ro:
        assert not ro.should_save(10)
        with pytest.raises(CheckpointError, match="read-only"):
            ro.save(10, make_state(10), force=True)
        with pytest.raises(CheckpointError, match="read-only"):
            ro.delete(3)
        assert ro.all_steps() == [3] and ro.metrics(3) == {"loss": 1.0}
        st = make_state(0)
        assert ro.restore(st) == 3
        assert_state(st, 3)
    assert (tmp_path / ".step_00000009.shardsafe-tmp-0123").exists()  # a reader cleans nothing


def test_writable_manager_removes_crash_leftovers(tmp_path, caplog) -> None:
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(1, make_state(1))
        mgr.save(2, make_state(2))
    tmp = tmp_path / ".step_00000003.shardsafe-tmp-deadbeef"
    tmp.mkdir()
    (tmp / "data-00000.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "step_00000002" / "index.json").unlink()  # an interrupted delete
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "step_00000007.corrupt").mkdir()
    with caplog.at_level(logging.WARNING, logger="shardsafe"):
        with CheckpointManager(tmp_path) as mgr:
            assert mgr.all_steps() == [1]
            mgr.save(2, make_state(2))  # the half-deleted step no longer blocks its number
    assert "removed 2 leftover" in caplog.text
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "step_00000001", "step_00000002",
                                            "step_00000007.corrupt"]


def test_listing_accepts_wide_and_unpadded_names(tmp_path) -> None:
    shardsafe.save(make_state(123456789), str(tmp_path / "step_123456789"))
    shardsafe.save(make_state(4), str(tmp_path / "step_4"))
    os.makedirs(tmp_path / "step_x1")
    with CheckpointManager(tmp_path, read_only=True) as ro:
        assert ro.all_steps() == [4, 123456789]
        assert ro.metrics(4) is None  # saved without the manager
        st = make_state(0)
        assert ro.restore(st) == 123456789 and ro.restore(st, step=4) == 4
        assert_state(st, 4)


def test_close_and_context_manager(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, make_state(1))
    mgr.close()
    mgr.close()  # idempotent
    assert mgr.all_steps() == [1]  # listing still works
    with pytest.raises(CheckpointError, match="closed"):
        mgr.save(2, make_state(2))
    assert not mgr.should_save(2)
    with pytest.raises(RuntimeError, match="boom"):
        with CheckpointManager(tmp_path) as mgr2:
            mgr2.save(2, make_state(2))
            raise RuntimeError("boom")
    assert CheckpointManager(tmp_path, read_only=True).all_steps() == [1, 2]


def test_file_url_directory(tmp_path) -> None:
    with CheckpointManager(f"file://{tmp_path}/ckpt", max_to_keep=1) as mgr:
        mgr.save(1, make_state(1))
        mgr.save(2, make_state(2))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [2]
        st = make_state(0)
        assert mgr.restore(st) == 2
    assert_state(st, 2)
    assert os.listdir(tmp_path / "ckpt") == ["step_00000002"]
