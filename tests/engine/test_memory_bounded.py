"""Host memory of async saves: about one extra copy of the state at peak, no growth over
20 consecutive saves. Measured as RSS of a child process (tolerances, not timings)."""

from __future__ import annotations

import json
import subprocess
import textwrap

CHILD = textwrap.dedent("""
    import json, os, sys, torch, shardsafe

    def rss():
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024

    def reset_peak():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS

    d, mode = sys.argv[1], sys.argv[2]
    state = {"layers": [torch.randn(2 << 20) for _ in range(8)],  # 64 MiB
             "small": [torch.randn(1000) for _ in range(200)], "step": 0}
    nbytes = sum(t.numel() * 4 for t in state["layers"] + state["small"])
    ckpt = shardsafe.Checkpointer()
    ckpt.save({"warm": torch.ones(4)}, os.path.join(d, "warm"))  # imports, pools, bounce buffers
    base, _ = rss()
    reset_peak()
    after = []
    for i in range(20):
        state["step"] = i
        h = ckpt.async_save(state, os.path.join(d, "ckpt"), overwrite=True, staging=mode)
        h.wait_staged()
        for t in state["layers"]:
            t.add_(1.0)  # training goes on
        h.result()
        after.append(rss()[0])
    ckpt.close()
    print(json.dumps({"nbytes": nbytes, "base": base, "peak": rss()[1], "after": after}))
""")

MiB = 1 << 20


def _run(tmp_path, env, python, mode):
    tmp_path.mkdir()
    r = subprocess.run([python, "-c", CHILD, str(tmp_path), mode], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_async_save_memory_is_one_copy_and_does_not_grow(tmp_path, subprocess_env, python):
    for mode in ("blocking", "background"):
        m = _run(tmp_path / mode, subprocess_env, python, mode)
        extra_peak = m["peak"] - m["base"]
        # One staging copy of the state, plus slack for thread stacks, the index and
        # allocator noise; a second copy (3x in total) would exceed this by far.
        assert extra_peak <= 1.0 * m["nbytes"] + 24 * MiB, (mode, extra_peak / MiB, m)
        print(mode, "extra peak MiB", extra_peak / MiB, "state MiB", m["nbytes"] / MiB)
        after = m["after"]
        growth = max(after[4:]) - after[3]
        assert growth <= 8 * MiB, (mode, [a // MiB for a in after])
