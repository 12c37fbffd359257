"""Where compression pays end to end: save and load with ``compression=None`` vs ``"auto"``.

One training-like state (bf16 weights and the fp32 AdamW moments of
``bench.compression``) is saved and loaded by ``shardsafe.save``/``shardsafe.load`` to a
local directory and to an S3 server on loopback (moto, a subprocess) reached through
``bench.throttle.ThrottledProxy``, a bandwidth limit standing in for a network link.
Each load is checked against the state. Medians of ``repeat`` rounds after a warm-up.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

import shardsafe

from ..harness.compare import differences
from .compression import MiB, adamw_state, weights
from ..harness import moto_server
from .measure import median, remove
from .report import _f
from .throttle import ThrottledProxy

COMPRESSIONS: tuple[str | None, ...] = (None, "auto")
_KEY, _SECRET, _REGION = "shardsafe-bench", "shardsafe-bench-secret", "us-west-2"


@dataclass
class Destination:
    """Where checkpoints go: a path prefix, its fsspec options and a sizer."""

    label: str
    prefix: str
    storage_options: dict | None = None
    fs: Any = None  # an fsspec filesystem for object stores

    def stored_bytes(self, path: str) -> int:
        if self.fs is not None:
            return int(self.fs.du(path))
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)

    def remove(self, path: str) -> None:
        shardsafe.delete(path, storage_options=self.storage_options)
        if self.fs is None:
            remove(path)


@dataclass
class Row:
    target: str
    compression: str | None
    stored: int = 0
    save_s: list[float] = field(default_factory=list)
    load_s: list[float] = field(default_factory=list)


def state(nbytes: int) -> dict[str, Any]:
    """bf16 weights of ``nbytes`` and the two fp32 AdamW moments (``nbytes`` each)."""
    avg, sq = adamw_state(nbytes)
    return {"model": {"weight": weights(nbytes, torch.bfloat16)},
            "optim": {"exp_avg": avg, "exp_avg_sq": sq}, "step": 10}


def measure(st: dict[str, Any], target: Destination, repeat: int,
            log: Callable[[str], None] | None = None) -> list[Row]:
    """Saves and loads ``st`` with each compression, ``repeat`` rounds after a warm-up."""
    rows = [Row(target.label, c) for c in COMPRESSIONS]
    for r in range(repeat + 1):
        for row in rows:
            path = f"{target.prefix}/e2e-{row.compression or 'none'}-{r}"
            t0 = time.perf_counter()
            shardsafe.save(st, path, compression=row.compression, storage_options=target.storage_options)
            t1 = time.perf_counter()
            back = shardsafe.load(path, storage_options=target.storage_options)
            t2 = time.perf_counter()
            diff = differences(st, back)
            if diff:
                raise AssertionError(f"{target.label}: the loaded state differs: {diff[:3]}")
            del back
            row.stored = target.stored_bytes(path)
            target.remove(path)
            if r:
                row.save_s.append(t1 - t0)
                row.load_s.append(t2 - t1)
            if log:
                log(f"  compression e2e {target.label} {row.compression}: save {t1 - t0:.2f}s, "
                    f"load {t2 - t1:.2f}s")
    return rows


# --- the S3 server ------------------------------------------------------------------

@contextmanager
def s3_target(rate: float) -> Iterator[Destination | str]:
    """A fresh bucket on a moto S3 server on loopback behind a ``rate`` bytes/s proxy;
    yields a sentence saying why instead when moto or s3fs is missing or it won't start."""
    try:
        import moto.server  # noqa: F401
        import s3fs
    except ImportError:
        yield "S3 skipped: needs moto[server] and s3fs (extras dev, s3)"
        return
    started = moto_server.start()
    if started is None:
        yield "S3 skipped: the moto server did not start"
        return
    proc, endpoint = started
    proxy = None
    try:
        proxy = ThrottledProxy(("127.0.0.1", int(endpoint.rsplit(":", 1)[1])), rate)
        opts = {"endpoint_url": proxy.endpoint, "key": _KEY, "secret": _SECRET,
                "client_kwargs": {"region_name": _REGION}}
        fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **opts)
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        fs.mkdir(bucket)
        yield Destination(f"S3 (moto on loopback, {rate / 1e6:.0f} MB/s link)", f"s3://{bucket}", opts, fs)
    finally:
        if proxy is not None:
            proxy.close()
        moto_server.stop(proc)


# --- the table ----------------------------------------------------------------------


def table(rows: list[Row], nbytes: int, notes: list[str]) -> str:
    out = [f"### Case compression, end to end: save + load of a {nbytes / MiB:.0f} MiB state", "",
           "bf16 weights plus the fp32 AdamW moments; `shardsafe.save` (durable) and "
           "`shardsafe.load` (a new state, checked against the saved one); medians, seconds. "
           "*speed-up*: the time with compression=None over this row's.", "",
           "| storage | compression | stored MiB | ratio | save s | load s | save speed-up | load speed-up |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    base = {r.target: r for r in rows if r.compression is None}
    for r in rows:
        b = base[r.target]
        s, ld, bs, bl = median(r.save_s), median(r.load_s), median(b.save_s), median(b.load_s)
        out.append(f"| {r.target} | {r.compression or 'None'} | {r.stored / MiB:.1f} | "
                   f"{nbytes / r.stored:.3f}x | {_f(s)} | {_f(ld)} | "
                   f"{_f(bs / s if s and bs else None, '{:.2f}x')} | {_f(bl / ld if ld and bl else None, '{:.2f}x')} |")
    out += [f"\n{n}" for n in notes]
    return "\n".join(out)


def section(nbytes: int, repeat: int, directory: str, rate: float,
            log: Callable[[str], None] | None = None) -> tuple[str, dict[str, Any]]:
    """Runs the end-to-end part: its table and raw samples."""
    st = state(nbytes)
    total = sum(t.numel() * t.element_size() for part in ("model", "optim")
                for t in st[part].values())
    rows = measure(st, Destination("local disk", os.path.join(directory, "e2e")), repeat, log)
    notes = []
    with s3_target(rate) as target:
        if isinstance(target, str):
            notes.append(target)
        else:
            rows += measure(st, target, repeat, log)
    raw = {f"{r.target} {r.compression}": {"stored": r.stored, "save_s": r.save_s, "load_s": r.load_s}
           for r in rows}
    return table(rows, total, notes), raw
