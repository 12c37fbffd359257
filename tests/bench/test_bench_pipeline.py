"""bench.pipeline's store rows (ratios to the ideal and to the plain transfer) and
bench.plain_s3 against the test S3 server. Tiny sizes; no timing assertions."""

from __future__ import annotations

import pytest

from shardsafe.bench import pipeline
from shardsafe.bench.pipeline import Timings
from shardsafe.bench.plain_s3 import PlainS3, payload

MiB = 1 << 20


@pytest.mark.parametrize(("up", "save", "ideal_ratio", "limit_ratio"), [
    (2.0, 3.0, 3.0, 1.5),   # the plain upload is slower than the link: it is the limit
    (0.5, 3.0, 3.0, 3.0),   # the link is slower than the plain upload: the ideal is
])
def test_store_ratios_take_the_larger_of_ideal_and_plain(up, save, ideal_ratio, limit_ratio):
    row = Timings("auto", stored=100, save_s=[save], load_s=[save], up_s=[up], down_s=[up])
    got = pipeline.store_ratios(row, 1.0)
    assert got["save / ideal"] == pytest.approx(ideal_ratio)
    assert got["save / limit"] == pytest.approx(limit_ratio)
    assert got["load / limit"] == pytest.approx(limit_ratio)


def test_store_ratios_without_plain_samples_fall_back_to_the_ideal():
    got = pipeline.store_ratios(Timings("None", stored=100, save_s=[2.0], load_s=[4.0]), 1.0)
    assert got == {"save / ideal": 2.0, "save / limit": 2.0, "load / ideal": 4.0, "load / limit": 4.0}


def _disk() -> tuple[Timings, Timings]:
    return Timings("limit", 4 * MiB, save_s=[1.0]), Timings("save", 4 * MiB, save_s=[1.1])


def _shm() -> list[Timings]:
    return [Timings("auto", 3 * MiB, [1.0], [1.0]), Timings("zstd", 3 * MiB, [1.0], [1.0])]


def test_report_has_both_store_ratios_and_targets_on_the_limit():
    store = [Timings("None", 2 * MiB, [0.3], [0.2], [0.2], [0.1]),
             Timings("auto", MiB, [0.2], [0.1], [0.1], [0.05])]
    text, targets = pipeline.report(_disk(), _shm(), 4 * MiB, store, 2 * MiB, 10 * MiB, None)
    assert "| save / ideal | save / limit |" in text and "| plain down s |" in text
    assert "| None | 2.0 | 0.200 | 0.200 | 0.300 | 1.50 | 1.50 | 0.100 | 0.200 | 1.00 | 1.00 |" in text, text
    store_targets = [t for t in targets if "throttled store" in t.name]
    assert len(store_targets) == 4
    assert all("max(ideal, plain" in t.name for t in store_targets)
    assert [t.ok for t in store_targets] == [False, True, False, True]


def test_plain_transfer_round_trip(s3):
    pytest.importorskip("boto3")
    plain = PlainS3.for_options(s3.bucket, s3.storage_options, part_size=5 * MiB, threads=2)
    body = payload(11 * MiB)  # three parts
    assert plain.upload("plain", body) > 0
    assert plain.download("plain", len(body)) > 0
    assert plain.client.get_object(Bucket=s3.bucket, Key="plain")["Body"].read() == body
    with pytest.raises(AssertionError):
        plain.download("plain", len(body) + 1)
    plain.remove("plain")
    assert plain.client.list_objects_v2(Bucket=s3.bucket).get("KeyCount", 0) == 0
