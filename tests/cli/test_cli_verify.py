"""``shardsafe verify``: every checksum and the index; names each bad file/key; progress only on a TTY."""

from __future__ import annotations

import fcntl
import os
import pty
import subprocess
import struct
import sys
import termios
import threading

import pytest

pytest.importorskip("torch")

from cli_helpers import save_step  # noqa: E402
from helpers import flip_byte  # noqa: E402

from shardsafe.engine.commit import read_index  # noqa: E402
from shardsafe.storage import LocalStorage  # noqa: E402


def _chunk(path: str, key: tuple):  # noqa: ANN202
    index = read_index(LocalStorage(), path)
    return next(t for t in index.tensors if t.key == key).chunks[0]


def test_verify_intact_checkpoint_and_directory(cli, tmp_path) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    path = save_step(run, 1)
    save_step(run, 2)
    proc = cli("verify", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK") and proc.stderr == ""  # no progress bar without a TTY
    proc = cli("verify", run)
    assert proc.returncode == 0
    assert [line.split()[1] for line in proc.stdout.splitlines()] == ["step_00000001:", "step_00000002:"]


def test_verify_names_each_bad_file_and_key(cli, tmp_path) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    good = save_step(run, 1)
    bad = save_step(run, 2)
    w, t = _chunk(bad, ("model", "layer.weight")), _chunk(bad, ("table",))
    flip_byte(os.path.join(bad, w.file), w.offset + 5, 0x10)
    flip_byte(os.path.join(bad, t.file), t.offset + t.nbytes - 1, 0x10)
    proc = cli("verify", run)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    bad_lines = [line for line in lines if line.startswith("BAD")]
    assert len(bad_lines) == 2
    assert all("step_00000002" in line and w.file in line for line in bad_lines)
    assert any("key='model.layer.weight'" in line for line in bad_lines)
    assert any("key='table'" in line for line in bad_lines)
    assert any(line.startswith("OK") and "step_00000001" in line for line in lines)
    assert lines[-1] == "1 of 2 checkpoint(s) damaged"
    assert os.path.basename(good) not in " ".join(bad_lines)


def test_verify_reports_damaged_header_index_and_truncation(cli, tmp_path) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    header = save_step(run, 1)
    index = save_step(run, 2)
    trunc = save_step(run, 3)
    data = "data-r00000-000.safetensors"
    flip_byte(os.path.join(header, data), 20, 0x10)  # inside the safetensors JSON header
    flip_byte(os.path.join(index, "index.json"), 60, 0x10)
    with open(os.path.join(trunc, data), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(trunc, data)) - 3)
    proc = cli("verify", run)
    assert proc.returncode == 1
    out = proc.stdout
    assert f"BAD step_00000001: file='{data}' safetensors header" in out
    assert "BAD step_00000002:" in out and "index" in out
    assert "BAD step_00000003:" in out and "truncated" in out


def _read_terminal(master: int, into: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: every writer closed
            return
        if not chunk:
            return
        into.append(chunk)


def test_verify_shows_progress_on_a_terminal(tmp_path, subprocess_env) -> None:  # noqa: ANN001
    pytest.importorskip("tqdm")
    path = save_step(str(tmp_path / "run"), 1)
    master, slave = pty.openpty()
    # a real terminal has a size; tqdm draws nothing on a 0-column one
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    shown: list[bytes] = []
    # drain the terminal while the child runs: Linux drops unread pty output at hangup
    reader = threading.Thread(target=_read_terminal, args=(master, shown), daemon=True)
    reader.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "shardsafe", "verify", path], env=subprocess_env,
                              stdout=subprocess.PIPE, stderr=slave, timeout=120)
    finally:
        os.close(slave)
        reader.join(10)
        os.close(master)
    assert proc.returncode == 0
    text = b"".join(shown)
    assert b"verify" in text and b"%" in text, text
