"""async_save semantics: what is saved is the state at the call (or at wait_staged), errors
reach the caller, saves never overlap, staging buffers are reused."""

from __future__ import annotations

import logging
import os
import subprocess
import textwrap

import numpy as np
import pytest
import torch
from helpers import assert_same, clone_state, mutate_state

import shardsafe
from shardsafe.engine.save import saver as saver_mod


def _state(seed: int = 0, n: int = 4, numel: int = 2 << 20) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": [torch.randn(numel, generator=g) for _ in range(n)],
            "small": torch.arange(1000, dtype=torch.int64), "np": np.full(333, seed, dtype=np.float64),
            "step": seed, "name": "run"}


def test_blocking_staging_snapshot_survives_immediate_mutation(tmp_path):
    state = _state(1)
    expect = clone_state(state)
    h = shardsafe.async_save(state, str(tmp_path / "c"))
    mutate_state(state)  # allowed right away with staging="blocking"
    h.result()
    assert h.done()
    assert_same(shardsafe.load(str(tmp_path / "c")), expect)


def test_background_staging_snapshot_survives_mutation_after_wait_staged(tmp_path):
    state = _state(2)
    expect = clone_state(state)
    with shardsafe.Checkpointer() as ckpt:
        h = ckpt.async_save(state, str(tmp_path / "c"), staging="background")
        h.wait_staged()
        mutate_state(state)
        h.result()
    assert_same(shardsafe.load(str(tmp_path / "c")), expect)


def test_handle_reports_progress_and_timings(tmp_path):
    with shardsafe.Checkpointer() as ckpt:
        h = ckpt.async_save(_state(3), str(tmp_path / "c"))
        assert isinstance(h, shardsafe.SaveHandle)
        h.result(timeout=60)
        assert h.done() and h.exception() is None
        assert 0 <= h.timings["staged"] <= h.timings["durable"]
        assert h.nbytes > 4 * (2 << 20) * 4


def test_unknown_staging_mode_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="staging"):
        shardsafe.async_save({"x": 1}, str(tmp_path / "c"), staging="lazy")


def test_unsavable_value_raises_at_the_call_and_leaves_nothing(tmp_path):
    with shardsafe.Checkpointer() as ckpt:
        with pytest.raises(TypeError, match="bad"):
            ckpt.async_save({"bad": object()}, str(tmp_path / "c"))
        ckpt.async_save({"ok": torch.ones(3)}, str(tmp_path / "d")).result()  # still usable
    assert sorted(os.listdir(tmp_path)) == ["d"]


def test_second_save_waits_for_the_first(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(saver_mod, "SLOW_WAIT_S", 0.0)  # any wait at all is "slow"
    first, second = _state(4, n=8), _state(5)
    with shardsafe.Checkpointer() as ckpt:
        h1 = ckpt.async_save(first, str(tmp_path / "a"), staging="background")
        with caplog.at_level(logging.WARNING, logger="shardsafe"):
            h2 = ckpt.async_save(second, str(tmp_path / "b"))
        assert h1.done(), "the second save started before the first finished"
        assert any("previous async save" in r.getMessage() and "/a," in r.getMessage()
                   for r in caplog.records)
        h2.result()
        ckpt.save({"x": torch.ones(2)}, str(tmp_path / "c"))  # sync save waits too
        assert h2.done()
    assert_same(shardsafe.load(str(tmp_path / "a")), _state(4, n=8))
    assert_same(shardsafe.load(str(tmp_path / "b")), _state(5))


def test_staging_slab_is_reused_while_the_layout_size_stays_close(tmp_path):
    with shardsafe.Checkpointer() as ckpt:
        ckpt.async_save(_state(6), str(tmp_path / "a")).result()
        first = ckpt._saver.arena.buffers
        ckpt.async_save(_state(7), str(tmp_path / "b"), staging="background").result()
        assert ckpt._saver.arena.buffers == first and all(a is b for a, b in zip(first, ckpt._saver.arena.buffers))
        assert ckpt._saver.arena.allocations == 1
        held = ckpt._saver.arena.nbytes
        ckpt.async_save(_state(8, n=3), str(tmp_path / "c")).result()  # new layout, fits the slab
        assert ckpt._saver.arena.allocations == 1 and ckpt._saver.arena.nbytes == held
        assert [b.nbytes for b in ckpt._saver.arena.buffers] != [b.nbytes for b in first]
        ckpt.async_save(_state(9, n=1), str(tmp_path / "d")).result()  # far smaller: a new slab
        assert ckpt._saver.arena.allocations == 2
        assert ckpt._saver.arena.nbytes < held / 2
    assert_same(shardsafe.load(str(tmp_path / "b")), _state(7))
    assert_same(shardsafe.load(str(tmp_path / "c")), _state(8, n=3))
    assert_same(shardsafe.load(str(tmp_path / "d")), _state(9, n=1))


def test_overwrite_and_metadata_pass_through(tmp_path):
    p = str(tmp_path / "c")
    shardsafe.async_save({"v": torch.zeros(4)}, p, metadata={"step": 1}).result()
    with pytest.raises(shardsafe.CheckpointError, match="already exists"):
        shardsafe.async_save({"v": torch.ones(4)}, p)
    shardsafe.async_save({"v": torch.ones(4)}, p, overwrite=True, metadata={"step": 2}).result()
    assert torch.equal(shardsafe.load(p)["v"], torch.ones(4))
    assert shardsafe.api.load.read_checkpoint_index(p).metadata == {"step": 2}


def test_overlapped_writes_save_the_same_bytes(tmp_path):
    state = _state(9)
    expect = clone_state(state)
    with shardsafe.Checkpointer(overlap_writes=True, unit_size=1 << 20) as ckpt:
        h = ckpt.async_save(state, str(tmp_path / "c"))
        mutate_state(state)
        h.result()
    assert_same(shardsafe.load(str(tmp_path / "c")), expect)


# A real write error in the background: the file-size limit (RLIMIT_FSIZE) makes the
# kernel refuse writes past 1 MiB with EFBIG (root ignores permissions, not this).
FAILING = textwrap.dedent("""
    import errno, resource, signal, sys, os, time, torch, shardsafe
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    d = sys.argv[1]
    state = {"w": torch.ones(4 << 20)}
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    ckpt = shardsafe.Checkpointer()
    h = ckpt.async_save(state, os.path.join(d, "a"), staging=sys.argv[2])
    try:
        h.result()
        print("NO ERROR FROM RESULT")
    except OSError as e:
        print("result:", errno.errorcode[e.errno])
    h2 = ckpt.async_save(state, os.path.join(d, "b"), staging=sys.argv[2])
    while not h2.done():  # let it fail in the background; nobody collects its error
        time.sleep(0.01)
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    try:
        ckpt.save(state, os.path.join(d, "c"))
        print("NO ERROR FROM NEXT SAVE")
    except shardsafe.CheckpointError as e:
        print("next save:", type(e.__cause__).__name__, errno.errorcode[e.__cause__.errno])
    ckpt.save(state, os.path.join(d, "d"))  # the error was delivered once; saving works again
    print("listing:", sorted(os.listdir(d)))
""")


@pytest.mark.parametrize("staging", ["blocking", "background"])
def test_background_write_error_reaches_result_and_next_save(tmp_path, subprocess_env, python, staging):
    r = subprocess.run([python, "-c", FAILING, str(tmp_path), staging], env=subprocess_env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "result: EFBIG" in r.stdout
    assert "next save: OSError EFBIG" in r.stdout
    assert "listing: ['d']" in r.stdout, r.stdout  # failed saves leave nothing, not even tmp dirs


FAILING_UNCOLLECTED = textwrap.dedent("""
    import resource, signal, sys, os, torch, shardsafe
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    d = sys.argv[1]
    state = {"w": torch.ones(4 << 20)}
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    shardsafe.async_save(state, os.path.join(d, "a"))  # fails in the background; never collected
    try:
        shardsafe.save(state, os.path.join(d, "b"))
        print("NO ERROR FROM NEXT SAVE")
    except shardsafe.CheckpointError as e:
        print("next save raised:", type(e.__cause__).__name__, "|", e)
    shardsafe.async_save(state, os.path.join(d, "z"))  # fails again, nobody asks before exit
""")


def test_uncollected_error_is_raised_by_next_save_and_logged_at_exit(tmp_path, subprocess_env, python):
    r = subprocess.run([python, "-c", FAILING_UNCOLLECTED, str(tmp_path)], env=subprocess_env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "next save raised: OSError" in r.stdout and "previous async save" in r.stdout
    assert "async save to" in r.stderr and "nobody called result()" in r.stderr
    assert os.listdir(tmp_path) == []


EXITING = textwrap.dedent("""
    import os, sys, torch, shardsafe
    state = {"w": [torch.full((1 << 20,), float(i)) for i in range(16)], "step": 7}
    shardsafe.async_save(state, sys.argv[1], staging=sys.argv[2])
    # the main thread ends here, with the save still in flight
""")


@pytest.mark.parametrize("staging", ["blocking", "background"])
def test_save_in_flight_at_exit_is_finished(tmp_path, subprocess_env, python, staging):
    path = str(tmp_path / "c")
    r = subprocess.run([python, "-c", EXITING, path, staging], env=subprocess_env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = shardsafe.load(path)
    assert got["step"] == 7 and all(torch.equal(t, torch.full((1 << 20,), float(i)))
                                    for i, t in enumerate(got["w"]))


def test_refused_path_raises_at_the_call_and_closed_checkpointer_refuses_saves(tmp_path):
    ckpt = shardsafe.Checkpointer()
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "precious.txt").write_text("not a checkpoint")
    # refused in planning (before any background work): raised by the call itself
    with pytest.raises(shardsafe.CheckpointError, match="not a shardsafe checkpoint"):
        ckpt.async_save({"x": torch.ones(2)}, str(tmp_path / "c"))
    ckpt.close()
    with pytest.raises(shardsafe.CheckpointError, match="closed"):
        ckpt.save({"x": torch.ones(2)}, str(tmp_path / "d"))
    assert (tmp_path / "c" / "precious.txt").read_text() == "not a checkpoint"


CLOSING = textwrap.dedent("""
    import resource, signal, sys, os, torch, shardsafe
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    with shardsafe.Checkpointer() as ckpt:
        ckpt.async_save({"w": torch.ones(4 << 20)}, os.path.join(sys.argv[1], "a"))
    print("NOT RAISED")
""")


def test_close_raises_an_uncollected_failure(tmp_path, subprocess_env, python):
    r = subprocess.run([python, "-c", CLOSING, str(tmp_path)], env=subprocess_env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "NOT RAISED" not in r.stdout
    assert "CheckpointError: the previous async save" in r.stderr and "File too large" in r.stderr
