"""Synchronous saves finish retention; old steps are not due; rollback moves newer steps aside."""

from __future__ import annotations

import json
import os
import threading

import pytest
import torch

import shardsafe
from shardsafe import CheckpointError, CheckpointManager, CheckpointNotFoundError
from shardsafe.manager.steps import ROLLBACK_MARKER, step_name


def state(step: int) -> dict:
    return {"w": torch.full((4,), float(step)), "step": step}


def test_synchronous_save_returns_after_retention(tmp_path) -> None:
    with CheckpointManager(tmp_path, max_to_keep=2, async_save=False) as mgr:
        for s in range(6):
            assert mgr.save(s, state(s))
            # nothing left for a background thread: the listing is already final
            assert mgr._writers[0].slot.job is None
            assert mgr.all_steps() == list(range(max(0, s - 1), s + 1))
            names = sorted(n for n in os.listdir(tmp_path) if n.startswith("step_"))
            assert names == [step_name(x) for x in mgr.all_steps()]


def test_synchronous_retention_runs_on_the_callers_thread(tmp_path) -> None:
    seen: list[str] = []

    def best(metrics: dict) -> float:
        seen.append(threading.current_thread().name)
        return metrics["acc"]

    with CheckpointManager(tmp_path, max_to_keep=1, best_fn=best, async_save=False) as mgr:
        mgr.save(1, state(1), metrics={"acc": 1.0})
        mgr.save(2, state(2), metrics={"acc": 2.0})
        assert mgr.all_steps() == [2]
    assert seen and set(seen) == {threading.current_thread().name}


def test_synchronous_retention_error_raises_from_save(tmp_path) -> None:
    with CheckpointManager(tmp_path, max_to_keep=1, best_fn=lambda m: m["acc"],
                           async_save=False) as mgr:
        mgr.save(1, state(1), metrics={"acc": 1.0})
        with pytest.raises(CheckpointError, match="step 2 was saved, but retention failed"):
            mgr.save(2, state(2), metrics={"loss": 1.0})
        assert mgr.all_steps() == [1, 2]


@pytest.mark.parametrize("async_save", [True, False])
def test_rollback_moves_newer_steps_aside(tmp_path, cli, async_save) -> None:  # noqa: ANN001
    with CheckpointManager(tmp_path, async_save=async_save) as mgr:
        for s in (100, 200, 300):
            assert mgr.save(s, state(s), metrics={"loss": s / 100})
        assert mgr.save(150, state(150)) is False  # older than the newest: not due
        out = state(0)
        assert mgr.restore(out, step=100, rollback=True) == 100
        assert torch.equal(out["w"], state(100)["w"]) and out["step"] == 100
        assert mgr.all_steps() == [100] and mgr.latest_step() == 100
        moved = sorted(n for n in os.listdir(tmp_path) if ROLLBACK_MARKER in n)
        assert [n.split(ROLLBACK_MARKER)[0] for n in moved] == [step_name(200), step_name(300)]
        for n in moved:  # kept whole, not deleted
            assert os.path.exists(tmp_path / n / "index.json")
        # training continues from step 100: the next steps are due again
        assert mgr.should_save(150) and mgr.save(150, state(150))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [100, 150]
        # roll back over a step already rolled back once: names do not collide
        assert mgr.save(200, state(200))
        assert mgr.restore(state(0), step=100, rollback=True) == 100
    moved = [n for n in os.listdir(tmp_path) if n.startswith(step_name(200) + ROLLBACK_MARKER)]
    assert len(moved) == 2
    # shardsafe ls shows the moved-aside steps with their own state
    out = cli("ls", "--json", tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert {r["state"] for n, r in rows.items() if ROLLBACK_MARKER in n} == {"rolled-back"}
    assert {r["step"] for n, r in rows.items() if ROLLBACK_MARKER in n} == {150, 200, 300}
    assert rows[step_name(100)]["state"] == "committed"
    table = cli("ls", tmp_path).stdout
    states = [line.split()[1] for line in table.splitlines()[1:]]
    assert states.count("rolled-back") == 4 and states.count("committed") == 1  # 200 twice


def test_rollback_failures_move_nothing(tmp_path) -> None:
    with CheckpointManager(tmp_path, async_save=False) as mgr:
        for s in (1, 2):
            mgr.save(s, state(s))
        with pytest.raises(CheckpointError, match="needs the step"):
            mgr.restore(state(0), rollback=True)
        with pytest.raises(CheckpointNotFoundError):
            mgr.restore(state(0), step=7, rollback=True)
        with pytest.raises(CheckpointError, match="step 1 already exists"):
            mgr.save(1, state(1), force=True)
        assert mgr.all_steps() == [1, 2]
    with CheckpointManager(tmp_path, read_only=True) as ro:
        with pytest.raises(CheckpointError, match="read-only"):
            ro.restore(state(0), step=1, rollback=True)
        assert ro.all_steps() == [1, 2]
    assert not [n for n in os.listdir(tmp_path) if ROLLBACK_MARKER in n]


def test_rolled_back_incremental_steps_load_and_rename_back(tmp_path) -> None:
    """Steps 5 and 6 of an incremental manager reference step 4's data; after a rollback to
    step 3 all three are set aside, and each still loads where it lies and after it is
    renamed back (nothing it needs was renamed away from under it)."""
    base = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64)

    def st(s: int) -> dict:
        w = base.clone()
        if s >= 4:
            w += 1  # step 4 rewrites the big tensor; 5 and 6 reference it
        return {"w": w, "head": torch.full((4,), float(s)), "step": s}

    with CheckpointManager(tmp_path, incremental=True, async_save=False) as mgr:
        for s in range(1, 7):
            assert mgr.save(s, st(s))
        target = st(0)
        assert mgr.restore(target, step=3, rollback=True) == 3
        assert mgr.all_steps() == [1, 2, 3]
    aside = {int(n.split(ROLLBACK_MARKER)[0][5:]): n for n in os.listdir(tmp_path) if ROLLBACK_MARKER in n}
    assert sorted(aside) == [4, 5, 6]
    for s in (4, 5, 6):
        got = shardsafe.load(str(tmp_path / aside[s]))
        assert torch.equal(got["w"], st(s)["w"]) and got["step"] == s
    os.rename(tmp_path / aside[5], tmp_path / step_name(5))  # renamed back, on its own
    with CheckpointManager(tmp_path, read_only=True) as mgr:
        assert mgr.all_steps() == [1, 2, 3, 5]
        got = st(0)
        assert mgr.restore(got, step=5) == 5
        assert torch.equal(got["w"], st(5)["w"]) and torch.equal(got["head"], st(5)["head"])
    os.rename(tmp_path / aside[6], tmp_path.parent / "elsewhere")  # or anywhere else
    got = shardsafe.load(str(tmp_path.parent / "elsewhere"))
    assert torch.equal(got["w"], st(6)["w"]) and torch.equal(got["head"], st(6)["head"])
