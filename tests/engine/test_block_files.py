"""Block files: coded on the transform pool, laid out in order in aligned chunks, split
into parts once large, in bounded memory."""

from __future__ import annotations

import os

import pytest
import torch

import shardsafe
from shardsafe.engine.commit import read_index
from shardsafe.engine.save import assembly
from shardsafe.plan.layout import block_file_name
from shardsafe.storage.local import LocalFileWriter, LocalStorage


def _state() -> dict:
    g = torch.Generator().manual_seed(2)
    return {f"w{i}": (torch.randn(256, 256, generator=g) * 0.02).to(torch.bfloat16) for i in range(3)}


@pytest.mark.parametrize("how", ["sync", "async", "budget"])
def test_large_block_files_are_written_in_parts(tmp_path, monkeypatch, how) -> None:
    monkeypatch.setattr(assembly, "PART_BYTES", 1)  # every item closes its part
    state, path = _state(), str(tmp_path / "ckpt")
    if how == "sync":
        shardsafe.save(state, path, compression="zstd")
    else:
        budget = 64 << 20 if how == "budget" else None
        shardsafe.async_save(state, path, compression="zstd", max_staging_bytes=budget).result()
    index = read_index(LocalStorage(), path)
    parts = [block_file_name(0, k) for k in range(3)]
    assert sorted(f.name for f in index.files if f.name.endswith(".blocks")) == parts
    assert sorted(t.chunks[0].file for t in index.tensors) == parts
    got = shardsafe.load(path)
    assert all(torch.equal(got[k], v) for k, v in state.items())
    assert sorted(os.listdir(path)) == sorted(parts + ["data-r00000-000.safetensors", "index.json"])


def test_a_failing_write_leaves_no_checkpoint(tmp_path, monkeypatch) -> None:
    write_at = LocalFileWriter.write_at

    def refuse(self, offset, data):  # noqa: ANN001
        if self.path.endswith(".blocks"):
            raise OSError(28, "No space left on device")
        write_at(self, offset, data)

    monkeypatch.setattr(LocalFileWriter, "write_at", refuse)
    path = str(tmp_path / "ckpt")
    with pytest.raises(OSError, match="No space left") as e:
        shardsafe.save(_state(), path, compression="zstd")
    assert block_file_name(0) in str(e.value)
    assert not os.path.exists(path)


CHILD = """
import os, sys, torch, shardsafe
import shardsafe.engine.save.assembly as assembly
assembly.PART_BYTES = int(sys.argv[2])

def peak_extra(fn):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    def rss(field):
        with open("/proc/self/status") as f:
            return int(dict(l.split(":", 1) for l in f)[field].split()[0]) * 1024
    base = rss("VmRSS")
    fn()
    return rss("VmHWM") - base

state = {f"t{i}": torch.randint(0, 256, (32 << 20,), dtype=torch.uint8) for i in range(8)}
# 256 MiB of random bytes: stored raw, each unit copied once from the state
shardsafe.save({"warm": torch.ones(1 << 16)}, os.path.join(sys.argv[1], "warm"), compression="zstd")
print(peak_extra(lambda: shardsafe.save(state, os.path.join(sys.argv[1], "c"), compression="zstd")))
"""


@pytest.mark.slow
def test_sync_compressed_save_holds_a_bounded_window(tmp_path, subprocess_env, python) -> None:
    import subprocess

    MiB = 1 << 20
    r = subprocess.run([python, "-c", CHILD, str(tmp_path), str(32 * MiB)],
                       env={**subprocess_env, "SHARDSAFE_IO_THREADS": "2"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    extra = int(r.stdout.split()[-1])
    # the bounce buffers (4 x 16 MiB with 2 I/O and 2 copy threads), the block file's
    # write chunks and the coders' buffers: about 140 MiB here; holding the file (or a
    # part of it) until it is complete takes more than its 256 MiB
    assert extra < 192 * MiB, extra / MiB
