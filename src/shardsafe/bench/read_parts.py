"""Ranged-read throughput against the local S3 test server, by the size of a read's parts.

``python -m shardsafe.bench.read_parts [--object-mib 256] [--parts-mib 8,16,32] [--rounds 4]``
starts the moto server the test suite uses (``harness.moto_server``), uploads one object
of random bytes, and reads it whole with ``FsspecStorage.read_into`` (parts of each size,
shrinking towards the end of the read as ``storage.batch.split`` cuts them,
``MAX_CONCURRENCY`` in flight, hedging and stall detection as configured), the sizes in
alternating order each round. It prints JSON: MiB/s per part size (each round and the
median), the duplicates sent, and the time of a 4 KiB ranged GET of an object of each
size in ``--probe-mib``: moto answers a ranged GET by reading the whole object first, so
a GET costs it time in proportion to the object's size, which a real store does not
charge (read these figures as the test server's, not a store's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any

import numpy as np

from ..harness import moto_server
from ..storage.fsspec import MAX_CONCURRENCY, FsspecStorage

MiB = 1 << 20
_OPTIONS = {"key": "bench", "secret": "bench", "client_kwargs": {"region_name": "us-west-2"}}


def _tiny_get_ms(storage: FsspecStorage, path: str) -> float:
    small = bytearray(4096)
    times = []
    for i in range(5):
        t0 = time.perf_counter()
        storage.read_into(path, i * 4096, memoryview(small))
        times.append(time.perf_counter() - t0)
    return round(1000 * statistics.median(times), 1)


def measure(endpoint: str, object_mib: int, parts_mib: list[int], rounds: int,
            probe_mib: list[int]) -> dict[str, Any]:
    """The figures of the module doc, against the S3 server at ``endpoint``."""
    bucket = f"bench-read-parts-{uuid.uuid4().hex[:8]}"
    base, root = FsspecStorage.for_url(f"s3://{bucket}/run", {"endpoint_url": endpoint, **_OPTIONS})
    base.fs.mkdir(bucket)
    data = np.random.default_rng(0).integers(0, 255, object_mib * MiB, dtype=np.uint8)
    path = f"{root}/object"
    base.write(path, [memoryview(data)])
    out = bytearray(object_mib * MiB)
    rates: dict[int, list[float]] = {p: [] for p in parts_mib}
    hedges = base._runner.tail.budget.hedges
    for r in range(rounds):
        for p in parts_mib if r % 2 == 0 else parts_mib[::-1]:
            storage = FsspecStorage(base.fs, part_size=p * MiB, max_concurrency=MAX_CONCURRENCY)
            t0 = time.perf_counter()
            storage.read_into(path, 0, memoryview(out))
            rates[p].append(object_mib / (time.perf_counter() - t0))
    if bytes(out) != data.tobytes():
        raise AssertionError("the bytes read differ from the bytes written")
    probes = {}
    for size in probe_mib:
        base.write(f"{root}/probe-{size}", [memoryview(data[: size * MiB])])
        probes[size] = _tiny_get_ms(base, f"{root}/probe-{size}")
    return {"object_mib": object_mib, "window": MAX_CONCURRENCY, "rounds": rounds,
            "mib_s": {p: [round(x) for x in v] for p, v in rates.items()},
            "median_mib_s": {p: round(statistics.median(v)) for p, v in rates.items()},
            "duplicates": base._runner.tail.budget.hedges - hedges,
            "get_4kib_ms_by_object_mib": probes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shardsafe.bench.read_parts", description=__doc__.split("\n\n")[0])
    p.add_argument("--object-mib", type=int, default=256)
    p.add_argument("--parts-mib", default="8,16,32", help="part sizes to compare, comma-separated")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--probe-mib", default="16,64,256", help="object sizes of the 4 KiB GET probe")
    a = p.parse_args(argv)
    sizes = [int(x) for x in a.parts_mib.split(",")]
    if min(sizes) < 5:
        p.error("parts of at least 5 MiB (the backend's minimum)")
    probes = [min(int(x), a.object_mib) for x in a.probe_mib.split(",")]
    started = moto_server.start()
    if started is None:
        p.error("the moto server did not start (is moto[server] installed?)")
    proc, endpoint = started
    try:
        print(json.dumps(measure(endpoint, a.object_mib, sizes, a.rounds, probes)))
    finally:
        moto_server.stop(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
