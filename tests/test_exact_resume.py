"""Exact resume, proved with separate processes.

Process A trains N steps and saves; process B (a new interpreter) loads that
checkpoint and trains N more; process C trains 2N steps without stopping. B must end
bit-identical to C — parameters, AdamW moments and step counts, LR schedule — and
A's batches followed by B's must be exactly C's batches (shuffled StatefulDataLoader
crossing epoch boundaries, dropout drawing from the restored RNG). Negative controls
show the comparison is sharp: forgetting the RNG or the loader position is caught.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata")

from helpers import assert_same, same  # noqa: E402

from shardsafe.harness.processes import child_env  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resume_worker.py")
N = 30  # 200 samples / 16 per batch = 13 batches per epoch: both halves cross an epoch end


def _run(env: dict[str, str], *args: str) -> None:
    proc = subprocess.run([sys.executable, WORKER, *args], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"worker {args} failed:\n{proc.stderr}"


def _load(path: str) -> dict[str, Any]:
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    d = tmp_path_factory.mktemp("resume")
    env = child_env(OMP_NUM_THREADS="1")
    ckpt = str(d / "ckpt")
    out = {name: str(d / f"{name}.pt") for name in ("first", "resumed", "straight", "no_rng",
                                                      "no_loader")}
    with ThreadPoolExecutor(2) as pool:
        straight = pool.submit(_run, env, "--steps", str(2 * N), "--out", out["straight"])
        _run(env, "--steps", str(N), "--save", ckpt, "--out", out["first"])
        resumed = [pool.submit(_run, env, "--steps", str(N), "--resume", ckpt, *extra,
                               "--out", out[name])
                   for name, extra in (("resumed", ()), ("no_rng", ("--skip", "rng")),
                                       ("no_loader", ("--skip", "loader")))]
        for f in [straight, *resumed]:
            f.result()
    return {name: _load(path) for name, path in out.items()}


def test_resumed_run_matches_uninterrupted_bit_for_bit(runs: dict[str, dict[str, Any]]) -> None:
    resumed, straight = runs["resumed"], runs["straight"]
    assert resumed["step"] == straight["step"] == 2 * N
    assert_same(resumed["params"], straight["params"])
    assert_same(resumed["optim"], straight["optim"])  # exp_avg, exp_avg_sq, step, param_groups
    assert_same(resumed["sched"], straight["sched"])


def test_resumed_run_sees_the_same_batches(runs: dict[str, dict[str, Any]]) -> None:
    batches = runs["first"]["batches"] + runs["resumed"]["batches"]
    assert len(batches) == 2 * N
    assert batches == runs["straight"]["batches"]
    # the run really shuffles and really crosses epochs, else the check above proves little
    assert batches[0] != sorted(batches[0])
    assert sum(len(b) for b in batches) > 2 * 200


def test_forgetting_the_rng_changes_the_result(runs: dict[str, dict[str, Any]]) -> None:
    # same batches, different dropout masks: parameters must differ
    assert runs["no_rng"]["batches"] == runs["resumed"]["batches"]
    assert not same(runs["no_rng"]["params"], runs["straight"]["params"])


def test_forgetting_the_loader_position_changes_the_batches(runs: dict[str, dict[str, Any]]) -> None:
    assert runs["no_loader"]["batches"] != runs["resumed"]["batches"]
    assert not same(runs["no_loader"]["params"], runs["straight"]["params"])
