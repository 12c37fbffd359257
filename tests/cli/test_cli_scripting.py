"""The command in scripts: --json on every command that reports, exit code 2 for bad
arguments, DIR@latest / DIR@N for a manager's steps, a closed pipe ends it quietly, and
no terminal escapes from other libraries' messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
import torch  # noqa: E402
from cli_helpers import one_line_error, save_step  # noqa: E402
from helpers import flip_byte  # noqa: E402

from shardsafe.harness.processes import child_env  # noqa: E402


def test_verify_json(cli, tmp_path) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    for step in (1, 2):
        save_step(run, step)
    proc = cli("verify", run, "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["damaged"] == 0 and [c["name"] for c in got["checkpoints"]] == ["step_00000001", "step_00000002"]
    assert all(c["ok"] and c["problems"] == [] and c["tensors"] == 3 for c in got["checkpoints"])
    flip_byte(os.path.join(run, "step_00000002", "data-r00000-000.safetensors"), -3)
    proc = cli("verify", run, "--json")
    assert proc.returncode == 1
    got = json.loads(proc.stdout)  # nothing but the JSON on stdout
    bad = got["checkpoints"][1]
    assert got["damaged"] == 1 and not bad["ok"] and bad["step"] == 2
    assert bad["problems"][0]["file"] == "data-r00000-000.safetensors" and "checksum" in bad["problems"][0]["message"]


def test_export_and_import_json(cli, tmp_path) -> None:  # noqa: ANN001
    path = save_step(str(tmp_path / "run"), 1)
    out = tmp_path / "w.safetensors"
    proc = cli("export", path, out, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"wrote": str(out), "format": "safetensors", "kept_dtype": [],
                                       "skipped": ["optim.blob (bytes)", "optim.empty (dict)"]}
    proc = cli("import", out, tmp_path / "back", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"imported": str(out), "format": "safetensors", "into": str(tmp_path / "back")}


def test_bad_arguments_exit_2(cli, tmp_path) -> None:  # noqa: ANN001
    path = save_step(str(tmp_path / "run"), 1)
    for args in (["info", path, "--storage-options", "notjson"], ["verify", path, "--storage-options", "3"],
                 ["export", path, str(tmp_path / "x.weird")], ["export", path, "s3://b/x.pt"],
                 ["cp", path, str(tmp_path / "c"), "--dst-storage-options", "{"]):
        proc = cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        one_line_error(proc)


def test_dir_at_latest_and_at_step(cli, tmp_path) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    for step in (10, 20, 30):
        save_step(run, step)
    proc = cli("info", f"{run}@latest", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["metadata"]["shardsafe.manager"]["step"] == 30
    proc = cli("diff", f"{run}@10", f"{run}@latest")
    assert proc.returncode == 1 and "~ optim.step  int 10 -> int 30" in proc.stdout
    proc = cli("verify", f"{run}@20")
    assert proc.returncode == 0 and proc.stdout.startswith(f"OK  {run}/step_00000020:")
    proc = cli("export", f"{run}@latest", tmp_path / "w.pt")
    assert proc.returncode == 0, proc.stderr
    proc = cli("cp", f"{run}@latest", tmp_path / "copy")
    assert proc.returncode == 0, proc.stderr
    proc = cli("info", f"{run}@15")
    assert proc.returncode == 3
    assert f"{run}@15': '{run}' has no committed step 15 (newest: 10, 20, 30)" in one_line_error(proc)
    proc = cli("info", f"{tmp_path / 'absent'}@latest")
    assert proc.returncode == 3 and "no committed step; " in one_line_error(proc)
    assert "does not exist" in one_line_error(proc)


def test_a_closed_pipe_ends_the_command_quietly(tmp_path) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    for step in range(1, 4):
        save_step(run, step)
    for cmd in ("ls", "info"):
        target = run if cmd == "ls" else f"{run}@latest"
        pipe = subprocess.run(f"{sys.executable} -m shardsafe {cmd} {target} | head -1", shell=True,
                              capture_output=True, text=True, env=child_env(), timeout=120)
        assert pipe.stderr == "", pipe.stderr
        assert len(pipe.stdout.splitlines()) == 1


def test_a_closed_pipe_exit_code(tmp_path) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    save_step(run, 1)
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first line
    proc = subprocess.run([sys.executable, "-m", "shardsafe", "ls", run], stdout=w, stderr=subprocess.PIPE,
                          text=True, env=child_env(), timeout=120)
    os.close(w)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr


def test_no_terminal_escapes_from_torch(cli, tmp_path) -> None:  # noqa: ANN001
    from fractions import Fraction

    torch.save({"w": torch.ones(2), "third": Fraction(1, 3)}, tmp_path / "pickled.pt")  # not weights-only
    proc = cli("import", tmp_path / "pickled.pt", tmp_path / "ckpt")
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert "refused by torch.load(weights_only=True)" in line and "\x1b" not in line
