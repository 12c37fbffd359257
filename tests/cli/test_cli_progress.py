"""Progress bars of verify, cp, export and diff in a real terminal (a pseudo-terminal for
stdout and stderr): a result line is never printed onto a bar's line, the bar is cleared
when the command ends, ``--quiet`` draws none, and without a terminal there is none."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest
import torch

import shardsafe
from shardsafe.harness.processes import child_env

pytest.importorskip("tqdm")

_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _in_terminal(*args: str) -> tuple[int, str]:
    """Runs ``shardsafe *args`` with stdout and stderr on one pseudo-terminal; exit code
    and everything the terminal received."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 x 100, as a window
    proc = subprocess.Popen([sys.executable, "-m", "shardsafe", *args], stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave, env=child_env())
    os.close(slave)
    out = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return proc.wait(120), out.decode("utf-8", "replace")


def _screen_lines(raw: str) -> list[str]:
    """What each line of the terminal shows at the end: the text after its last carriage
    return, escape sequences removed, blank lines dropped."""
    lines = [_ESCAPE.sub("", line.rsplit("\r", 1)[-1]) for line in raw.replace("\r\n", "\n").split("\n")]
    return [line for line in lines if line.strip()]


@pytest.fixture
def run_dir(tmp_path) -> str:  # noqa: ANN001
    run = str(tmp_path / "run")
    with shardsafe.CheckpointManager(run) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, {"w": torch.randn(256, 1024)})  # 1 MiB each
    return run


def test_verify_draws_its_bar_apart_from_the_results_and_clears_it(run_dir) -> None:  # noqa: ANN001
    code, raw = _in_terminal("verify", run_dir)
    assert code == 0, raw
    assert "verify:" in raw  # a bar was drawn on the terminal
    assert _screen_lines(raw) == [f"OK  step_0000000{s}: 1 tensors, 1 file(s)" for s in (1, 2, 3)], raw


def test_cp_results_stand_on_lines_of_their_own(run_dir, tmp_path) -> None:  # noqa: ANN001
    code, raw = _in_terminal("cp", "--all", run_dir, str(tmp_path / "copy"))
    assert code == 0, raw
    assert "cp:" in raw
    lines = _screen_lines(raw)
    assert len(lines) == 3 and all(re.fullmatch(r"copied step_0000000\d \(1 file\(s\), .*\)", x) for x in lines), raw


def test_quiet_draws_no_bar(run_dir, tmp_path) -> None:  # noqa: ANN001
    code, raw = _in_terminal("verify", "--quiet", run_dir)
    assert code == 0 and "verify:" not in raw and "\r" not in raw.replace("\r\n", "\n"), raw
    code, raw = _in_terminal("export", "-q", f"{run_dir}/step_00000001", str(tmp_path / "w.safetensors"))
    assert code == 0 and "export:" not in raw, raw
    assert _screen_lines(raw) == [f"wrote {tmp_path / 'w.safetensors'}"]


def test_no_terminal_no_bar(run_dir) -> None:  # noqa: ANN001
    proc = subprocess.run([sys.executable, "-m", "shardsafe", "verify", run_dir], capture_output=True,
                          text=True, env=child_env(), timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
