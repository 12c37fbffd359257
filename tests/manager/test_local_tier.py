"""The local tier in one process: listing, retention, restore order, full disk, options."""

from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch
from helpers import flip_byte

import shardsafe
from shardsafe import CheckpointError, CheckpointManager, RestoreInfo


def make_state(step: int, n: int = 64) -> dict:
    return {"model": {"w": torch.full((n, 8), float(step))}, "step": step}


def reader(tmp_path) -> CheckpointManager:  # noqa: ANN001
    return CheckpointManager(tmp_path / "persistent", read_only=True, local_directory=str(tmp_path / "local"))


def manager(tmp_path, **kw) -> CheckpointManager:  # noqa: ANN001
    opts = dict(save_interval_steps=4, local_directory=str(tmp_path / "local"),
                local_save_interval_steps=2)
    opts.update(kw)
    return CheckpointManager(tmp_path / "persistent", **opts)


def test_local_steps_are_listed_apart_and_retained(tmp_path) -> None:
    with manager(tmp_path, local_max_to_keep=3) as mgr:
        for s in range(11):
            mgr.save(s, make_state(s))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [0, 4, 8]
        assert mgr.local_steps() == [6, 8, 10]
    assert sorted(os.listdir(tmp_path / "local" / "rank_0")) == [f"step_{s:08d}" for s in (6, 8, 10)]


def test_default_keeps_two_and_restore_prefers_newest_local(tmp_path) -> None:
    with manager(tmp_path) as mgr:
        for s in range(7):
            mgr.save(s, make_state(s))
    state = make_state(-1)
    with manager(tmp_path) as mgr:
        assert mgr.local_steps() == [4, 6]
        assert mgr.restore(state) == 6
        info = mgr.last_restore
    assert isinstance(info, RestoreInfo) and (info.step, info.tier) == (6, "local") and info.seconds > 0
    assert torch.equal(state["model"]["w"], make_state(6)["model"]["w"]) and state["step"] == 6


def test_newer_persistent_step_wins_over_older_local(tmp_path) -> None:
    with manager(tmp_path, local_save_interval_steps=3) as mgr:
        for s in range(5):  # local 0 and 3, persistent 0 and 4
            mgr.save(s, make_state(s))
    state = make_state(-1)
    with manager(tmp_path, local_save_interval_steps=3) as mgr:
        assert mgr.restore(state) == 4 and mgr.last_restore.tier == "persistent"
        assert mgr.local_steps() == [0, 3]  # older than the restored step: kept


def test_damaged_local_copy_falls_back_to_persistent_with_a_warning(tmp_path, caplog) -> None:
    with manager(tmp_path) as mgr:
        for s in range(5):  # local 2 and 4, persistent 0 and 4
            mgr.save(s, make_state(s))
    step_dir = tmp_path / "local" / "rank_0" / "step_00000004"
    data = max(step_dir.iterdir(), key=lambda p: p.stat().st_size)
    flip_byte(data, -5)
    state = make_state(-1)
    with caplog.at_level(logging.WARNING, logger="shardsafe"), manager(tmp_path) as mgr:
        assert mgr.restore(state) == 4 and mgr.last_restore.tier == "persistent"
    assert torch.equal(state["model"]["w"], make_state(4)["model"]["w"])
    assert any("step 4: rank 0 could not load its local copy" in r.getMessage() for r in caplog.records)


def test_restore_without_any_checkpoint(tmp_path) -> None:
    with manager(tmp_path) as mgr:
        assert mgr.restore(make_state(0)) is None
        assert mgr.last_restore == RestoreInfo(None, "persistent", mgr.last_restore.seconds)


def test_restore_from_persistent_older_step_drops_newer_local_steps(tmp_path) -> None:
    with manager(tmp_path) as mgr:
        for s in range(7):
            mgr.save(s, make_state(s))
        mgr.wait_until_finished()
        mgr.restore(make_state(-1), step=4, rollback=True)
        assert mgr.local_steps() == [4]
        mgr.save(5, make_state(5))
        mgr.save(6, make_state(6))
        mgr.wait_until_finished()
        assert mgr.local_steps() == [4, 6]


@pytest.mark.parametrize("kw, message", [
    ({"local_save_interval_steps": 2}, "need local_directory"),
    ({"local_replication": True}, "need local_directory"),
    ({"local_directory": "s3://b/x"}, "local path"),
    ({"local_directory": "x", "local_max_to_keep": 0}, "local_max_to_keep"),
    ({"save_interval_steps": "auto"}, "expected_mtbf_seconds"),
    ({"expected_mtbf_seconds": 60}, "go together"),
    ({"save_interval_steps": "auto", "expected_mtbf_seconds": -1}, "expected_mtbf_seconds"),
])
def test_bad_tier_options(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        shardsafe.ManagerOptions(**kw)


def test_full_local_directory_fails_the_local_save_not_the_persistent_one(tmp_path, tiny_tmpfs) -> None:
    state = {"w": torch.ones(512, 1024), "step": 0}  # 2 MiB: does not fit
    with CheckpointManager(tmp_path / "persistent", save_interval_steps=1,
                           local_directory=str(tiny_tmpfs), local_save_interval_steps=1) as mgr:
        assert mgr.save(0, state)
        with pytest.raises(CheckpointError, match=r"local save of step 0 on rank 0 .*No space left"):
            mgr.save(1, state)  # the error of step 0's local save, raised once step 1 started
        with pytest.raises(CheckpointError, match=r"local save of step 1 on rank 0"):
            mgr.wait_until_finished()
        assert mgr.all_steps() == [0, 1]  # the persistent tier went on
        assert mgr.local_steps() == []
        mgr.wait_until_finished()  # each error is raised once


def test_local_tier_restores_modules_optimizers_and_containers(tmp_path) -> None:
    def build(seed: int) -> dict:
        torch.manual_seed(seed)
        model = torch.nn.Linear(8, 4)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        return {"model": model, "opt": opt, "hist": [1.0, (2, "a")], "step": 0}

    state = build(0)
    for _ in range(2):
        state["model"](torch.ones(3, 8)).sum().backward()
        state["opt"].step()
    state["hist"], state["step"] = [3.0, (4, "b")], 2
    with manager(tmp_path, local_replication=True) as mgr:  # one process: no peers, no error
        mgr.save(2, state)
    got = build(1)
    with manager(tmp_path) as mgr:
        assert mgr.restore(got) == 2 and mgr.last_restore.tier == "local"
    assert torch.equal(got["model"].weight, state["model"].weight)
    exp = state["opt"].state_dict()["state"][0]["exp_avg"]
    assert torch.equal(got["opt"].state_dict()["state"][0]["exp_avg"], exp)
    assert got["hist"] == [3.0, (4, "b")] and got["step"] == 2


def test_a_full_local_directory_makes_room_instead_of_failing_forever(tmp_path, tiny_tmpfs, caplog) -> None:
    state = {"w": torch.ones(90_000)}  # 360 KB: two steps fit in 1 MiB, three do not
    outcomes = []
    with caplog.at_level(logging.WARNING, logger="shardsafe"), \
            CheckpointManager(tmp_path / "p", save_interval_steps=100, local_directory=str(tiny_tmpfs),
                              local_max_to_keep=2) as mgr:
        for s in range(1, 8):
            try:
                mgr.save(s, state)
                mgr.wait_until_finished()
                outcomes.append("ok")
            except CheckpointError as e:
                assert "No space left" in str(e)
                outcomes.append("full")
        assert mgr.local_steps() == [7]  # one step fewer between saves, two while saving
    assert outcomes == ["ok", "ok", "full", "ok", "ok", "ok", "ok"], outcomes
    assert any("is full" in r.getMessage() for r in caplog.records)


def test_a_full_local_directory_that_keeps_one_step_says_it_cannot_make_room(tmp_path, tiny_tmpfs,
                                                                             caplog) -> None:
    state = {"w": torch.ones(150_000)}  # 600 KB: one step fits in 1 MiB, two do not
    with caplog.at_level(logging.WARNING, logger="shardsafe"), \
            CheckpointManager(tmp_path / "p", save_interval_steps=100, local_directory=str(tiny_tmpfs),
                              local_max_to_keep=1) as mgr:
        mgr.save(1, state)
        mgr.wait_until_finished()
        mgr.save(2, state)
        with pytest.raises(CheckpointError, match="No space left"):
            mgr.wait_until_finished()
        assert mgr.local_steps() == [1]
    full = [r.getMessage() for r in caplog.records if "is full" in r.getMessage()]
    assert full and all("cannot hold a new step beside the one it keeps" in m for m in full), full


def test_local_steps_of_another_run_are_never_restored(tmp_path, caplog) -> None:
    local = str(tmp_path / "local")
    with CheckpointManager(tmp_path / "run1", save_interval_steps=100, local_directory=local) as mgr:
        for s in range(51):
            mgr.save(s, make_state(s))
    state = make_state(-1)
    with caplog.at_level(logging.WARNING, logger="shardsafe"), \
            CheckpointManager(tmp_path / "run2", save_interval_steps=100, local_directory=local) as mgr:
        assert mgr.local_steps() == []  # deleted: they only filled the node's memory
        assert mgr.restore(state) is None and mgr.last_restore.tier == "persistent"
    assert torch.equal(state["model"]["w"], make_state(-1)["model"]["w"])
    assert any("belongs to another run" in r.getMessage() for r in caplog.records)
    # the same persistent directory created again under the same name is another run too
    with CheckpointManager(tmp_path / "run3", save_interval_steps=100, local_directory=local) as mgr:
        mgr.save(7, make_state(7))
    shutil.rmtree(tmp_path / "run3")
    with CheckpointManager(tmp_path / "run3", save_interval_steps=100, local_directory=local) as mgr:
        assert mgr.local_steps() == [] and mgr.restore(make_state(-1)) is None


def test_local_step_number_comes_from_its_index(tmp_path, caplog) -> None:
    with manager(tmp_path) as mgr:
        for s in range(5):
            mgr.save(s, make_state(s))
    own = tmp_path / "local" / "rank_0"
    os.symlink(own / "step_00000004", own / "step_00000200")  # a link claiming a newer step
    shutil.copytree(own / "step_00000002", own / "step_00000100")  # a copy under another name
    state = make_state(-1)
    with caplog.at_level(logging.WARNING, logger="shardsafe"), reader(tmp_path) as mgr:
        assert mgr.local_steps() == [2, 4]
        assert mgr.restore(state) == 4 and mgr.last_restore.tier == "local"
    assert torch.equal(state["model"]["w"], make_state(4)["model"]["w"])
    assert any("records step 2" in r.getMessage() for r in caplog.records)


def test_read_only_manager_restores_the_newer_local_step_and_writes_nothing(tmp_path) -> None:
    with manager(tmp_path) as mgr:  # persistent every 4, local every 2
        for s in range(7):
            mgr.save(s, make_state(s))
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    state = make_state(-1)
    with reader(tmp_path) as mgr:
        assert mgr.all_steps() == [0, 4] and mgr.local_steps() == [4, 6]
        assert mgr.restore(state) == 6 and mgr.last_restore.tier == "local"
        assert not mgr.should_save(8)
        with pytest.raises(CheckpointError, match="read-only"):
            mgr.save(8, state, force=True)
    assert torch.equal(state["model"]["w"], make_state(6)["model"]["w"])
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == stamps


def test_local_restore_reads_nothing_from_the_persistent_tier(tmp_path) -> None:
    with manager(tmp_path) as mgr:
        for s in range(5):  # step 4 on both tiers
            mgr.save(s, make_state(s))
    step = tmp_path / "persistent" / "step_00000004"
    for f in step.iterdir():
        if f.name != "index.json":
            f.write_bytes(b"")  # a restore that read persistent data would fail now
    state = make_state(-1)
    with manager(tmp_path) as mgr:
        assert mgr.restore(state) == 4 and mgr.last_restore.tier == "local"
    assert torch.equal(state["model"]["w"], make_state(4)["model"]["w"])


def test_a_local_only_step_does_not_wait_for_a_slow_persistent_save(tmp_path, s3) -> None:
    """The persistent tier on S3 behind a 2 MB/s link: its upload of step 0 takes seconds,
    and the local-only steps meanwhile return at memory speed."""
    import time
    from urllib.parse import urlparse

    from shardsafe.bench.throttle import ThrottledProxy

    end = urlparse(s3.endpoint)
    proxy = ThrottledProxy((end.hostname, end.port), rate=2e6)
    try:
        so = dict(s3.storage_options, endpoint_url=f"http://127.0.0.1:{proxy.port}")
        state = {"w": torch.randn(1 << 20)}  # 4 MiB: about 2 s up the link
        with CheckpointManager(f"{s3.url}/run", storage_options=so, save_interval_steps=10,
                               local_directory=str(tmp_path / "local")) as mgr:
            assert mgr.save(0, state)  # both tiers; the upload goes on in the background
            t0 = time.monotonic()
            for step in (1, 2):
                assert not mgr.save(step, state)  # local only
            blocked = time.monotonic() - t0
            upload_pending = mgr.all_steps() == []
            mgr.wait_until_finished()
            assert mgr.all_steps() == [0] and mgr.local_steps() == [1, 2]
    finally:
        proxy.close()
    assert upload_pending and blocked < 1.0, blocked
