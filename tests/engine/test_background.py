"""``engine.save.background``: every job's outcome reaches its caller the same way."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from shardsafe.engine.save import background
from shardsafe.engine.save.handle import SaveProgress
from shardsafe.errors import CheckpointError


def test_a_job_settles_its_progress_with_its_outcome() -> None:
    ok = SaveProgress("a", label="job a")
    started = threading.Event()
    go = threading.Event()

    def work() -> None:
        started.set()
        go.wait(10)

    t = background.start("test", work, ok)
    assert started.wait(10) and not ok.handle.done() and t.name == "shardsafe-test" and not t.daemon
    go.set()
    ok.handle.result(10)
    failed = SaveProgress("b", label="job b")

    def fail() -> None:
        raise CheckpointError("retention failed")

    background.start("test", fail, failed)
    with pytest.raises(CheckpointError, match="retention failed"):
        failed.handle.result(10)


def test_a_failure_nobody_collected_is_logged_at_exit_and_a_running_job_finished() -> None:
    code = (
        "import logging, time\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from shardsafe.engine.save import background\n"
        "from shardsafe.engine.save.handle import SaveProgress\n"
        "def slow():\n"
        "    time.sleep(0.5)\n"
        "    print('slow job finished', flush=True)\n"
        "def bad():\n"
        "    raise OSError('disk gone')\n"
        "background.start('slow', slow, SaveProgress('s', label='the slow job'))\n"
        "background.start('bad', bad, SaveProgress('b', label='the bad job'))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "slow job finished" in r.stdout
    assert "the bad job failed and nobody called result(): OSError: disk gone" in r.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_job_of_the_parent_raises_in_a_forked_child_instead_of_hanging() -> None:
    """In a fresh interpreter (forking a test worker full of threads is not safe): the child
    reports through its exit status, the parent's job then finishes normally."""
    code = (
        "import os, sys, threading\n"
        "from shardsafe.engine.save import background\n"
        "from shardsafe.engine.save.handle import SaveProgress\n"
        "from shardsafe.errors import CheckpointError\n"
        "go = threading.Event()\n"
        "p = SaveProgress('c', label=\"the parent's job\")\n"
        "background.start('test', lambda: go.wait(10), p)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n"
        "        p.handle.result(5)\n"
        "        os._exit(4)\n"
        "    except CheckpointError as e:\n"
        "        os._exit(0 if \"the parent's job belongs to the parent process\" in str(e) else 2)\n"
        "    except BaseException:\n"
        "        os._exit(3)\n"
        "go.set()\n"
        "_, status = os.waitpid(pid, 0)\n"
        "p.handle.result(10)\n"
        "sys.exit(os.waitstatus_to_exitcode(status))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr)
