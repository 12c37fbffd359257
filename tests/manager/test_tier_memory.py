"""Host memory of a manager with both tiers: one staged copy of the state for a step due on
both tiers, and no more than ``max_staging_bytes`` under a budget, whatever tier a step is
due on (peak RSS of a child process over the process before its first save)."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

MiB = 1 << 20

CHILD = textwrap.dedent("""
    import json, os, sys, torch, shardsafe

    def rss():
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024

    d, budget = sys.argv[1], int(sys.argv[2]) or None
    state = {"layers": [torch.randn(4 << 20) for _ in range(8)], "step": 0}  # 128 MiB
    nbytes = 8 * (16 << 20)
    with shardsafe.CheckpointManager(os.path.join(d, "warm"), local_directory=os.path.join(d, "wl")) as m:
        m.save(0, {"w": torch.ones(1 << 20)})  # imports, pools: not counted
    base, _ = rss()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    with shardsafe.CheckpointManager(os.path.join(d, "p"), save_interval_steps=2, max_staging_bytes=budget,
                                     local_directory=os.path.join(d, "l")) as mgr:
        for step in range(4):  # both tiers, local only, both, local only
            state["step"] = step
            for t in state["layers"]:
                t.add_(1.0)
            mgr.save(step, state)
            mgr.wait_until_finished()
        assert mgr.all_steps() == [0, 2] and mgr.local_steps() == [2, 3]
    peak = rss()[1]
    print(json.dumps({"nbytes": nbytes, "extra": peak - base}))
""")


@pytest.mark.parametrize("budget", [0, 32 * MiB])
def test_a_manager_with_both_tiers_holds_one_copy_or_its_budget(tmp_path, subprocess_env, python, budget) -> None:
    r = subprocess.run([python, "-c", CHILD, str(tmp_path), str(budget)], env=subprocess_env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    if budget:
        assert m["extra"] <= budget + 8 * MiB, (m["extra"] / MiB, m)
    else:  # one copy, not one per tier (two copies would be 256 MiB)
        assert m["extra"] <= m["nbytes"] + 24 * MiB, (m["extra"] / MiB, m)
