"""Case ``pipeline``: does a save run at the speed of its slowest stage?

Three measurements, each against what bounds it, in one run:

- **disk**: ``shardsafe.save`` of ``--size`` bytes of fp32 in 64 MiB tensors to the bench
  directory, against the direct-I/O write + fsync of the same bytes from a pre-faulted
  buffer with the I/O pool's thread count and 64 MiB requests (``bench.limits``),
  interleaved round by round. The target: the save at >= 0.9 of that limit.
- **shm**: ``save(..., compression="auto")`` and ``"zstd"`` of ``--pipeline-shm-size``
  bytes of bf16 weights drawn from N(0, 0.02) to /dev/shm through the public API, and a
  ``load`` of each into a new state (checked bit for bit); GB/s of raw tensor bytes.
  The targets: ``auto`` saves at >= 1.3 GB/s and loads at >= 2.2 GB/s; ``zstd`` takes no
  longer than ``auto``'s time scaled by the bytes each stores (``auto time x zstd stored
  / auto stored``).
- **store**: ``save``/``load`` of ``--pipeline-store-size`` bytes of such bf16 weights,
  with and without ``compression="auto"``, on an S3 server on loopback (moto) behind
  ``bench.throttle.ThrottledProxy`` at ``--pipeline-bandwidth`` bytes/s each way (300 MB/s by
  default), interleaved round by round with the machine's own limit for the same bytes: a
  plain boto3 multipart upload of as many random bytes as the row stored, through the
  same proxy to the same server, and a plain download of that object
  (``bench.plain_s3``). The target: each time <= 1.15x the larger of the ideal (stored
  bytes over the bandwidth) and the plain transfer's time; the ratio to the ideal alone
  is reported too.

Medians of ``repeat`` rounds after an unrecorded warm-up round.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import shardsafe

from ..engine.buffers import HostBuffer
from ..engine.io_pool import io_threads
from ..harness.compare import differences
from .compression import weights
from .compression_e2e import Destination, s3_target
from .limits import _direct_write
from .measure import median, remove, settle, timed
from .plain_s3 import PART_SIZE as PLAIN_PART, THREADS as PLAIN_THREADS, PlainS3, payload
from .report import Target, _f
from .states import large_tensors, nbytes

MiB = 1 << 20
SYNC_GOAL = 0.9
SHM_SAVE_GOAL, SHM_LOAD_GOAL = 1.3, 2.2  # GB/s of raw bytes
STORE_GOAL = 1.15  # time over max(stored bytes / bandwidth, plain transfer of the stored bytes)


@dataclass
class Timings:
    """Samples of one operation, seconds, and the bytes it stored; for the store, also
    the plain upload and download of that many bytes (``bench.plain_s3``)."""

    label: str
    stored: int = 0
    save_s: list[float] = field(default_factory=list)
    load_s: list[float] = field(default_factory=list)
    up_s: list[float] = field(default_factory=list)
    down_s: list[float] = field(default_factory=list)

    def save(self) -> float | None:
        """The median save time."""
        return median(self.save_s)

    def load(self) -> float | None:
        """The median load time."""
        return median(self.load_s)

    def up(self) -> float | None:
        """The median plain upload time of the stored bytes."""
        return median(self.up_s)

    def down(self) -> float | None:
        """The median plain download time of the stored bytes."""
        return median(self.down_s)


def _stored(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def measure_disk(directory: str, size: int, repeat: int,
                 log: Callable[[str], None] | None = None) -> tuple[Timings, Timings]:
    """The sync save and the direct-I/O write limit of the same bytes, interleaved."""
    state = large_tensors(size, 64 * MiB)
    total = nbytes(state)
    buf = HostBuffer(total)
    buf.array[:] = 7
    limit, save = Timings("direct-I/O write + fsync", total), Timings("shardsafe.save", total)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(io_threads()) as pool:
        for r in range(repeat + 1):
            raw = os.path.join(directory, "pipeline-limit.bin")
            settle()
            t_limit = timed(lambda: _direct_write(raw, buf, pool))
            os.remove(raw)
            path = os.path.join(directory, f"pipeline-sync-{r}")
            settle()
            t_save = timed(lambda: shardsafe.save(state, path))
            save.stored = _stored(path)
            remove(path)
            if r:
                limit.save_s.append(t_limit)
                save.save_s.append(t_save)
            if log:
                log(f"  pipeline disk: limit {t_limit:.3f}s, save {t_save:.3f}s")
    buf.close()
    return limit, save


def measure_shm(size: int, repeat: int, log: Callable[[str], None] | None = None) -> list[Timings]:
    """``auto`` and ``zstd`` saves to /dev/shm and loads of them, interleaved."""
    state = {f"w{i}": weights(min(size, 64 * MiB), torch.bfloat16, seed=i)
             for i in range(max(1, size // (64 * MiB)))}
    rows = [Timings("auto"), Timings("zstd")]
    base = tempfile.mkdtemp(prefix="shardsafe-pipeline-", dir="/dev/shm")
    try:
        for r in range(repeat + 1):
            for row in rows:
                path = os.path.join(base, f"{row.label}-{r}")
                t0 = time.perf_counter()
                shardsafe.save(state, path, compression=row.label)  # type: ignore[arg-type]
                t1 = time.perf_counter()
                back = shardsafe.load(path)
                t2 = time.perf_counter()
                if differences(state, back):
                    raise AssertionError(f"/dev/shm {row.label}: the loaded state differs")
                del back
                row.stored = _stored(path)
                remove(path)
                if r:
                    row.save_s.append(t1 - t0)
                    row.load_s.append(t2 - t1)
                if log:
                    log(f"  pipeline shm {row.label}: save {t1 - t0:.3f}s, load {t2 - t1:.3f}s")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return rows


def measure_store(size: int, rate: float, repeat: int,
                  log: Callable[[str], None] | None = None) -> tuple[list[Timings], str | None]:
    """Saves and loads through the throttled S3 server, with and without compression, each
    followed by a plain boto3 upload and download of as many bytes as it stored."""
    state = {"w": weights(size, torch.bfloat16, seed=7)}
    rows = [Timings("None"), Timings("auto")]
    with s3_target(rate) as target:
        if isinstance(target, str):
            return rows, target
        assert isinstance(target, Destination)
        plain = PlainS3.for_options(target.prefix[len("s3://"):], target.storage_options or {})
        for r in range(repeat + 1):
            for row in rows:
                comp = None if row.label == "None" else row.label
                path = f"{target.prefix}/pipeline-{row.label}-{r}"
                t0 = time.perf_counter()
                shardsafe.save(state, path, compression=comp, storage_options=target.storage_options)
                t1 = time.perf_counter()
                back = shardsafe.load(path, storage_options=target.storage_options)
                t2 = time.perf_counter()
                if differences(state, back):
                    raise AssertionError(f"store {row.label}: the loaded state differs")
                del back
                row.stored = target.stored_bytes(path)
                target.remove(path)
                body, key = payload(row.stored), f"plain-{row.label}-{r}"
                up = plain.upload(key, body)
                del body
                down = plain.download(key, row.stored)
                plain.remove(key)
                if r:
                    row.save_s.append(t1 - t0)
                    row.load_s.append(t2 - t1)
                    row.up_s.append(up)
                    row.down_s.append(down)
                if log:
                    log(f"  pipeline store {row.label}: save {t1 - t0:.3f}s, load {t2 - t1:.3f}s; "
                        f"plain upload {up:.3f}s, download {down:.3f}s of {row.stored / MiB:.1f} MiB")
    return rows, None


def _gbs(n: int, t: float | None) -> float | None:
    return n / t / 1e9 if t else None


PLAIN_NOTE = f"{PLAIN_PART // MiB} MiB parts, {PLAIN_THREADS} threads"


def store_ratios(r: Timings, ideal: float | None) -> dict[str, float | None]:
    """A store row's times over the ideal and over its limit, max(ideal, plain transfer)."""
    out: dict[str, float | None] = {}
    for what, took, plain in (("save", r.save(), r.up()), ("load", r.load(), r.down())):
        out[f"{what} / ideal"] = took / ideal if took and ideal else None
        limit = max(x for x in (ideal, plain) if x is not None) if ideal or plain else None
        out[f"{what} / limit"] = took / limit if took and limit else None
    return out


def report(disk: tuple[Timings, Timings], shm: list[Timings], shm_bytes: int, store: list[Timings],
           store_bytes: int, rate: float, note: str | None) -> tuple[str, list[Target]]:
    """The section's tables and its targets."""
    targets: list[Target] = []
    limit, save = disk
    ratio = (limit.save() / save.save()) if limit.save() and save.save() else None
    targets.append(Target("(pipeline) sync save GB/s / direct-I/O write GB/s (same threads)", ratio,
                          f">= {SYNC_GOAL}", ratio is not None and ratio >= SYNC_GOAL))
    out = [f"### Case pipeline: a save at the speed of its slowest stage", "",
           f"Disk ({limit.stored / MiB:.0f} MiB of fp32 in 64 MiB tensors, {io_threads()} I/O threads, "
           f"fsync included in both):", "",
           "| operation | s | GB/s | vs limit |", "|---|---:|---:|---:|"]
    for t in (limit, save):
        out.append(f"| {t.label} | {_f(t.save())} | {_f(_gbs(limit.stored, t.save()), '{:.2f}')} | "
                   f"{_f(limit.save() / t.save() if t.save() else None, '{:.2f}')} |")
    auto = next(r for r in shm if r.label == "auto")
    out += ["", f"/dev/shm ({shm_bytes / MiB:.0f} MiB of bf16 N(0, 0.02), public API; GB/s of raw bytes):", "",
            "| compression | stored MiB | ratio | save s | save GB/s | load s | load GB/s |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for r in shm:
        out.append(f"| {r.label} | {r.stored / MiB:.1f} | {shm_bytes / r.stored:.3f}x | {_f(r.save())} | "
                   f"{_f(_gbs(shm_bytes, r.save()), '{:.2f}')} | {_f(r.load())} | "
                   f"{_f(_gbs(shm_bytes, r.load()), '{:.2f}')} |")
    s, ld = _gbs(shm_bytes, auto.save()), _gbs(shm_bytes, auto.load())
    targets.append(Target("(pipeline) compression=auto save to /dev/shm, GB/s", s, f">= {SHM_SAVE_GOAL}",
                          s is not None and s >= SHM_SAVE_GOAL))
    targets.append(Target("(pipeline) compression=auto load from /dev/shm, GB/s", ld, f">= {SHM_LOAD_GOAL}",
                          ld is not None and ld >= SHM_LOAD_GOAL))
    zstd = next(r for r in shm if r.label == "zstd")
    for what in ("save", "load"):
        za, aa = getattr(zstd, what)(), getattr(auto, what)()
        v = za / (aa * zstd.stored / auto.stored) if za and aa and auto.stored else None
        targets.append(Target(f"(pipeline) zstd {what} time / auto's time x stored-bytes ratio", v, "<= 1.0",
                              v is not None and v <= 1.0))
    out += ["", f"Object store ({store_bytes / MiB:.0f} MiB of bf16, moto on loopback behind a "
            f"{rate / 1e6:.0f} MB/s link; *ideal*: stored bytes / bandwidth; *plain up/down*: a boto3 "
            f"upload/download of as many random bytes as the row stored ({PLAIN_NOTE}), same proxy "
            f"and server, interleaved; *limit*: the larger of ideal and plain):", "",
            "| compression | stored MiB | ideal s | plain up s | save s | save / ideal | save / limit "
            "| plain down s | load s | load / ideal | load / limit |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in store:
        ideal = r.stored / rate if r.stored else None
        row = store_ratios(r, ideal)
        out.append(f"| {r.label} | {r.stored / MiB:.1f} | {_f(ideal)} | {_f(r.up())} | {_f(r.save())} | "
                   f"{_f(row['save / ideal'], '{:.2f}')} | {_f(row['save / limit'], '{:.2f}')} | "
                   f"{_f(r.down())} | {_f(r.load())} | {_f(row['load / ideal'], '{:.2f}')} | "
                   f"{_f(row['load / limit'], '{:.2f}')} |")
        for what in ("save", "load"):
            v = row[f"{what} / limit"]
            targets.append(Target(f"(pipeline) throttled store, compression={r.label}: {what} / "
                                  f"max(ideal, plain {'upload' if what == 'save' else 'download'})", v,
                                  f"<= {STORE_GOAL}", v is not None and v <= STORE_GOAL))
    if note:
        out += ["", note]
    return "\n".join(out), targets


def section(directory: str, size: int, shm_size: int, store_size: int, rate: float, repeat: int,
            log: Callable[[str], None] | None = None) -> tuple[str, list[Target], dict[str, Any]]:
    """Runs the case: its markdown, its targets and its raw samples."""
    disk = measure_disk(directory, size, repeat, log)
    shm = measure_shm(shm_size, repeat, log)
    store, note = measure_store(store_size, rate, repeat, log)
    text, targets = report(disk, shm, shm_size, store, store_size, rate, note)
    raw = {r.label: {"stored": r.stored, "save_s": r.save_s, "load_s": r.load_s}
           for r in (*disk, *shm)}
    raw.update({f"store {r.label}": {"stored": r.stored, "save_s": r.save_s, "load_s": r.load_s,
                                     "plain_up_s": r.up_s, "plain_down_s": r.down_s}
                for r in store})
    return text, targets, raw
