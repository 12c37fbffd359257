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
