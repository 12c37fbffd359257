"""bench.compression: the case runs every system on the same tensors and reports real round trips."""

from __future__ import annotations

import argparse

import pytest
import torch

from shardsafe import bench
from shardsafe.bench import compression
from shardsafe.format import codec

pytest.importorskip("zstandard")


@pytest.fixture(scope="module")
def run() -> tuple[str, list, dict]:
    return compression.section(256 << 10, 1)


def test_table_has_a_row_per_tensor_and_system(run):
    table, _, raw = run
    assert table.startswith("### Case compression:")
    assert set(raw) == set(compression.tensors(4096))
    for name in [*raw, compression.ADAMW_BOTH]:
        for system in compression.SYSTEMS:
            assert f"| {name} | {system} |" in table, (name, system)
    for system in ("shardsafe auto", "shardsafe zstd", "zstd-3 on raw bytes"):
        for name, row in raw.items():
            assert row[system]["stored"] and len(row[system]["compress_s"]) == 1, (name, system)
    assert raw["int64 indices (randperm)"]["ZipNN"]["note"] == "ZipNN has no mode for int64"


def test_ratios_are_those_of_real_round_trips(run):
    _, _, raw = run
    t = compression.weights(256 << 10, torch.bfloat16)
    name, stored = codec.encode(compression.raw_bytes(t), "bfloat16", "auto")
    assert name == "planes16"
    assert raw["bf16 weights N(0, 0.02)"]["shardsafe auto"]["stored"] == len(stored)
    assert raw["bf16 weights N(0, 0.02)"]["shardsafe auto"]["raw"] == 256 << 10
    with pytest.raises(AssertionError, match="same bytes"):
        compression._check(bytes(16), memoryview(bytes(15) + b"\x01"))


def test_targets_are_computed(run):
    _, targets, _ = run
    names = [t.name for t in targets]
    assert any("AdamW" in n for n in names) and any("decompress GB/s" in n for n in names)
    adam = next(t for t in targets if "AdamW" in t.name)
    assert adam.value is not None and adam.value > 1.05


def test_cases_option_accepts_compression():
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--cases", "compression", "--quick"])
    assert bench._cases(args) == ["compression"] and args.compression_size == 1 << 20
    with pytest.raises(ValueError, match="compression"):
        bench._cases(p.parse_args(["--cases", "zip"]))
