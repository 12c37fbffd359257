"""The callers of the object-store backend through the fault-injecting proxy: manager steps
with both tiers, ``shardsafe cp`` both ways, and ``dcp.save`` through ``shardsafe.dcp.Writer``.
Each runs at high fault rates (throttling, resets, responses cut short) and must give the
right values; the faults are seeded, and each kind is seen to strike."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import shardsafe  # noqa: E402
from shardsafe import CheckpointManager  # noqa: E402

from fault_proxy import Faults  # noqa: E402

FAULTS = dict(throttle=0.1, reset=0.1, early_eof=0.1, retry_after=0)


def _state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(64, 1024, generator=g), "opt": {"m": torch.randn(4096, generator=g)},
            "ids": np.arange(50) * step, "step": step}


def _same(a: dict, b: dict) -> bool:
    return (torch.equal(a["w"], b["w"]) and torch.equal(a["opt"]["m"], b["opt"]["m"])
            and np.array_equal(a["ids"], b["ids"]) and a["step"] == b["step"])


def _struck(counts) -> bool:  # noqa: ANN001
    return sum(counts[k] for k in ("throttle", "reset", "early_eof")) > 0


def test_manager_steps_with_both_tiers(faulty_s3, tmp_path) -> None:  # noqa: ANN001
    loc = faulty_s3.loc
    faulty_s3.proxy.faults = Faults(**FAULTS)
    local = tmp_path / "local"
    with CheckpointManager(f"{loc.url}/run", storage_options=loc.storage_options, local_directory=local,
                           timeout=120) as mgr:
        for step in (1, 2):
            assert mgr.save(step, _state(step))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [1, 2]
    assert sorted(os.listdir(local)) != []  # the local tier has them too
    shutil.rmtree(local)  # the node is gone: restore from the persistent tier, through the faults
    with CheckpointManager(f"{loc.url}/run", storage_options=loc.storage_options, local_directory=local) as mgr:
        out = _state(0)
        assert mgr.restore(out) == 2 and _same(out, _state(2)) and mgr.last_restore.tier == "persistent"
    assert _struck(faulty_s3.proxy.counts), faulty_s3.proxy.counts


def test_cp_to_and_from_the_store(faulty_s3, tmp_path, cli) -> None:  # noqa: ANN001
    loc = faulty_s3.loc
    shardsafe.save(_state(7), tmp_path / "src")
    faulty_s3.proxy.faults = Faults(**FAULTS)
    o = ["--storage-options", loc.options_json()]
    up = cli("cp", tmp_path / "src", f"{loc.url}/copy", *o)
    assert up.returncode == 0, up.stderr
    down = cli("cp", f"{loc.url}/copy", tmp_path / "back", *o)
    assert down.returncode == 0, down.stderr
    assert _same(shardsafe.load(tmp_path / "back"), _state(7))
    assert _struck(faulty_s3.proxy.counts), faulty_s3.proxy.counts


def test_dcp_save_through_writer(faulty_s3) -> None:  # noqa: ANN001
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from shardsafe.dcp import Reader, Writer

    loc = faulty_s3.loc
    faulty_s3.proxy.faults = Faults(**FAULTS)
    sd = {"model": {"w": _state(5)["w"], "b": torch.arange(10.0)}, "step": 5}
    url = f"{loc.url}/dcp"
    dcp.save(sd, storage_writer=Writer(url, storage_options=loc.storage_options))
    target = {"model": {"w": torch.zeros(64, 1024), "b": torch.zeros(10)}, "step": 0}
    dcp.load(target, storage_reader=Reader(url, storage_options=loc.storage_options))
    assert torch.equal(target["model"]["w"], sd["model"]["w"]) and target["step"] == 5
    assert torch.equal(shardsafe.load(url, storage_options=loc.storage_options)["model"]["b"], torch.arange(10.0))
    assert _struck(faulty_s3.proxy.counts), faulty_s3.proxy.counts
