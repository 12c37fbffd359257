"""The long form of tests/storage/test_faults.py (``-m stress``): 50 saves and 50 loads of a
96 MiB state through the fault proxy at 10% throttling, 10% resets, 10% responses cut
short and 5% stalls of 120 s, each call with a deadline.

Every call either succeeds or raises a ``CheckpointError`` within its deadline (plus the
clean-up's few seconds); no value is wrong; a failed save commits nothing; the previous
committed checkpoint always loads. With ``SHARDSAFE_FAULTS_REPORT=<file>`` the outcome
(faults injected, calls, outcomes, worst times) is written there as JSON, for the
"faults" table of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

import shardsafe  # noqa: E402
from shardsafe import CheckpointError  # noqa: E402

from fault_proxy import KINDS, Faults  # noqa: E402

ROUNDS = 50
DEADLINE = 120.0
SLACK = 10.0
STALL_TIMEOUT = "5"  # moto answers a 32 MiB part in ~1 s on a quiet machine, not on a busy one


def _state(base: torch.Tensor, i: int) -> dict:
    w = base.clone()
    w[:4096] = float(i)  # every checkpoint differs from the others where a mix-up would show
    return {"w": w, "step": i}


@pytest.mark.stress
def test_fifty_saves_and_loads_of_96_mib_through_faults(faulty_s3, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("SHARDSAFE_STALL_TIMEOUT", STALL_TIMEOUT)
    loc, proxy = faulty_s3.loc, faulty_s3.proxy
    opts = loc.storage_options
    base = torch.randn(24 << 20, generator=torch.Generator().manual_seed(0))  # 96 MiB
    shardsafe.save(_state(base, -1), f"{loc.url}/c-1", storage_options=opts)
    proxy.faults = Faults(throttle=0.1, reset=0.1, early_eof=0.1, stall=0.05, stall_seconds=120)
    outcomes: dict[str, Counter[str]] = {"save": Counter(), "load": Counter()}
    worst = {"save": 0.0, "load": 0.0}
    committed = -1
    for i in range(ROUNDS):
        t0 = time.monotonic()
        try:
            shardsafe.save(_state(base, i), f"{loc.url}/c{i}", storage_options=opts, timeout=DEADLINE)
            outcomes["save"]["ok"] += 1
            committed = i
        except CheckpointError as e:
            outcomes["save"][type(e).__name__] += 1
            assert not faulty_s3.direct.filesystem().exists(f"{loc.bucket}/c{i}/index.json"), e
        worst["save"] = max(worst["save"], elapsed := time.monotonic() - t0)
        assert elapsed < DEADLINE + SLACK
        t0 = time.monotonic()
        try:
            got = shardsafe.load(f"{loc.url}/c{committed}", storage_options=opts, timeout=DEADLINE)
            assert torch.equal(got["w"], _state(base, committed)["w"]) and got["step"] == committed
            outcomes["load"]["ok"] += 1
        except CheckpointError as e:
            outcomes["load"][type(e).__name__] += 1
        worst["load"] = max(worst["load"], elapsed := time.monotonic() - t0)
        assert elapsed < DEADLINE + SLACK
    proxy.faults = Faults()
    assert torch.equal(shardsafe.load(f"{loc.url}/c{committed}", storage_options=opts)["w"],
                       _state(base, committed)["w"])  # the last committed one loads, faults gone
    report = {"rounds": ROUNDS, "mib": 96, "deadline_s": DEADLINE, "stall_timeout_s": float(STALL_TIMEOUT),
              "requests": proxy.counts["requests"], "faults": {k: proxy.counts[k] for k in KINDS},
              "outcomes": {k: dict(v) for k, v in outcomes.items()}, "worst_s": worst}
    if os.environ.get("SHARDSAFE_FAULTS_REPORT"):
        with open(os.environ["SHARDSAFE_FAULTS_REPORT"], "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps(report))
    assert all(proxy.counts[k] > 0 for k in KINDS), report
