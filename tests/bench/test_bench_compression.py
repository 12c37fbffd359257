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


def test_throttled_proxy_paces_a_transfer():
    import socket
    import threading
    import time

    from shardsafe.bench.throttle import ThrottledProxy

    server = socket.create_server(("127.0.0.1", 0))
    got = bytearray()

    def sink() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(1 << 16):
                got.extend(data)

    t = threading.Thread(target=sink)
    t.start()
    proxy = ThrottledProxy(server.getsockname(), rate=8e6)
    try:
        payload = bytes(range(256)) * 4096  # 1 MiB: at least 0.13 s at 8 MB/s
        t0 = time.perf_counter()
        with socket.create_connection(("127.0.0.1", proxy.port)) as c:
            c.sendall(payload)
        t.join(30)
        took = time.perf_counter() - t0
    finally:
        proxy.close()
        server.close()
    assert bytes(got) == payload
    assert took >= len(payload) / 8e6 * 0.9


def test_end_to_end_local_rows(tmp_path):
    from shardsafe.bench import compression_e2e as e2e

    st = e2e.state(256 << 10)
    rows = e2e.measure(st, e2e.Destination("local disk", str(tmp_path / "e2e")), 1)
    assert [r.compression for r in rows] == [None, "auto"]
    assert rows[1].stored < rows[0].stored / 1.2  # "auto" really stored fewer bytes
    assert all(len(r.save_s) == len(r.load_s) == 1 for r in rows)
    text = e2e.table(rows, 3 << 18, ["a note"])
    assert "| local disk | auto |" in text and "a note" in text
    left = tmp_path / "e2e"
    assert not left.exists() or not any(left.iterdir())  # every checkpoint was deleted


@pytest.mark.slow
def test_end_to_end_section_with_the_s3_server(tmp_path):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from shardsafe.bench import compression_e2e as e2e

    text, raw = e2e.section(128 << 10, 1, str(tmp_path), 50e6)
    assert "| S3 (moto on loopback, 50 MB/s link) | auto |" in text, text
    assert len(raw) == 4
