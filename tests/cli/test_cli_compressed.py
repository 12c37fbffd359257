"""The CLI on compressed checkpoints: ``verify`` checks stored and decoded bytes, ``info``
shows stored bytes and codecs, ``export`` decodes."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import shardsafe  # noqa: E402
from helpers import flip_byte  # noqa: E402
from shardsafe.engine.commit import read_index  # noqa: E402
from shardsafe.format.index.objects import Index, TensorEntry  # noqa: E402
from shardsafe.format.index.versions import encode_index  # noqa: E402
from shardsafe.plan.layout import block_file_name  # noqa: E402
from shardsafe.storage import LocalStorage  # noqa: E402

BLOCKS = block_file_name(0)


def _state() -> dict:
    g = torch.Generator().manual_seed(5)
    return {"w": (torch.randn(256, 512, generator=g) * 0.02).to(torch.bfloat16),
            "m": torch.rand(128, 256, generator=g) * 1e-6, "b": torch.ones(4), "step": 2}


@pytest.fixture
def ckpt(tmp_path) -> str:
    path = str(tmp_path / "ckpt")
    shardsafe.save(_state(), path, compression="auto")
    return path


def _bad_lines(proc) -> list[str]:  # noqa: ANN001
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return [line for line in proc.stdout.splitlines() if line.startswith("BAD")]


def test_verify_intact_compressed_checkpoint(cli, ckpt) -> None:  # noqa: ANN001
    proc = cli("verify", ckpt)
    assert proc.returncode == 0 and proc.stdout.startswith("OK"), proc.stdout + proc.stderr


def test_verify_names_damaged_stored_bytes(cli, ckpt) -> None:  # noqa: ANN001
    c = next(t for t in read_index(LocalStorage(), ckpt).tensors if t.key == ("m",)).chunks[0]
    flip_byte(os.path.join(ckpt, BLOCKS), c.offset + c.stored.nbytes // 2, 0x10)
    (line,) = _bad_lines(cli("verify", ckpt))
    assert f"file='{BLOCKS}'" in line and "key='m'" in line and "stored checksum mismatch" in line


def test_verify_checks_the_decoded_bytes_too(cli, ckpt) -> None:  # noqa: ANN001
    """An index whose raw checksum of a block is wrong: the stored bytes pass, the decoded fail."""
    index = read_index(LocalStorage(), ckpt)
    tensors = []
    for t in index.tensors:
        chunks = tuple(t.chunks)
        if t.key == ("w",):
            c = chunks[0]
            chunks = (dataclasses.replace(c, checksums=(c.checksums[0] ^ 1,) + c.checksums[1:]),)
        tensors.append(TensorEntry(t.key, t.kind, t.dtype, t.shape, chunks))
    forged = Index(tree=index.tree, tensors=tuple(tensors), files=index.files, block_size=index.block_size)
    with open(os.path.join(ckpt, "index.json"), "wb") as f:
        f.write(encode_index(forged, version=2))
    (line,) = _bad_lines(cli("verify", ckpt))
    assert "key='w'" in line and "after decoding" in line


def test_verify_checks_the_block_file_magic(cli, ckpt) -> None:  # noqa: ANN001
    flip_byte(os.path.join(ckpt, BLOCKS), 0, 0x10)
    lines = _bad_lines(cli("verify", ckpt))
    assert any("does not start with" in line and BLOCKS in line for line in lines)


def test_info_shows_stored_bytes_and_codecs(cli, ckpt) -> None:  # noqa: ANN001
    proc = cli("info", ckpt, "--json")
    assert proc.returncode == 0, proc.stderr
    leaves = {tuple(r["key"]): r for r in json.loads(proc.stdout)["leaves"] if r["type"] == "tensor"}
    assert leaves[("w",)]["stored_bytes"] < leaves[("w",)]["bytes"]
    assert leaves[("w",)]["codecs"] == ["planes16"]
    assert leaves[("b",)]["codecs"] == ["raw"] and leaves[("b",)]["stored_bytes"] == 16
    text = cli("info", ckpt, "--all").stdout
    assert "compression" in text and "STORED" in text and "planes16" in text


def test_export_decodes_compressed_tensors(cli, ckpt, tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "all.safetensors"
    proc = cli("export", ckpt, out)
    assert proc.returncode == 0, proc.stderr
    got, want = safetensors_torch.load_file(str(out)), _state()
    assert all(torch.equal(got[k], want[k]) for k in ("w", "m", "b"))
