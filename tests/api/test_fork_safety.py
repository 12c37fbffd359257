"""Fork safety (FORMAT.md section 9): a child forked after the parent
saved and loaded can save and load itself, instead of waiting forever on the parent's
I/O pool, staging pool, Checkpointer lock or in-flight save.

Each scenario runs in a fresh interpreter with a timeout, so a hang fails the test
instead of the suite; the forked children report through their exit status.
"""

from __future__ import annotations

import subprocess
import textwrap

import pytest

PRELUDE = textwrap.dedent("""
    import multiprocessing, os, sys, time
    import torch
    import shardsafe

    root = sys.argv[1]
    STATE = {"w": torch.arange(200_000, dtype=torch.float32), "step": 3}

    def same(out):
        # numpy, not torch.equal: torch's OpenMP pool is itself not fork-safe
        return out["step"] == 3 and out["w"].numpy().tobytes() == STATE["w"].numpy().tobytes()

    def child_work(name):
        path = os.path.join(root, name)
        shardsafe.save(STATE, path, overwrite=True)
        ok = same(shardsafe.load(path)) and same(shardsafe.load(path, mmap=True))
        h = shardsafe.async_save(STATE, path + "-async", overwrite=True)
        h.result(timeout=30)
        ok = ok and same(shardsafe.load(path + "-async"))
        return ok

    def wait_child(pid, limit=30.0):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return "hung"

    # the parent uses every pool first: sync save, async save, load, mmap load
    shardsafe.save(STATE, os.path.join(root, "parent"))
    shardsafe.async_save(STATE, os.path.join(root, "parent-async")).result()
    assert same(shardsafe.load(os.path.join(root, "parent")))
    assert same(shardsafe.load(os.path.join(root, "parent-async"), mmap=True))
""")

OS_FORK = PRELUDE + textwrap.dedent("""
    results = []
    for i in range(3):
        pid = os.fork()
        if pid == 0:
            try:
                code = 0 if child_work(f"child{i}") else 3
            except BaseException as e:
                print("child failed:", type(e).__name__, e, file=sys.stderr)
                code = 4
            os._exit(code)
        results.append(wait_child(pid))
    print(results)
    sys.exit(0 if results == [0, 0, 0] else 1)
""")

MP_FORK = PRELUDE + textwrap.dedent("""
    def target(i):
        sys.exit(0 if child_work(f"mp{i}") else 3)

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=target, args=(i,)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    print(codes)
    sys.exit(0 if codes == [0, 0] else 1)
""")

# Fork while an async save of the parent is still writing: the child's copy of that
# save must neither block the child's own saves nor be waited for at the child's exit.
FORK_IN_FLIGHT = PRELUDE + textwrap.dedent("""
    big = {"w": torch.randn(8_000_000)}
    handle = shardsafe.async_save(big, os.path.join(root, "inflight"), staging="background")
    pid = os.fork()
    if pid == 0:
        try:
            ok = child_work("child-inflight")
            try:
                handle.result(timeout=5)
                ok = ok and handle.done() and False  # the parent's save is not the child's
            except shardsafe.CheckpointError:
                pass
            code = 0 if ok else 3
        except BaseException as e:
            print("child failed:", type(e).__name__, e, file=sys.stderr)
            code = 4
        sys.stdout.flush()
        os._exit(code)
    code = wait_child(pid)
    handle.result(timeout=60)
    loaded = shardsafe.load(os.path.join(root, "inflight"))
    print(code)
    sys.exit(0 if code == 0 and loaded["w"].numpy().tobytes() == big["w"].numpy().tobytes() else 1)
""")


@pytest.mark.parametrize("script", [OS_FORK, MP_FORK, FORK_IN_FLIGHT],
                         ids=["os.fork", "multiprocessing-fork", "fork-during-async-save"])
def test_forked_children_save_and_load(tmp_path, python, subprocess_env, script) -> None:
    """A child that inherited the parent's pools and locks mid-use saves and loads anyway
    (a child waiting on the inherited I/O pool would hang until the timeout)."""
    r = subprocess.run([python, "-c", script, str(tmp_path)], env=subprocess_env,
                       capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, (r.stdout, r.stderr)
