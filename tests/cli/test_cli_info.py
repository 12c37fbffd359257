"""``shardsafe info``: key tree with dtype, shape, bytes, chunks; format version; ranks."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch")

from cli_helpers import one_line_error, rng_heavy_state, save_step  # noqa: E402
from helpers import flip_byte  # noqa: E402
import torch  # noqa: E402


def test_info_text_lists_every_key(cli, tmp_path) -> None:  # noqa: ANN001
    path = save_step(str(tmp_path / "run"), 4)
    proc = cli("info", path, "--all")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "version 4" in out and "data written by rank(s) 0" in out  # saves write format 4
    rows = {line.split()[0]: line.split() for line in out.splitlines()[out.splitlines().index(
        next(line for line in out.splitlines() if line.startswith("KEY"))) + 1:]}
    assert rows["model.layer.weight"] == ["model.layer.weight", "float32", "[8,", "4]", "128", "B", "1"]
    assert rows["model.layer.bias"][1] == "bfloat16"
    assert rows["table"][1:3] == ["int64", "[2,"]
    assert rows["optim.step"] == ["optim.step", "int", "4"]
    assert rows["optim.betas.1"] == ["optim.betas.1", "float", "0.999"]
    assert rows["optim.empty"] == ["optim.empty", "dict", "{}"]


def test_info_json(cli, tmp_path) -> None:  # noqa: ANN001
    path = save_step(str(tmp_path / "run"), 4)
    d = json.loads(cli("info", path, "--json").stdout)
    assert d["format_version"] == 4 and d["ranks"] == [0] and d["world_size"] == 1
    assert d["metadata"]["shardsafe.manager"]["step"] == 4
    by_path = {leaf["path"]: leaf for leaf in d["leaves"]}
    w = by_path["model.layer.weight"]
    assert (w["key"], w["dtype"], w["shape"], w["bytes"], w["chunks"]) == (
        ["model", "layer.weight"], "float32", [8, 4], 128, 1)
    assert w["files"] == ["data-r00000-000.safetensors"]
    assert by_path["optim.step"] == {"key": ["optim", "step"], "path": "optim.step", "type": "int", "value": 4}
    assert by_path["optim.blob"]["type"] == "bytes"
    assert sum(f["bytes"] for f in d["files"]) == d["bytes"] == os.path.getsize(
        os.path.join(path, "data-r00000-000.safetensors"))


def test_info_on_damaged_index_exits_4_in_one_line(cli, tmp_path) -> None:  # noqa: ANN001
    path = save_step(str(tmp_path / "run"), 1)
    flip_byte(os.path.join(path, "index.json"), 50)
    proc = cli("info", path)
    assert proc.returncode == 4
    assert "index" in one_line_error(proc)


def test_info_on_a_directory_without_checkpoint_exits_3(cli, tmp_path) -> None:  # noqa: ANN001
    proc = cli("info", tmp_path)
    assert proc.returncode == 3
    assert "is an empty directory" in one_line_error(proc)


def test_info_export_diff_verify_on_a_manager_directory_name_its_steps(cli, tmp_path) -> None:  # noqa: ANN001
    run = str(tmp_path / "run")
    for step in (100, 200):
        save_step(run, step)
    for args in (["info", run], ["export", run, str(tmp_path / "out.safetensors")], ["diff", run, run]):
        proc = cli(*args)
        assert proc.returncode == 3, args
        assert "is a directory of checkpoints (steps 100, 200)" in one_line_error(proc), args
    torch.save({"w": torch.ones(2)}, tmp_path / "w.pt")
    proc = cli("verify", tmp_path / "w.pt")
    assert proc.returncode == 3
    assert "is a torch.save file, not a shardsafe checkpoint: `shardsafe import` converts it" in one_line_error(proc)


FIXTURE_V1 = os.path.join(os.path.dirname(__file__), "..", "fixtures", "v1_checkpoint")


def test_info_verify_and_ls_work_on_a_v1_checkpoint(cli, tmp_path) -> None:  # noqa: ANN001
    # the committed v1 fixture (saves now write v3): info names its version, verify passes
    d = json.loads(cli("info", FIXTURE_V1, "--json").stdout)
    assert d["format_version"] == 1 and d["leaves"]
    assert "version 1" in cli("info", FIXTURE_V1).stdout
    assert cli("verify", FIXTURE_V1).returncode == 0


def test_info_summarises_by_default_and_selects_with_only_and_depth(cli, tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    rng_heavy_state(path, 7)
    out = cli("info", path).stdout
    table_ = out[out.index("KEY"):].splitlines()
    assert table_[0].split() == ["KEY", "TENSORS", "BYTES", "OTHER", "WHAT"]
    rows = {line.split()[0]: line.split() for line in table_[1:5]}
    assert set(rows) == {"model.*", "optim.*", "rng.*", "step"}
    assert rows["model.*"][1:5] == ["4", "120", "B", "0"] and rows["step"][-2:] == ["int", "7"]
    assert int(rows["rng.*"][4]) > 600  # the RNG's plain values, counted, not listed
    assert len(out.splitlines()) < 20
    assert "4 group(s) of" in out and "--all lists every one" in out
    out = cli("info", path, "--only", "model").stdout
    rows = out[out.index("KEY"):].split("\n\n")[0].splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["model.0.*", "model.1.*"]
    out = cli("info", path, "--depth", "2").stdout
    rows = out[out.index("KEY"):].split("\n\n")[0].splitlines()[1:]
    assert [row.split()[0] for row in rows][:3] == ["model.0.*", "model.1.*", "optim.state.*"]
    assert "rng.python.*" in [row.split()[0] for row in rows]
    full = cli("info", path, "--all", "--only", "rng.python").stdout
    assert "rng.python.state.600" in full and "model.0.weight" not in full
    proc = cli("info", path, "--only", "nope")
    assert proc.returncode == 1 and "no key path 'nope'" in one_line_error(proc)
    d = json.loads(cli("info", path, "--json", "--only", "model").stdout)
    assert [leaf["path"] for leaf in d["leaves"]] == ["model.0.weight", "model.0.bias", "model.1.weight",
                                                      "model.1.bias"]
    assert cli("info", path, "--depth", "0").returncode == 2

