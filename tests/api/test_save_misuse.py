"""Misuse cannot commit a bad checkpoint.

Real threads, processes and filesystems: a thread mutating the state during a sync save,
concurrent writers on one path, a full tmpfs and a file size limit.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import shardsafe


def test_sync_save_of_a_state_mutated_meanwhile_always_verifies(tmp_path) -> None:
    # 12 MB in pieces that straddle write units: checksums must describe the bytes written
    state = {f"t{i}": torch.zeros((3 << 20) // 4 + 123 * i) for i in range(4)}
    stop = threading.Event()

    def mutate() -> None:
        while not stop.is_set():
            for t in state.values():
                t.add_(1.0)

    th = threading.Thread(target=mutate)
    th.start()
    bad = []
    try:
        for n in range(15):
            path = str(tmp_path / f"c{n}")
            shardsafe.save(state, path)
            try:
                shardsafe.load(path)
            except shardsafe.CorruptCheckpointError as e:
                bad.append(str(e))
    finally:
        stop.set()
        th.join()
    assert not bad, f"{len(bad)} of 15 committed checkpoints fail verification: {bad[0]}"


# a writer process: on each "go" line, saves to the next path and says who won
_WRITER = textwrap.dedent("""
    import os, sys, torch, shardsafe
    root, k = sys.argv[1], int(sys.argv[2])
    state = {"w": torch.full((1 << 18,), float(k)), "k": k}
    for trial, _ in enumerate(sys.stdin):
        try:
            shardsafe.save(state, os.path.join(root, f"p{trial}"))
            print("WON", flush=True)
        except shardsafe.CheckpointError as e:
            print("LOST", type(e).__name__, e, flush=True)
""")


def test_two_writers_on_one_path_one_wins_the_other_gets_checkpoint_error(tmp_path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(k)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in (1, 2)]
    try:
        for trial in range(4):  # both processes are up: each trial starts both saves at once
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            results = [p.stdout.readline().strip() for p in procs]
            assert sorted(r.split()[0] for r in results if r) == ["LOST", "WON"], results
            won = int(results.index("WON")) + 1
            state = shardsafe.load(str(tmp_path / f"p{trial}"))
            assert state["k"] == won and bool((state["w"] == float(won)).all())
            assert [n for n in os.listdir(tmp_path) if n.startswith(f".p{trial}")] == []  # loser cleaned up
    finally:
        outs = [p.communicate(timeout=120) for p in procs]  # closes stdin: the writers end
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]


def test_two_threads_racing_to_commit_one_path(tmp_path) -> None:
    # the commit race itself, many times: the rename that loses must not leak ENOTEMPTY
    errors: list[BaseException] = []
    for trial in range(10):
        path = str(tmp_path / f"t{trial}")
        barrier = threading.Barrier(2)

        def save(k: int) -> None:
            barrier.wait()
            try:
                shardsafe.save({"w": torch.full((1000,), float(k))}, path)
            except shardsafe.CheckpointError:
                pass
            except BaseException as e:  # noqa: BLE001 - collected for the assertion
                errors.append(e)

        threads = [threading.Thread(target=save, args=(k,)) for k in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert float(shardsafe.load(path)["w"][0]) in (1.0, 2.0)
    assert not errors, errors


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("how", ["save", "async_save"])
def test_disk_full_names_the_path(small_tmpfs, how) -> None:
    path = os.path.join(small_tmpfs, "ckpt")
    state = {"w": torch.zeros(1 << 20)}  # 4 MiB into 2 MiB
    with pytest.raises(OSError) as info:
        if how == "save":
            shardsafe.save(state, path)
        else:
            shardsafe.async_save(state, path).result(timeout=120)
    assert info.value.errno == errno.ENOSPC
    assert small_tmpfs in str(info.value), str(info.value)
    assert not os.path.exists(os.path.join(path, "index.json"))


_FSIZE = textwrap.dedent("""
    import errno, resource, signal, sys, torch, shardsafe
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    try:
        shardsafe.save({"w": torch.zeros(1 << 20)}, sys.argv[1])
    except OSError as e:
        # the file named is the data file in the save's working directory, beside the target
        import os
        print(e.errno == errno.EFBIG, os.path.dirname(sys.argv[1]) in str(e) and ".ckpt." in str(e), e)
""")


def test_file_size_limit_error_names_the_path(tmp_path) -> None:
    path = str(tmp_path / "ckpt")
    r = subprocess.run([sys.executable, "-c", _FSIZE, path], capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith("True True"), (r.stdout, r.stderr[-2000:])
