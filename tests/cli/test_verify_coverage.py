"""``shardsafe verify`` verifies everything it claims (FORMAT.md section 9):
the whole safetensors header of each data file against the index, in bounded memory."""

from __future__ import annotations

import json
import os
import resource
import subprocess

import pytest
import torch

import shardsafe
from shardsafe.format.checksum import crc32c
from shardsafe.format.index.versions import decode_index, encode_index

DATA = "data-r00000-000.safetensors"


def _verify_bounded(python: str, env: dict, ckpt: str, mem_limit: int):
    """``shardsafe verify`` in a child whose address space is limited to ``mem_limit`` bytes."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))
    return subprocess.run([python, "-m", "shardsafe", "verify", ckpt], env=env, capture_output=True,
                          text=True, timeout=300, preexec_fn=limit)


def _patch_header(ckpt: str, old: bytes, new: bytes) -> None:
    assert len(old) == len(new)
    path = os.path.join(ckpt, DATA)
    with open(path, "rb") as f:
        data = f.read()
    i = data.index(old)
    with open(path, "r+b") as f:
        f.seek(i)
        f.write(new)


def _reseal(ckpt: str, raw: dict) -> None:
    raw.pop("index_checksum", None)
    prefix = json.dumps(raw, separators=(",", ":"))[:-1].encode()
    with open(os.path.join(ckpt, "index.json"), "wb") as f:
        f.write(prefix + b',"index_checksum":"crc32c:%08x"}\n' % crc32c(prefix))


def _raw(ckpt: str) -> dict:
    """The index as v1 JSON (saves write v3; these forgeries edit the v1 form, which readers
    still accept, so what rejects them is the validation)."""
    with open(os.path.join(ckpt, "index.json"), "rb") as f:
        return json.loads(encode_index(decode_index(f.read()), version=1))


@pytest.fixture
def ckpt(tmp_path) -> str:
    path = str(tmp_path / "ckpt")
    shardsafe.save({"w": torch.arange(1000, dtype=torch.float32).reshape(10, 100),
                    "e1": torch.zeros(0), "e2": torch.zeros(0, 3), "n": 1}, path)
    return path


def test_intact_checkpoint_is_ok(ckpt, cli) -> None:
    r = cli("verify", ckpt)
    assert r.returncode == 0 and r.stdout.startswith("OK"), r


@pytest.mark.parametrize("old,new,words", [
    (b'"dtype":"F32","shape":[10,100]', b'"dtype":"F3c","shape":[10,100]', "unknown dtype 'F3c'"),
    (b'"dtype":"F32","shape":[10,100]', b'"dtype":"I32","shape":[10,100]', "the index says F32"),
    (b'"shape":[10,100]', b'"shape":[100,10]', "the index says F32[10, 100]"),
    (b'"w":{', b'"v":{', "should be named 'w'"),
    (b'"format":"pt"', b'"format":1234', "__metadata__ is not a map of strings"),
], ids=["dtype-F3c", "dtype-I32", "shape", "name", "metadata"])
def test_flipped_header_field_is_reported(ckpt, cli, old, new, words) -> None:
    """Every field of a tensor's header entry is compared with the index, not only its
    data_offsets."""
    _patch_header(ckpt, old, new)
    r = cli("verify", ckpt)
    assert r.returncode == 1 and words in r.stdout and DATA in r.stdout, r


def test_forged_partial_chunk_metadata_is_reported(ckpt, cli) -> None:
    # a whole tensor described as a shard in shardsafe.parts
    _patch_header(ckpt, b'"format":"pt","writer":"shardsafe"',
                  b'"shardsafe.parts":"{}","format":""')
    r = cli("verify", ckpt)
    assert r.returncode == 1 and "shardsafe.parts" in r.stdout, r


def test_forged_data_start_of_8_gib_reads_little(tmp_path, python, subprocess_env) -> None:
    """A data_start of 8 GiB is refused before anything that size is allocated for the header."""
    ckpt = str(tmp_path / "ckpt")
    shardsafe.save({"w": torch.arange(4, dtype=torch.float32)}, ckpt)
    raw = _raw(ckpt)
    start = 8 << 30
    raw["files"][0].update(size=start + 16, data_start=start)
    raw["tensors"][0]["chunks"][0]["offset"] = start
    _reseal(ckpt, raw)
    os.truncate(os.path.join(ckpt, DATA), start + 16)  # sparse: the sizes agree
    r = _verify_bounded(python, subprocess_env, ckpt, 3 << 30)
    assert r.returncode == 1 and "data_start" in r.stdout and "MemoryError" not in r.stderr, r


def test_huge_block_size_is_read_in_bounded_pieces(tmp_path, python, subprocess_env) -> None:
    """A block_size of 2^40 over a 4 GiB chunk: the block is checked in bounded pieces,
    never read into one buffer."""
    ckpt = str(tmp_path / "ckpt")
    shardsafe.save({"w": torch.arange(4, dtype=torch.float32)}, ckpt)
    raw = _raw(ckpt)
    n = 1 << 30  # float32 elements: a 4 GiB chunk of zeros in a sparse file
    (f,) = raw["files"]
    t = raw["tensors"][0]
    t["shape"] = [n]
    t["chunks"][0].update(nbytes=4 * n, shape=[n], crc32c=["00000000"])
    f["size"] = f["data_start"] + 4 * n
    raw["block_size"] = 1 << 40
    _reseal(ckpt, raw)
    os.truncate(os.path.join(ckpt, DATA), f["size"])
    r = _verify_bounded(python, subprocess_env, ckpt, 3 << 30)
    # the header still says 16 bytes: reported; the block is checked without a 4 GiB buffer
    assert r.returncode == 1 and "checksum mismatch in block 0" in r.stdout, r
    assert "MemoryError" not in r.stderr, r
