"""Ranged-read throughput by part size against the test server (``bench.read_parts``)."""

from __future__ import annotations

import pytest

pytest.importorskip("s3fs")

from shardsafe.bench import read_parts  # noqa: E402


def test_each_part_size_reads_the_object_and_is_reported(s3_server: str) -> None:
    out = read_parts.measure(s3_server, object_mib=12, parts_mib=[5, 8], rounds=2, probe_mib=[1, 12])
    assert out["object_mib"] == 12 and out["rounds"] == 2
    assert set(out["mib_s"]) == {5, 8} and all(len(v) == 2 and min(v) > 0 for v in out["mib_s"].values())
    assert set(out["get_4kib_ms_by_object_mib"]) == {1, 12}
    assert out["duplicates"] >= 0
