"""dcp.save through shardsafe.dcp.Writer in one process: an ordinary committed shardsafe
checkpoint that shardsafe.load, verify, info and export read, on local disk, memory:// and
S3; compression; overwrite; DCP's byte items stored as typed values."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import shardsafe
from shardsafe.cli import main as cli
from shardsafe.dcp import Reader, Writer


def _state(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": 12 + seed,
            "extra": {"names": ["a", "b"], "pair": [torch.arange(3), "x"]}}


def test_writer_makes_a_committed_checkpoint_that_shardsafe_reads(tmp_path, capsys) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    sd = _state()
    dcp.save(sd, storage_writer=Writer(path))
    assert sorted(os.listdir(path)) == ["data-r00000-000.safetensors", "index.json"]
    got = shardsafe.load(path)
    assert list(got["model"]) == list(sd["model"])
    assert all(torch.equal(got["model"][k], v) for k, v in sd["model"].items())
    assert torch.equal(got["optim"]["state"]["0"]["exp_avg"], sd["optim"]["state"][0]["exp_avg"])
    assert torch.equal(got["extra"]["pair"][0], torch.arange(3))  # a list DCP walked into
    # values DCP serialised itself come back typed (decoded with the restricted unpickler)
    assert type(got["step"]) is int and got["step"] == 12
    assert got["extra"]["names"] == ["a", "b"] and got["extra"]["pair"][1] == "x"
    assert cli(["verify", path]) == 0
    assert cli(["info", path]) == 0 and "dcp" in capsys.readouterr().out
    assert cli(["export", path, str(tmp_path / "m.safetensors"), "--only", "model"]) == 0


def test_dcp_load_reads_it_back(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    sd = _state(0)
    dcp.save(sd, storage_writer=Writer(path))
    target = _state(1)
    dcp.load(target, storage_reader=Reader(path))
    assert target["step"] == 12 and target["extra"]["names"] == ["a", "b"]
    assert all(torch.equal(target["model"][k], v) for k, v in sd["model"].items())
    assert torch.equal(target["optim"]["state"][1]["exp_avg_sq"], sd["optim"]["state"][1]["exp_avg_sq"])


def test_compression_checkpoint_id_and_overwrite(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "ckpt")
    big = {"w": torch.randn(256, 512).to(torch.bfloat16), "step": 1}  # 256 KiB: compressed
    dcp.save(big, checkpoint_id=path, storage_writer=Writer("replaced-by-checkpoint-id", compression="auto"))
    assert any(f.endswith(".blocks") for f in os.listdir(path))
    assert torch.equal(shardsafe.load(path)["w"], big["w"])
    with pytest.raises(CheckpointException, match="already exists"):
        dcp.save({"w": torch.zeros(2), "step": 2}, storage_writer=Writer(path))
    dcp.save({"w": torch.zeros(2), "step": 2}, storage_writer=Writer(path, overwrite=True))
    target = {"w": torch.ones(2), "step": 0}
    dcp.load(target, storage_reader=Reader(path))
    assert torch.equal(target["w"], torch.zeros(2)) and target["step"] == 2


@pytest.mark.parametrize("where", ["memory", "s3"])
def test_object_stores(where: str, request, tmp_path) -> None:  # noqa: ANN001
    if where == "s3":
        loc = request.getfixturevalue("s3")
        url, opts = f"{loc.url}/dcp", loc.storage_options
    else:
        url, opts = f"memory://dcp-{os.getpid()}-{tmp_path.name}", None
    sd = _state()
    dcp.save(sd, storage_writer=Writer(url, storage_options=opts, compression="zstd"))
    assert shardsafe.load(url, storage_options=opts)["model"]["0.bias"].shape == (16,)
    target = _state(1)
    dcp.load(target, storage_reader=Reader(url, storage_options=opts))
    assert all(torch.equal(target["model"][k], v) for k, v in sd["model"].items())


def test_import_shardsafe_does_not_import_dcp(subprocess_env) -> None:  # noqa: ANN001
    code = "import sys, shardsafe; print(any(m.startswith('torch.distributed.checkpoint') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], env=subprocess_env, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr
