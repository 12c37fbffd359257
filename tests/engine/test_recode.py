"""A re-encoding copy (``shardsafe cp --compression``) runs through the save pipeline: its
memory does not grow with the checkpoint's size, and its bytes come back exact."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

import shardsafe
from shardsafe.cli import main
from shardsafe.engine.commit import read_index
from shardsafe.engine.transfer.recode import recode_checkpoint
from shardsafe.errors import CorruptCheckpointError
from shardsafe.storage import LocalStorage

MiB = 1 << 20

PEAK = ("import sys; import torch; from shardsafe.cli import main; "
        "assert main(['cp', *sys.argv[1:]]) == 0; "
        "print(int(dict(l.split(':', 1) for l in open('/proc/self/status'))['VmHWM'].split()[0]))")  # KiB
# (VmHWM, not ru_maxrss: a child's ru_maxrss starts from its parent's, whose state is large)


def _peak_rss(env: dict, *args: str) -> int:
    """The peak resident memory of a fresh process running ``shardsafe cp *args`` (KiB), with
    torch imported first: the command line imports it only when a tensor needs it, and the
    ratio below compares copies made by processes of the same size, as a training job's are."""
    p = subprocess.run([sys.executable, "-c", PEAK, *args], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return int(p.stdout.split()[-1])


def _bf16_state(nbytes: int) -> dict:
    g = torch.Generator().manual_seed(0)
    return {f"w{i}": (torch.randn(16 * MiB // 2, generator=g) * 0.02).to(torch.bfloat16)
            for i in range(nbytes // (16 * MiB))}


@pytest.mark.stress
def test_a_recoding_copy_takes_memory_that_does_not_grow_with_the_checkpoint(tmp_path, subprocess_env) -> None:
    # the same copies of a 64 MiB and a 320 MiB checkpoint (both fill the copy's buffers):
    # a copy holding the source's bytes (or the destination's) takes 256 MiB more for the
    # larger one; the pipeline's own buffers take the same for both
    peaks = {}
    for size in (64 * MiB, 320 * MiB):
        state = _bf16_state(size)
        src, auto = str(tmp_path / f"src{size}"), str(tmp_path / f"auto{size}")
        shardsafe.save(state, src)
        peaks[size] = (_peak_rss(subprocess_env, src, auto, "--compression", "auto"),
                       _peak_rss(subprocess_env, auto, str(tmp_path / f"raw{size}"), "--compression", "none"))
    small, large = peaks[64 * MiB], peaks[320 * MiB]
    for coding, a, b in zip(("auto", "none"), small, large):
        assert b - a < 64 * 1024, (coding, a // 1024, b // 1024)  # KiB; MiB in the message
    got = shardsafe.load(str(tmp_path / f"raw{320 * MiB}"))
    assert all(torch.equal(got[k], v) for k, v in state.items())


def test_a_recoding_copy_takes_at_most_half_again_the_memory_of_a_plain_copy(tmp_path, subprocess_env) -> None:
    # both copies run in fresh processes of the same interpreter and imports (~230 MiB);
    # at 256 MiB of state a copy holding the source whole would be far above the bound
    src = str(tmp_path / "src")
    shardsafe.save(_bf16_state(256 * MiB), src)
    plain = _peak_rss(subprocess_env, src, str(tmp_path / "plain"))
    auto = _peak_rss(subprocess_env, src, str(tmp_path / "auto"), "--compression", "auto")
    assert auto <= 1.5 * plain, (auto // 1024, plain // 1024)  # MiB in the message
    assert auto - plain <= 128 * 1024, (auto // 1024, plain // 1024)  # the pipeline's buffers, not the state
    assert main(["verify", str(tmp_path / "auto")]) == 0


def test_a_damaged_source_stops_the_copy_in_every_unit(tmp_path) -> None:
    # 40 MiB in slabs of 64 KiB: the copy's units (16 MiB) each span many batches, and two
    # are in flight; a bad block in the second unit's batches must stop the copy, not leave
    # the first unit's thread waiting for batches that the failed unit never let go
    state = {f"w{i}": torch.arange(i * (2 * MiB), (i + 1) * (2 * MiB), dtype=torch.float32) for i in range(5)}
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    shardsafe.save(state, src)
    flip = os.path.join(src, "data-r00000-000.safetensors")
    with open(flip, "r+b") as f:
        f.seek(os.path.getsize(flip) - 19 * MiB)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    storage = LocalStorage()
    errors: list[BaseException] = []

    def copy() -> None:
        try:
            recode_checkpoint(storage, src, storage, dst, compression="zstd", limit=64 << 10)
        except CorruptCheckpointError as e:
            errors.append(e)

    t = threading.Thread(target=copy, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the copy hangs"
    assert len(errors) == 1 and "checksum" in str(errors[0])
    assert not os.path.exists(dst)


def test_a_recoded_copy_is_one_data_file_and_one_block_file(tmp_path) -> None:
    state = {"w": (torch.randn(3000, 1000) * 0.02).to(torch.bfloat16), "b": torch.arange(10), "s": 3}
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    shardsafe.save(state, src)
    assert main(["cp", src, dst, "--compression", "auto"]) == 0
    assert sorted(os.listdir(dst)) == ["data-r00000-000.blocks", "data-r00000-000.safetensors", "index.json"]
    index = read_index(LocalStorage(), dst)
    assert {f.rank for f in index.files} == {0}
    got = shardsafe.load(dst)
    assert torch.equal(got["w"], state["w"]) and torch.equal(got["b"], state["b"]) and got["s"] == 3
    assert main(["verify", dst]) == 0
