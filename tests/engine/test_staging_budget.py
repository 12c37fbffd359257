"""Async saves under ``max_staging_bytes``: a state larger than the budget streams through
at most that many bytes of host buffers, round-trips bit-exactly, and write errors met
while staging reach the caller. Memory is checked through the arena's accounting (and,
in a child process, as resident memory); never by timing."""

from __future__ import annotations

import errno
import json
import subprocess
import textwrap

import pytest
import torch
from helpers import assert_same, clone_state, mutate_state

import shardsafe
from shardsafe.engine.buffers import StagingArena

MiB = 1 << 20
UNIT = 1 * MiB
BUDGET = 3 * MiB


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    # 8 x 2 MiB tensors (units and checksum blocks straddle tensors), odd-sized small
    # tensors, a bfloat16 one (no numpy view) and a non-contiguous one
    return {"w": [torch.randn(512 * 1024, generator=g) for _ in range(8)],
            "odd": [torch.randn(1000 + 37 * i, generator=g) for i in range(20)],
            "bf16": torch.randn(300_001, generator=g).to(torch.bfloat16),
            "t": torch.randn(700, 900, generator=g).t(), "step": seed}


@pytest.mark.parametrize("staging", ["blocking", "background"])
def test_state_larger_than_the_budget_round_trips_within_the_budget(tmp_path, staging):
    state = _state(1)
    expect = clone_state(state)
    with shardsafe.Checkpointer(unit_size=UNIT, max_staging_bytes=BUDGET) as ckpt:
        h = ckpt.async_save(state, str(tmp_path / "c"), staging=staging)
        assert h.nbytes > 5 * BUDGET  # the state does not fit: it must stream
        h.wait_staged()
        mutate_state(state)  # allowed once staged, although most of it is not written yet
        h.result(timeout=60)
        # the arena's own accounting: never more than the budget at once, and it was used
        assert UNIT <= ckpt._saver.arena.peak_nbytes <= BUDGET
        assert ckpt.retained_bytes <= BUDGET
    assert_same(shardsafe.load(str(tmp_path / "c")), expect)


def test_budget_per_call_and_reuse_across_saves(tmp_path):
    state = _state(2)
    with shardsafe.Checkpointer(unit_size=UNIT) as ckpt:
        ckpt.async_save(state, str(tmp_path / "full")).result()
        full = ckpt._saver.arena.peak_nbytes
        assert full > 5 * BUDGET  # without a budget: one copy of the state
        ckpt.async_save(state, str(tmp_path / "a"), max_staging_bytes=2 * UNIT).result()
        ckpt.async_save(state, str(tmp_path / "b"), max_staging_bytes=2 * UNIT).result()
        # the whole-state copy was freed for the budgeted saves, which share their slots
        assert ckpt._saver.arena.nbytes <= 2 * UNIT and ckpt._saver.arena.allocations == 2
    for name in ("a", "b", "full"):
        assert_same(shardsafe.load(str(tmp_path / name)), state)


def test_slot_pool_never_exceeds_its_count(tmp_path):
    arena = StagingArena()
    pool = arena.slots(4096, 2)
    a, b = pool.acquire(), pool.acquire()
    assert pool.acquire(cancelled=lambda: True) is None  # full, and told to give up
    pool.release(a)
    assert pool.acquire() is a  # reused, not a third buffer
    assert arena.peak_nbytes == 2 * 4096 and arena.nbytes == 2 * 4096
    pool.release(a)
    pool.release(b)
    arena.release()
    assert arena.nbytes == 0


@pytest.mark.parametrize("bad", [0, UNIT - 1, -5, 2.5 * UNIT, "8G", True])
def test_budget_below_one_unit_or_not_an_int_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="max_staging_bytes"):
        shardsafe.Checkpointer(unit_size=UNIT, max_staging_bytes=bad)
    with shardsafe.Checkpointer(unit_size=UNIT) as ckpt:
        with pytest.raises(ValueError, match="at least one staging unit"):
            ckpt.async_save({"x": torch.ones(4)}, str(tmp_path / "c"), max_staging_bytes=bad)
    assert not (tmp_path / "c").exists()
    with pytest.raises(ValueError, match="max_staging_bytes"):
        shardsafe.CheckpointManager(tmp_path / "m", max_staging_bytes=bad)


def test_manager_saves_within_its_budget(tmp_path):
    state = {"w": torch.randn(12 << 20 >> 2), "step": 0}  # 12 MiB, the default unit is 16 MiB
    with shardsafe.CheckpointManager(tmp_path, max_staging_bytes=16 * MiB) as mgr:
        assert mgr.options.max_staging_bytes == 16 * MiB
        mgr.save(1, state)
        mgr.wait_until_finished()
        target = {"w": torch.zeros_like(state["w"]), "step": -1}
        mgr.restore(target, 1)
    assert torch.equal(target["w"], state["w"]) and target["step"] == 0


# Writes fail with EFBIG past 1 MiB (RLIMIT_FSIZE) while the caller is still staging the
# 24 MiB state through 2 MiB of buffers: the error must reach the caller (from the call or
# from result()), leave nothing behind, and leave the buffers usable by the next save.
FAILING = textwrap.dedent("""
    import errno, json, os, resource, signal, sys, torch, shardsafe
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    d, staging = sys.argv[1], sys.argv[2]
    state = {"w": [torch.ones(1 << 20) for _ in range(6)]}
    ckpt = shardsafe.Checkpointer(unit_size=1 << 20, max_staging_bytes=2 << 20)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    res = {}
    try:
        h = ckpt.async_save(state, os.path.join(d, "a"), staging=staging)
        res["returned"] = True
        h.result(timeout=60)
    except OSError as e:
        res["error"] = errno.errorcode[e.errno]
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    ckpt.async_save(state, os.path.join(d, "b"), staging=staging).result(timeout=60)
    res["listing"] = sorted(os.listdir(d))
    res["held"] = ckpt._saver.arena.nbytes
    ckpt.close()
    print(json.dumps(res))
""")


@pytest.mark.parametrize("staging", ["blocking", "background"])
def test_write_error_while_staging_reaches_the_caller(tmp_path, subprocess_env, python, staging):
    r = subprocess.run([python, "-c", FAILING, str(tmp_path), staging], env=subprocess_env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["error"] == errno.errorcode[errno.EFBIG], res
    assert res["listing"] == ["b"]  # the failed save left nothing; the next one committed
    assert res["held"] <= 2 * MiB


# Resident memory of a child: a 64 MiB state saved (blocking and background) with a 16 MiB
# budget adds at most the budget + 25% (plus the interpreter's own noise), not a copy.
CHILD = textwrap.dedent("""
    import json, os, sys, torch, shardsafe

    def rss():
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024

    d = sys.argv[1]
    state = {"layers": [torch.randn(2 << 20) for _ in range(8)], "step": 0}  # 64 MiB
    ckpt = shardsafe.Checkpointer(unit_size=4 << 20, max_staging_bytes=16 << 20)
    ckpt.save({"warm": torch.ones(4)}, os.path.join(d, "warm"))  # imports, pools
    ckpt.async_save({"warm": torch.ones(4)}, os.path.join(d, "warm2")).result()
    base, _ = rss()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    for i, mode in enumerate(["blocking", "background"] * 2):
        h = ckpt.async_save(state, os.path.join(d, f"c{i}"), staging=mode)
        h.wait_staged()
        h.result()
    print(json.dumps({"base": base, "peak": rss()[1], "arena": ckpt._saver.arena.peak_nbytes}))
""")


def test_resident_memory_stays_within_the_budget(tmp_path, subprocess_env, python):
    r = subprocess.run([python, "-c", CHILD, str(tmp_path)], env=subprocess_env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    extra = m["peak"] - m["base"]
    assert m["arena"] <= 16 * MiB
    # budget + 25%, plus 8 MiB for thread stacks, the index and allocator noise; a copy of
    # the state (64 MiB) would exceed it by far
    assert extra <= 1.25 * 16 * MiB + 8 * MiB, extra / MiB
