"""``shardsafe cp``: verified, atomic copies between local disk, memory:// and a real S3
server; --all of an incremental manager directory (standalone copies); --overwrite;
a damaged source; a SIGKILLed copy that leaves nothing committed and runs again; bounded
memory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import torch
from cli_helpers import save_step
from helpers import assert_same, flip_byte

import shardsafe
from shardsafe.cli import main


def test_copy_is_exact_verified_and_refuses_to_replace(cli, tmp_path, capsys) -> None:  # noqa: ANN001
    src, dst = save_step(str(tmp_path / "run"), 1), str(tmp_path / "copy")
    out = cli("cp", src, dst)  # the whole command (parser, output, exit code) once; then main()
    assert out.returncode == 0 and out.stdout.startswith("copied step_00000001"), out.stderr
    with open(os.path.join(src, "index.json"), "rb") as a, open(os.path.join(dst, "index.json"), "rb") as b:
        assert a.read() == b.read()  # nothing to rewrite: the same index bytes
    assert_same(shardsafe.load(dst), shardsafe.load(src))
    assert main(["cp", src, dst, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"copied": [], "skipped": ["step_00000001"],
                                                   "damaged": [], "bytes": 0}
    other = save_step(str(tmp_path / "run"), 2)
    assert main(["cp", other, dst]) == 1 and "already exists" in capsys.readouterr().err
    assert main(["cp", other, dst, "--overwrite"]) == 0
    assert shardsafe.load(dst)["optim"]["step"] == 2


def test_a_damaged_source_is_not_copied(tmp_path, capsys) -> None:  # noqa: ANN001
    src, dst = save_step(str(tmp_path / "run"), 1), str(tmp_path / "copy")
    flip_byte(os.path.join(src, "data-r00000-000.safetensors"), -3)
    assert main(["cp", src, dst]) == 4 and "checksum mismatch" in capsys.readouterr().err
    assert not os.path.exists(dst) and os.listdir(tmp_path) == ["run"]  # nothing left behind


def test_between_local_s3_and_memory(s3, tmp_path) -> None:  # noqa: ANN001
    src = save_step(str(tmp_path / "run"), 3, compression="zstd")
    opts = json.dumps(s3.storage_options)
    assert main(["cp", src, f"{s3.url}/ckpt", "--dst-storage-options", opts]) == 0
    assert main(["cp", f"{s3.url}/ckpt", "memory://cp-test/ckpt", "--src-storage-options", opts]) == 0
    assert main(["cp", "memory://cp-test/ckpt", str(tmp_path / "back")]) == 0
    assert_same(shardsafe.load(str(tmp_path / "back")), shardsafe.load(src))
    assert main(["verify", str(tmp_path / "back")]) == 0


def test_all_steps_of_an_incremental_manager_stand_alone(tmp_path, capsys) -> None:  # noqa: ANN001
    base, run = torch.randn(256, 256), tmp_path / "run"
    with shardsafe.CheckpointManager(run, max_to_keep=2, incremental=True, async_save=False) as mgr:
        for step in range(4):
            mgr.save(step, {"base": base, "adapter": torch.full((8,), float(step))})
    want = {s: shardsafe.load(str(run / f"step_{s:08d}")) for s in (2, 3)}
    assert main(["cp", str(run), str(tmp_path / "copy"), "--all", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["copied"] == ["step_00000002", "step_00000003"]
    shutil.rmtree(run)  # the copies need nothing from the source
    for s, state in want.items():
        assert_same(shardsafe.load(str(tmp_path / "copy" / f"step_{s:08d}")), state)
    assert main(["verify", str(tmp_path / "copy")]) == 0
    with shardsafe.CheckpointManager(tmp_path / "copy", read_only=True) as mgr:
        assert mgr.all_steps() == [2, 3]


def test_a_killed_copy_commits_nothing_and_runs_again(subprocess_env, tmp_path) -> None:  # noqa: ANN001
    src, dst = str(tmp_path / "big"), str(tmp_path / "copy")
    shardsafe.save({"w": torch.randn(24 << 20)}, src)  # 96 MiB: six pieces
    proc = subprocess.Popen([sys.executable, "-m", "shardsafe", "cp", src, dst], env=subprocess_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not any(".copy.shardsafe-tmp-" in d and os.listdir(tmp_path / d) for d in os.listdir(tmp_path)):
        assert proc.poll() is None and time.monotonic() < deadline, "the copy ended before the kill"
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not os.path.exists(dst)
    assert main(["cp", src, dst]) == 0  # simply run again
    assert torch.equal(shardsafe.load(dst)["w"], shardsafe.load(src)["w"])


def test_memory_stays_bounded(subprocess_env, tmp_path) -> None:  # noqa: ANN001
    src = str(tmp_path / "big")
    shardsafe.save({"w": torch.zeros(48 << 20)}, src)  # 192 MiB
    # one child: its peak memory after everything else ran (``info`` reads the index), then after cp
    code = ("import resource, sys; from shardsafe.cli import main; "
            "assert main(['info', sys.argv[1]]) == 0; a = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
            "assert main(['cp', sys.argv[1], sys.argv[2]]) == 0; "
            "print(a, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    p = subprocess.run([sys.executable, "-c", code, src, str(tmp_path / "copy")], env=subprocess_env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    before, after = map(int, p.stdout.split()[-2:])
    assert after - before < 64 << 10  # KiB: a few pieces, far below the 192 MiB copied
    assert torch.equal(shardsafe.load(str(tmp_path / "copy"))["w"], torch.zeros(48 << 20))


def test_recoding_in_batches(tmp_path) -> None:  # noqa: ANN001
    from shardsafe.engine.commit import read_index
    from shardsafe.engine.transfer.recode import recode_checkpoint
    from shardsafe.storage import LocalStorage

    state = {"w": torch.randn(300, 1000).to(torch.bfloat16), "tied": None, "small": torch.arange(5),
             "empty": torch.zeros(0, 4), "step": 7}
    state["tied"] = state["w"]
    src = str(tmp_path / "src")
    shardsafe.save(state, src)
    assert main(["cp", src, str(tmp_path / "auto"), "--compression", "auto"]) == 0
    assert any(f.endswith(".blocks") for f in os.listdir(tmp_path / "auto"))
    assert_same(shardsafe.load(str(tmp_path / "auto")), shardsafe.load(src))
    # back to raw, in batches of 64 KiB: the 600 KB tensor is cut into slabs of rows, read
    # batch by batch into one data file
    storage = LocalStorage()
    recode_checkpoint(storage, str(tmp_path / "auto"), storage, str(tmp_path / "raw"), compression=None,
                      limit=64 << 10)
    back = shardsafe.load(str(tmp_path / "raw"))
    assert_same(back, shardsafe.load(src))
    assert back["tied"] is back["w"]
    assert sorted(os.listdir(tmp_path / "raw")) == ["data-r00000-000.safetensors", "index.json"]
    (w,) = [t for t in read_index(storage, str(tmp_path / "raw")).tensors if t.key == ("w",)]
    assert len(w.chunks) == 10  # 600,000 bytes in slabs of 32 rows (64,000 bytes)
    assert main(["verify", str(tmp_path / "raw")]) == 0


def test_a_failed_copy_of_an_incremental_step_leaves_no_partial_reference(tmp_path, capsys) -> None:  # noqa: ANN001
    # step 1 references step 0's 20 MiB file (two blocks); damage in its second block stops
    # the copy after the first piece of that file has been written next to the destination
    run, out = tmp_path / "run", tmp_path / "out"
    with shardsafe.CheckpointManager(run, max_to_keep=1, incremental=True, async_save=False) as mgr:
        for step in range(2):
            mgr.save(step, {"base": torch.ones(5 << 20), "adapter": torch.full((4,), float(step))})
    src, ref = str(run / "step_00000001"), str(run / "step_00000000" / "data-r00000-000.safetensors")
    flip_byte(ref, 18 << 20)  # in the base's second block
    assert main(["cp", src, str(out / "step_00000001")]) == 4
    assert "checksum mismatch" in capsys.readouterr().err
    assert [f for _, _, files in os.walk(out) for f in files] == []  # no partial file, no leftover
    flip_byte(ref, 18 << 20)  # repaired: the same command simply runs again
    assert main(["cp", src, str(out / "step_00000001")]) == 0
    shutil.rmtree(run)
    assert torch.equal(shardsafe.load(str(out / "step_00000001"))["base"], torch.ones(5 << 20))


def test_a_copy_onto_its_own_source_keeps_it(tmp_path, capsys) -> None:  # noqa: ANN001
    src = "memory://cp-self/ckpt"  # an object store: replacing deletes the old checkpoint first
    shardsafe.save({"w": torch.arange(100.0)}, src)
    assert main(["cp", src, src, "--overwrite"]) == 0 and "up to date" in capsys.readouterr().out
    assert main(["cp", src, src, "--overwrite", "--compression", "zstd"]) == 1
    assert "is the source itself" in capsys.readouterr().err
    assert torch.equal(shardsafe.load(src)["w"], torch.arange(100.0))
    local = save_step(str(tmp_path / "run"), 1)  # a file system replaces by renaming: allowed
    assert main(["cp", local, local + "/.", "--overwrite", "--compression", "zstd"]) == 0
    assert_same(shardsafe.load(local), shardsafe.load(save_step(str(tmp_path / "again"), 1)))


def test_a_recoded_copy_is_up_to_date_when_run_again(tmp_path, capsys) -> None:  # noqa: ANN001
    run, out = tmp_path / "run", str(tmp_path / "out")
    for step in (1, 2):
        save_step(str(run), step)
    assert main(["cp", str(run), out, "--all", "--compression", "zstd"]) == 0
    shutil.rmtree(os.path.join(out, "step_00000002"))  # as if interrupted before its commit
    capsys.readouterr()
    assert main(["cp", str(run), out, "--all", "--compression", "zstd", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["copied"], got["skipped"], got["damaged"]) == (["step_00000002"], ["step_00000001"], [])
    assert_same(shardsafe.load(os.path.join(out, "step_00000002")), shardsafe.load(str(run / "step_00000002")))
    # coded another way it is another copy: refused without --overwrite
    assert main(["cp", str(run), out, "--all", "--compression", "none"]) == 1
    assert "--overwrite" in capsys.readouterr().err


def test_all_copies_the_sound_steps_and_lists_a_damaged_one(tmp_path, capsys) -> None:  # noqa: ANN001
    run, out = tmp_path / "run", str(tmp_path / "out")
    for step in (1, 2):
        save_step(str(run), step)
    flip_byte(os.path.join(run, "step_00000001", "data-r00000-000.safetensors"), -3)
    assert main(["cp", str(run), out, "--all", "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    assert got["copied"] == ["step_00000002"], got
    assert [d.split(":")[0] for d in got["damaged"]] == ["step_00000001"] and "checksum" in got["damaged"][0]
    assert os.listdir(out) == ["step_00000002"]  # nothing of the damaged step, not even a leftover


def test_a_directory_without_all_and_a_checkpoint_with_it_say_what_to_do(tmp_path, capsys) -> None:  # noqa: ANN001
    step = save_step(str(tmp_path / "run"), 1)
    assert main(["cp", str(tmp_path / "run"), str(tmp_path / "a")]) == 3
    assert "add --all" in capsys.readouterr().err
    assert main(["cp", step, str(tmp_path / "b"), "--all"]) == 3
    assert "without --all" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")
