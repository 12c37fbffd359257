"""Multi-process ``jax.distributed`` jobs on this CPU: the same ``save``, ``async_save``,
``load`` and ``CheckpointManager`` calls on every process, arrays spanning processes,
restored onto other meshes, process counts and frameworks; a process that never joins.

The fast representative (default suite) is one 2-process x 4-device job; the resharding
matrix, 4 processes, a SIGKILLed process and the manager's preemption run under
``-m stress``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from dist_harness import run_jax
from jax.sharding import NamedSharding
from jax_dist_state import SPECS, expected

import shardsafe
from shardsafe.harness.processes import child_env

HERE = os.path.dirname(os.path.abspath(__file__))


def _targets(mesh, specs):
    want = expected(0)
    return {"params": {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, specs[k]))
                       for k, v in want["params"].items()}, "step": 0}


def _check_here(path: str, mesh, specs) -> None:
    """Restores ``path`` in this (single) process onto ``mesh`` with ``specs``, bit-exact."""
    out = shardsafe.load(path, _targets(mesh, specs))
    want = expected(0)
    assert out["step"] == want["step"]
    for k, w in want["params"].items():
        got = out["params"][k]
        assert got.sharding.spec == specs[k]
        for s in got.addressable_shards:
            assert np.asarray(s.data).tobytes() == w[s.index].tobytes(), (k, s.index)


TORCH_CHILD = """
import hashlib, sys, torch, shardsafe
state = {"params": {"w": torch.zeros(64, 32), "b": torch.zeros(32, dtype=torch.bfloat16),
                    "e": torch.zeros(128, 16, dtype=torch.bfloat16), "m": torch.zeros(16, 8, dtype=torch.int32)},
         "step": 0}
shardsafe.load(sys.argv[1], state)
assert "jax" not in sys.modules
print(state["step"])
for k in "wbem":
    print(k, hashlib.sha256(state["params"][k].view(torch.uint8).numpy().tobytes()).hexdigest())
"""


def _check_torch(path: str) -> None:
    """Loads ``path`` into torch tensors in a process that never imports JAX."""
    out = subprocess.run([sys.executable, "-c", TORCH_CHILD, path], env=child_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split()
    want = expected(0)
    assert int(lines[0]) == want["step"]
    got = dict(zip(lines[1::2], lines[2::2]))
    assert got == {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in want["params"].items()}


def test_two_processes_save_restore_async_manager_and_an_absent_process(tmp_path, mesh42) -> None:
    out = run_jax(2, 4, ["save", "restore", "reshard", "async", "manager", "local", "absent"], str(tmp_path))
    # each process wrote its own data file (the shards it addresses with replica_id 0)
    assert out["save"][0]["files"] == ["data-r00000-000.safetensors", "data-r00001-000.safetensors",
                                       "index.json"]
    assert all(r["shards"] == 16 for r in out["restore"] + out["reshard"] + out["async"])
    assert all(r["index_read"] > 0 and r["index_received"] == 0 for r in out["restore"]), out["restore"]
    assert [r["steps"] for r in out["manager"]] == [[2, 3], [2, 3]]
    assert [r["restored"] for r in out["manager"]] == [3, 3]
    assert all("local tier is not available" in r["error"] for r in out["local"]), out["local"]
    absent = out["absent"][0]
    assert absent["error"] is not None and "rank(s) 1 of 2" in absent["error"], absent
    assert absent["took"] < 3 + 10, absent  # 3 s timeout, and some slack for this busy machine
    assert absent["step"] == expected(0)["step"]  # the previous checkpoint is still there
    assert sorted(f for f in os.listdir(tmp_path) if not f.endswith((".json", ".log"))) == \
        ["ckpt", "ckpt-async", "mgr", "mgr-local"]  # no working directory left behind
    # saved on 2 processes x 4 devices: restored in one process onto 8 devices, and into torch
    ckpt = str(tmp_path / "ckpt")
    _check_here(ckpt, mesh42, SPECS[1])
    _check_torch(ckpt)


@pytest.mark.stress
def test_resharding_matrix_and_four_processes(tmp_path, mesh42) -> None:
    saved = tmp_path / "a"
    run_jax(2, 4, ["save", "restore", "reshard"], str(saved))
    ckpt = str(saved / "ckpt")
    for nprocs, devices in ((4, 2), (2, 4), (1, 8)):
        d = tmp_path / f"p{nprocs}x{devices}"
        d.mkdir()
        os.symlink(ckpt, d / "ckpt")
        out = run_jax(nprocs, devices, ["restore", "reshard"], str(d))
        assert all(r["shards"] > 0 for r in out["restore"] + out["reshard"]), out
    _check_here(ckpt, mesh42, SPECS[2])
    # 4 processes save, every other layout restores
    four = tmp_path / "four"
    out = run_jax(4, 2, ["save", "restore", "reshard", "async", "manager", "absent"], str(four))
    assert len(out["save"][0]["files"]) == 5
    assert all("rank(s) 1" in r["error"] and r["step"] == expected(0)["step"]
               for r in (out["absent"][0], out["absent"][2], out["absent"][3])), out["absent"]
    _check_here(str(four / "ckpt"), mesh42, SPECS[0])
    _check_torch(str(four / "ckpt"))


@pytest.mark.stress
def test_a_process_sigkilled_mid_save_leaves_the_previous_checkpoint(tmp_path) -> None:
    out = run_jax(2, 4, ["save", "kill"], str(tmp_path), killed=[1], timeout=180)
    kill = out["kill"][0]
    assert kill["error"] is not None, kill
    assert kill["step"] == expected(0)["step"], kill  # nothing committed over it
    assert sorted(f for f in os.listdir(tmp_path) if not f.endswith((".json", ".log"))) == ["ckpt"]


@pytest.mark.stress
def test_manager_preemption_is_agreed_across_processes(tmp_path) -> None:
    out = run_jax(2, 4, ["preempt"], str(tmp_path))["preempt"]
    stopped = {r["stopped"] for r in out}
    assert len(stopped) == 1 and None not in stopped, out  # every process stopped at the same step
    step = stopped.pop()
    assert step >= 4 and all(r["steps"] == [step] and r["restored"] == step for r in out), out
