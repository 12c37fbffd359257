"""The tail-tolerance acceptance run (``-m stress``): 8 saves and 8 loads of a 96 MiB state with a
60 s deadline each, through the fault proxy with 10% of connections reset, cut short or
stalled for 120 s, and then with 5% stalled alone, the stall timeout left at
its default: every call succeeds and the worst takes at most 20 s. With
``SHARDSAFE_FAULTS_REPORT=<file>`` the outcome is written there as JSON."""

from __future__ import annotations

import json
import os
import time

import pytest

torch = pytest.importorskip("torch")

import shardsafe  # noqa: E402
from shardsafe import CheckpointError  # noqa: E402

from fault_proxy import KINDS, Faults  # noqa: E402

ROUNDS, DEADLINE, WORST = 8, 60.0, 20.0
MIXED = dict(reset=0.033, early_eof=0.033, stall=0.034, stall_seconds=120)
STALLS = dict(stall=0.05, stall_seconds=120)


@pytest.mark.stress
@pytest.mark.parametrize("faults", [MIXED, STALLS], ids=["mixed-10pct", "stalls-5pct"])
def test_eight_saves_and_loads_within_the_deadline(faulty_s3, faults) -> None:  # noqa: ANN001
    loc, proxy = faulty_s3.loc, faulty_s3.proxy
    opts = loc.storage_options
    base = torch.randn(24 << 20, generator=torch.Generator().manual_seed(0))  # 96 MiB
    proxy.faults = Faults(**faults)
    ok = {"save": 0, "load": 0}
    worst = {"save": 0.0, "load": 0.0}
    errors = []
    for i in range(ROUNDS):
        state = {"w": base, "step": i}
        for kind in ("save", "load"):
            t0 = time.monotonic()
            try:
                if kind == "save":
                    shardsafe.save(state, f"{loc.url}/t{i}", storage_options=opts, timeout=DEADLINE)
                else:
                    got = shardsafe.load(f"{loc.url}/t{i}", storage_options=opts, timeout=DEADLINE)
                    assert torch.equal(got["w"], base) and got["step"] == i
                ok[kind] += 1
            except CheckpointError as e:
                errors.append(f"{kind} {i}: {e}"[:300])
            worst[kind] = max(worst[kind], time.monotonic() - t0)
    proxy.faults = Faults()
    injected = {k: proxy.counts[k] for k in KINDS}
    report = {"faults": faults, "rounds": ROUNDS, "requests": proxy.counts["requests"], "injected": injected,
              "ok": ok, "worst_s": worst, "errors": errors}
    if os.environ.get("SHARDSAFE_FAULTS_REPORT"):
        with open(os.environ["SHARDSAFE_FAULTS_REPORT"], "a") as f:
            f.write(json.dumps(report) + "\n")
    assert injected["stall"] > 0, report  # the run met what it is about
    assert ok == {"save": ROUNDS, "load": ROUNDS} and max(worst.values()) <= WORST, report
