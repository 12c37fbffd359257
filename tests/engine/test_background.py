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
    go = threading.Event()
    p = SaveProgress("c", label="the parent's job")
    background.start("test", lambda: go.wait(10), p)
    pid = os.fork()
    if pid == 0:  # the child: the job's thread does not exist here
        try:
            p.handle.result(5)
        except CheckpointError as e:
            os._exit(0 if "the parent's job belongs to the parent process" in str(e) else 2)
        except BaseException:  # noqa: BLE001
            os._exit(3)
        os._exit(4)
    go.set()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    p.handle.result(10)
