"""``shardsafe ls``: steps with state, size, time and metrics; partial saves; errors."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch")

from cli_helpers import one_line_error, save_step  # noqa: E402
from helpers import flip_byte  # noqa: E402


def _partial(run: str, name: str) -> str:
    """What a SIGKILLed local save leaves: a hidden working directory with data, no index."""
    path = os.path.join(run, name)
    os.makedirs(path)
    with open(os.path.join(path, "data-r00000-000.safetensors"), "wb") as f:
        f.write(b"\0" * 100)
    return path


def test_ls_lists_steps_in_order_with_state_size_and_metrics(cli, tmp_path) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    for step in (10, 2, 5):
        save_step(run, step)
    _partial(run, ".step_00000011.shardsafe-tmp-0123456789abcdef")
    os.makedirs(os.path.join(run, "step_00000012"))  # a delete (index first) was interrupted
    os.rename(save_step(str(tmp_path / "other"), 4), os.path.join(run, "step_00000004.corrupt"))
    os.makedirs(os.path.join(run, "tensorboard"))  # not a checkpoint: not listed
    proc = cli("ls", run)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "STEP", "SIZE", "TIME", "METRICS"]
    rows = [line.split() for line in lines[1:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("step_00000002", "committed", "2"), ("step_00000004.corrupt", "corrupt", "4"),
        ("step_00000005", "committed", "5"), ("step_00000010", "committed", "10"),
        (".step_00000011.shardsafe-tmp-0123456789abcdef", "partial", "11"),
        ("step_00000012", "partial", "12")]
    assert rows[0][-1] == "loss=0.5" and rows[3][-1] == "loss=0.1"
    assert rows[1][-1] == "damaged"  # "set aside as damaged"
    assert "tensorboard" not in proc.stdout
    assert proc.stderr == ""


def test_ls_json_carries_bytes_time_and_metrics(cli, tmp_path) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    path = save_step(run, 3)
    records = json.loads(cli("ls", run, "--json").stdout)
    assert len(records) == 1
    r = records[0]
    on_disk = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path) if n != "index.json")
    assert (r["name"], r["state"], r["step"], r["bytes"]) == ("step_00000003", "committed", 3, on_disk)
    assert r["metrics"] == {"loss": pytest.approx(1 / 3)}
    assert r["time"] == pytest.approx(os.path.getmtime(os.path.join(path, "index.json")), abs=5)


def test_ls_of_a_checkpoint_shows_that_checkpoint(cli, tmp_path) -> None:  # noqa: ANN001
    path = save_step(str(tmp_path / "run"), 1)
    records = json.loads(cli("ls", path, "--json").stdout)
    assert [(r["name"], r["state"]) for r in records] == [("step_00000001", "committed")]


def test_ls_flags_a_checkpoint_whose_index_is_damaged(cli, tmp_path) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    path = save_step(run, 1)
    save_step(run, 2)
    flip_byte(os.path.join(path, "index.json"), 40)
    rows = json.loads(cli("ls", run, "--json").stdout)
    assert [(r["name"], r["state"]) for r in rows] == [("step_00000001", "corrupt"),
                                                       ("step_00000002", "committed")]
    assert "index" in rows[0]["error"]


def test_ls_missing_directory_is_one_line_exit_3(cli, tmp_path) -> None:  # noqa: ANN001
    proc = cli("ls", tmp_path / "nope")
    assert proc.returncode == 3
    assert "does not exist" in one_line_error(proc)


def test_bad_usage_exits_2(cli) -> None:  # noqa: ANN001
    assert cli("ls").returncode == 2
    assert cli("frobnicate").returncode == 2
    proc = cli("ls", "x", "--storage-options", "{not json")
    assert proc.returncode == 2 and "not valid JSON" in one_line_error(proc)
    proc = cli("ls", "x", "--storage-options", "[1]")
    assert proc.returncode == 2 and "must be a JSON object" in one_line_error(proc)
