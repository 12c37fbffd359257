"""One writable manager per directory: a live owner is named, a dead one's lock is taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import torch

from shardsafe import CheckpointError, CheckpointManager
from shardsafe.manager.lock import LOCK_NAME

_OWNER = """
import sys, torch
from shardsafe import CheckpointManager
mgr = CheckpointManager(sys.argv[1], async_save=False)
mgr.save(1, {"w": torch.ones(4)})
print("ready", flush=True)
sys.stdin.read()  # hold the directory until the parent closes stdin (or kills us)
mgr.close()
print("closed", flush=True)
"""


def start_owner(directory: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _OWNER, directory], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=os.environ)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_second_writable_manager_names_the_live_owner(tmp_path) -> None:
    owner = start_owner(str(tmp_path))
    try:
        with pytest.raises(CheckpointError, match=f"pid {owner.pid} on host "
                                                  f"'{socket.gethostname()}'.*read_only=True"):
            CheckpointManager(tmp_path)
        # the refused manager touched nothing: the owner's lock and step are intact
        lock = json.loads((tmp_path / LOCK_NAME).read_text())
        assert lock["pid"] == owner.pid and lock["host"] == socket.gethostname()
        assert lock["started"] > 0
        # readers need no lock
        with CheckpointManager(tmp_path, read_only=True) as ro:
            assert ro.all_steps() == [1]
    finally:
        assert owner.stdin is not None
        owner.stdin.close()
        assert owner.stdout is not None and owner.stdout.read().strip() == "closed"
        owner.wait()
    assert not (tmp_path / LOCK_NAME).exists()  # close released it
    with CheckpointManager(tmp_path) as mgr:  # and the directory is free again
        assert mgr.save(2, {"w": torch.ones(4)})


def test_stale_lock_of_a_killed_owner_is_taken_over(tmp_path, caplog) -> None:
    owner = start_owner(str(tmp_path))
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == owner.pid
    with CheckpointManager(tmp_path) as mgr:
        assert f"stale lock of pid {owner.pid}" in caplog.text
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
        assert mgr.all_steps() == [1] and mgr.save(2, {"w": torch.ones(4)})
    assert not (tmp_path / LOCK_NAME).exists()


def test_lock_of_another_host_is_trusted(tmp_path) -> None:
    (tmp_path / LOCK_NAME).write_text(json.dumps(
        {"host": "elsewhere", "pid": 1, "started": 0.0, "token": "x"}))
    with pytest.raises(CheckpointError, match="host 'elsewhere'.*if that job is gone, delete"):
        CheckpointManager(tmp_path)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["host"] == "elsewhere"


def test_same_process_second_manager_and_release_on_failed_constructor(tmp_path) -> None:
    with CheckpointManager(tmp_path):
        with pytest.raises(CheckpointError, match=f"pid {os.getpid()}"):
            CheckpointManager(tmp_path)
        assert (tmp_path / LOCK_NAME).exists()  # the refused one did not remove the owner's lock
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_is_never_seen_before_it_is_complete(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first manager is paused between creating its lock and writing it; a second one
    starting in that moment must not take the lock over as damaged: exactly one owns."""
    import threading

    real_write = os.write
    paused, resume = threading.Event(), threading.Event()

    def slow_write(fd: int, data: bytes) -> int:
        if threading.current_thread().name == "first" and b'"token"' in bytes(data):
            paused.set()
            resume.wait(10)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", slow_write)
    outcome: dict[str, object] = {}

    def first() -> None:
        try:
            outcome["first"] = CheckpointManager(tmp_path)
        except CheckpointError as e:
            outcome["first"] = e

    t = threading.Thread(target=first, name="first")
    t.start()
    assert paused.wait(10)
    try:
        second: object = CheckpointManager(tmp_path)
    except CheckpointError as e:
        second = e
    resume.set()
    t.join(10)
    owners = [m for m in (outcome["first"], second) if isinstance(m, CheckpointManager)]
    assert len(owners) == 1, (outcome["first"], second)
    assert any(isinstance(m, CheckpointError) and "already has a writable" in str(m)
               for m in (outcome["first"], second))
    owners[0].close()
    assert not (tmp_path / LOCK_NAME).exists()


@pytest.mark.parametrize("content", [
    b'{"host": "h", "pid": 100000000000000000000000000000, "started": 0.0, "token": "x"}',
    b'{"host": "h", "pid": -1, "started": 0.0, "token": "x"}',
    b'{"host": "h", "pid": 0, "started": 0.0, "token": "x"}',
    b'{"host": "h", "pid": true, "started": 0.0, "token": "x"}',
    b'{"host": "h", "pid": 5, "started": 1e308, "token": "x"}',
    b'{"host": "h", "pid": 5, "started": NaN, "token": "x"}',
    b'{"host": "h", "pid": 5, "started": Infinity, "token": "x"}',
    b'{"host": ["h"], "pid": 5, "started": 0, "token": "x"}',
    b"[" * 100_000 + b"]" * 100_000,
    b"\xff\xfe",
    b"",
    b"null",
], ids=["huge pid", "negative pid", "pid 0", "bool pid", "time 1e308", "NaN time", "infinite time",
        "host list", "deep JSON", "not UTF-8", "empty", "null"])
def test_forged_lock_contents_are_damage_not_a_crash(tmp_path, caplog, content: bytes) -> None:
    (tmp_path / LOCK_NAME).write_bytes(content)
    with CheckpointManager(tmp_path) as mgr:
        assert "taking over the damaged lock" in caplog.text
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
        assert mgr.save(1, {"w": torch.ones(2)})


def test_a_huge_sparse_lock_is_not_read(tmp_path) -> None:
    lock = tmp_path / LOCK_NAME
    with open(lock, "wb") as f:
        f.truncate(900 << 20)  # 900 MiB of holes: reading it whole costs 1.8 GB and seconds
    code = ("import resource, sys, time\n"
            "from shardsafe.manager.lock import DirectoryLock\n"
            "from shardsafe.storage import LocalStorage\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "t = time.perf_counter()\n"
            "DirectoryLock.acquire(LocalStorage(), sys.argv[1], 'run').release()\n"
            "print(time.perf_counter() - t, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                         timeout=120, env=os.environ)
    assert out.returncode == 0, out.stderr
    seconds, extra_mib = out.stdout.split()
    assert float(seconds) < 1 and int(extra_mib) < 50, out.stdout
    assert not lock.exists()


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_lock_that_is_no_file_is_never_followed(tmp_path, caplog, kind: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    run = tmp_path / "run"
    run.mkdir()
    lock = run / LOCK_NAME
    if kind == "symlink":
        os.symlink(outside / "keep.txt", lock)
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
        (lock / "inside.txt").write_text("keep")
    if kind == "directory":
        with pytest.raises(CheckpointError, match="is a directory"):
            CheckpointManager(run)
        assert (lock / "inside.txt").read_text() == "keep"
    else:
        with CheckpointManager(run) as mgr:
            assert mgr.save(1, {"w": torch.ones(2)})
        assert "damaged lock" in caplog.text
    assert (outside / "keep.txt").read_text() == "keep"


def test_two_managers_taking_over_one_stale_lock_do_not_both_own_it(tmp_path) -> None:
    """Both find the lock of a dead owner; the second is held just after judging it stale,
    until the first has taken it over. The second must then see the new owner, not delete
    the first one's fresh lock."""
    import logging
    import threading

    owner = start_owner(str(tmp_path))
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    judged, first_done = threading.Event(), threading.Event()

    class HoldSecond(logging.Handler):
        def handle(self, record: logging.LogRecord) -> bool:  # not emit: no handler lock held
            if threading.current_thread().name == "second" and "taking over" in record.getMessage():
                judged.set()
                first_done.wait(10)
            return True

    handler = HoldSecond()
    logging.getLogger("shardsafe").addHandler(handler)
    outcome: dict[str, object] = {}

    def second() -> None:
        try:
            outcome["second"] = CheckpointManager(tmp_path)
        except CheckpointError as e:
            outcome["second"] = e

    try:
        t = threading.Thread(target=second, name="second")
        t.start()
        assert judged.wait(10)
        first = CheckpointManager(tmp_path)  # takes the stale lock over while the second waits
        first_done.set()
        t.join(10)
    finally:
        logging.getLogger("shardsafe").removeHandler(handler)
        first_done.set()
    assert isinstance(outcome["second"], CheckpointError), outcome["second"]
    assert "already has a writable CheckpointManager" in str(outcome["second"])
    assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == first._owner_lock.owner.token
    first.close()
