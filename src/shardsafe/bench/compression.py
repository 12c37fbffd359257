"""Case ``compression``: shardsafe's codecs against zstd on raw bytes and ZipNN, on the same tensors.

Every system compresses and decompresses the same tensors in one run, and every round
trip is checked bit for bit (a ratio is only reported for bytes that came back exact):

- ``shardsafe auto`` / ``shardsafe zstd``: ``format.codec.encode``/``decode`` of the
  engine's 16 MiB blocks on a pool of 2 threads (as the engine's I/O pool runs them);
- ``zstd-3 on raw bytes``: the ``zstandard`` package at level 3 (zstd's default) on the
  same blocks and the same 2 threads;
- ``ZipNN``: the ``zipnn`` package (``ZipNN(input_format="torch", threads=2)``, its own
  256 KiB chunks and threads) on the whole tensor (a copy: it overwrites its input);
  it has no mode for int64.

Tensors: bf16/fp16/fp32 weights drawn from N(0, 0.02); the exp_avg and exp_avg_sq of a
real ``torch.optim.AdamW`` after a few steps on an MLP; int64 indices (a permutation).
Throughput is raw bytes over wall time; medians of ``repeat`` rounds after an unrecorded
warm-up round.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..engine.prepared import BLOCK_SIZE as BLOCK  # the engine codes one checksum block at a time
from ..format import codec

THREADS = 2
MiB = 1 << 20
ZIPNN_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


@dataclass
class Measured:
    """One system on one tensor: stored bytes and timings of every round."""

    raw: int
    stored: int | None = None
    compress_s: list[float] = field(default_factory=list)
    decompress_s: list[float] = field(default_factory=list)
    compress_cpu: list[float] = field(default_factory=list)  # the process's CPU seconds
    decompress_cpu: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return self.raw / self.stored if self.stored else None

    def gbs(self, times: list[float]) -> float | None:
        return self.raw / statistics.median(times) / 1e9 if times else None


# --- tensors ------------------------------------------------------------------------

def weights(nbytes: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """``nbytes`` of weights drawn from N(0, 0.02), as ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    n = max(1, nbytes // torch.empty((), dtype=dtype).element_size())
    return (torch.randn(n, generator=g) * 0.02).to(dtype)


def adamw_state(nbytes: int, steps: int = 10, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """exp_avg and exp_avg_sq (flattened, ``nbytes`` each at most) of a real AdamW.

    An MLP of ``nbytes / 4`` parameters regresses a fixed random teacher for ``steps``
    steps (lr 1e-3, the default betas and weight decay).
    """
    torch.manual_seed(seed)
    params = max(64, nbytes // 4)
    width = 64 if params < (1 << 20) else 512
    layers = max(1, params // (width * width + width))
    model = torch.nn.Sequential(*[m for _ in range(layers)
                                  for m in (torch.nn.Linear(width, width), torch.nn.Tanh())])
    teacher = torch.nn.Linear(width, width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        x = torch.randn(32, width)
        with torch.no_grad():
            y = teacher(x)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    states = list(opt.state.values())
    avg = torch.cat([s["exp_avg"].flatten() for s in states])
    sq = torch.cat([s["exp_avg_sq"].flatten() for s in states])
    return avg, sq


def tensors(nbytes: int) -> dict[str, torch.Tensor]:
    """The case's tensors, ``nbytes`` each (the AdamW moments: what the model yields)."""
    avg, sq = adamw_state(nbytes)
    return {
        "bf16 weights N(0, 0.02)": weights(nbytes, torch.bfloat16),
        "fp16 weights N(0, 0.02)": weights(nbytes, torch.float16, 1),
        "fp32 weights N(0, 0.02)": weights(nbytes, torch.float32, 2),
        "fp32 AdamW exp_avg": avg,
        "fp32 AdamW exp_avg_sq": sq,
        "int64 indices (randperm)": torch.randperm(max(1, nbytes // 8),
                                                   generator=torch.Generator().manual_seed(3)),
    }


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def raw_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.contiguous().view(torch.uint8).numpy()).cast("B")


# --- systems ------------------------------------------------------------------------

def _blocks(n: int) -> list[tuple[int, int]]:
    return [(s, min(s + BLOCK, n)) for s in range(0, n, BLOCK)] or [(0, 0)]


def _timed(m: Measured, kind: str, fn: Callable[[], Any]) -> Any:
    """Runs ``fn``, appending its wall and process CPU seconds to ``m``'s ``kind`` lists."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    getattr(m, f"{kind}_s").append(time.perf_counter() - t0)
    getattr(m, f"{kind}_cpu").append(time.process_time() - c0)
    return out


def shardsafe_codec(pool: ThreadPoolExecutor, compression: codec.Compression, t: torch.Tensor,
                    repeat: int) -> Measured:
    """``codec.encode``/``decode`` of 16 MiB blocks on the pool."""
    raw, dtype = raw_bytes(t), dtype_name(t)
    m = Measured(len(raw))
    spans = _blocks(len(raw))
    out = bytearray(len(raw))
    view = memoryview(out)
    for _ in range(repeat + 1):  # round 0 warms up (thread-local contexts, page faults)
        enc = _timed(m, "compress", lambda: list(pool.map(
            lambda s: codec.encode(raw[s[0]:s[1]], dtype, compression), spans)))
        out[:] = bytes(len(out))
        _timed(m, "decompress", lambda: list(pool.map(
            lambda a: codec.decode(a[1][0], a[1][1], view[a[0][0]:a[0][1]]), zip(spans, enc))))
        _check(out, raw)
        m.stored = sum(len(s) for _, s in enc)
    return m


def zstd_raw(pool: ThreadPoolExecutor, t: torch.Tensor, repeat: int, level: int = 3) -> Measured:
    """The ``zstandard`` package at ``level`` on the raw bytes, same blocks, same pool."""
    import zstandard

    raw = raw_bytes(t)
    m = Measured(len(raw))
    spans = _blocks(len(raw))
    cctx = [zstandard.ZstdCompressor(level=level) for _ in spans]  # one context per call
    dctx = [zstandard.ZstdDecompressor() for _ in spans]
    for _ in range(repeat + 1):
        frames = _timed(m, "compress", lambda: list(pool.map(
            lambda i: cctx[i].compress(raw[spans[i][0]:spans[i][1]]), range(len(spans)))))
        parts = _timed(m, "decompress", lambda: list(pool.map(
            lambda i: dctx[i].decompress(frames[i]), range(len(spans)))))
        _check(b"".join(parts), raw)
        m.stored = sum(len(f) for f in frames)
    return m


def zipnn(t: torch.Tensor, repeat: int) -> Measured:
    """ZipNN on the whole tensor (its own chunks and ``THREADS`` threads)."""
    m = Measured(t.numel() * t.element_size())
    dtype = ZIPNN_DTYPES.get(dtype_name(t))
    try:
        from zipnn import ZipNN
    except ImportError:
        m.note = "zipnn is not installed (pip install 'shardsafe[bench]')"
        return m
    if dtype is None:
        m.note = f"ZipNN has no mode for {dtype_name(t)}"
        return m
    z = ZipNN(input_format="torch", bytearray_dtype=dtype, threads=THREADS)
    raw = raw_bytes(t)
    for _ in range(repeat + 1):
        work = t.clone()  # ZipNN reorders the bytes of its input in place
        blob = _timed(m, "compress", lambda: z.compress(work))
        back = _timed(m, "decompress", lambda: z.decompress(blob))
        _check(raw_bytes(back.reshape(-1)), raw)
        m.stored = len(blob)
    return m


def _drop_warmup(m: Measured) -> Measured:
    """Forgets round 0 (the warm-up) of every timing."""
    for attr in ("compress_s", "decompress_s", "compress_cpu", "decompress_cpu"):
        setattr(m, attr, getattr(m, attr)[1:])
    return m


def _check(got: Any, want: memoryview) -> None:
    if np.frombuffer(got, np.uint8).tobytes() != want.tobytes():
        raise AssertionError("a compression round trip did not return the same bytes")


SYSTEMS = ("shardsafe auto", "shardsafe zstd", "zstd-3 on raw bytes", "ZipNN")


def measure_all(nbytes: int, repeat: int,
                log: Callable[[str], None] | None = None) -> dict[str, dict[str, Measured]]:
    """tensor -> system -> Measured, every system on the same tensors."""
    out: dict[str, dict[str, Measured]] = {}
    with ThreadPoolExecutor(THREADS) as pool:
        for name, t in tensors(nbytes).items():
            row = {
                "shardsafe auto": _drop_warmup(shardsafe_codec(pool, "auto", t, repeat)),
                "shardsafe zstd": _drop_warmup(shardsafe_codec(pool, "zstd", t, repeat)),
                "zstd-3 on raw bytes": _drop_warmup(zstd_raw(pool, t, repeat)),
                "ZipNN": _drop_warmup(zipnn(t, repeat)),
            }
            out[name] = row
            if log:
                log(f"  compression {name}: " + ", ".join(
                    f"{s} {m.ratio or 0:.3f}x" for s, m in row.items()))
    return out


# --- report -------------------------------------------------------------------------

ADAMW = ("fp32 AdamW exp_avg", "fp32 AdamW exp_avg_sq")
FLOAT_TENSORS = ("bf16 weights N(0, 0.02)", "fp16 weights N(0, 0.02)", "fp32 weights N(0, 0.02)", *ADAMW)
ADAMW_BOTH = "fp32 AdamW state (both moments)"


def _combined(parts: list[Measured]) -> Measured:
    """Several tensors as one: summed bytes, summed times per round."""
    m = Measured(sum(p.raw for p in parts), note="; ".join(p.note for p in parts if p.note)[:200])
    if all(p.stored for p in parts):
        m.stored = sum(p.stored or 0 for p in parts)
    for attr in ("compress_s", "decompress_s", "compress_cpu", "decompress_cpu"):
        rounds = [getattr(p, attr) for p in parts]
        if all(rounds):
            setattr(m, attr, [sum(r) for r in zip(*rounds)])
    return m


def with_adamw_total(results: dict[str, dict[str, Measured]]) -> dict[str, dict[str, Measured]]:
    """``results`` plus a row for both AdamW moments together."""
    if not all(k in results for k in ADAMW):
        return results
    out = dict(results)
    out[ADAMW_BOTH] = {s: _combined([results[k][s] for k in ADAMW]) for s in results[ADAMW[0]]}
    return out


def _transform() -> str:
    from ..format import planes_kernel

    return planes_kernel.describe()


def table(results: dict[str, dict[str, Measured]], nbytes: int, repeat: int) -> str:
    """The case's markdown: one row per tensor and system."""
    from .report import _f

    rows = [f"### Case compression: codecs on the same tensors ({nbytes / MiB:.0f} MiB each)", "",
            f"Ratio = raw / stored bytes (every round trip checked bit for bit); GB/s of raw bytes, "
            f"medians of {repeat} round(s). shardsafe and zstd-3 code 16 MiB blocks on "
            f"{THREADS} threads; ZipNN runs with threads={THREADS} on the whole tensor. "
            "*per CPU-s*: raw bytes per second of this process's CPU time (all its threads), "
            "what one free core sustains, which a busy machine's waits do not change. "
            f"Planes transform of `auto`: {_transform()}.", "",
            "| tensor | system | ratio | compress GB/s | decompress GB/s | compress GB per CPU-s "
            "| decompress GB per CPU-s |",
            "|---|---|---:|---:|---:|---:|---:|"]
    for name, row in with_adamw_total(results).items():
        for system, m in row.items():
            if m.stored is None:
                rows.append(f"| {name} | {system} | {m.note or '–'} | – | – | – | – |")
                continue
            rows.append(f"| {name} | {system} | {_f(m.ratio, '{:.3f}x')} | "
                        f"{_f(m.gbs(m.compress_s), '{:.2f}')} | {_f(m.gbs(m.decompress_s), '{:.2f}')} | "
                        f"{_f(m.gbs(m.compress_cpu), '{:.2f}')} | {_f(m.gbs(m.decompress_cpu), '{:.2f}')} |")
    return "\n".join(rows)


def targets(results: dict[str, dict[str, Measured]]) -> list[Any]:
    """The compression targets (ratio and throughput goals), each checked against this run."""
    from .report import Target

    res = with_adamw_total(results)
    out: list[Target] = []

    def add(name: str, value: float | None, goal: str, ok: bool) -> None:
        out.append(Target(name, value, goal, None if value is None else ok))

    bf16 = res.get("bf16 weights N(0, 0.02)", {})
    auto, zipnn_m = bf16.get("shardsafe auto"), bf16.get("ZipNN")
    if auto and zipnn_m and auto.ratio and zipnn_m.ratio:
        r = auto.ratio / zipnn_m.ratio
        add("compression: bf16 weights, auto ratio / ZipNN ratio", r, ">= 1.00", r >= 1.0)
    adam = res.get(ADAMW_BOTH, {}).get("shardsafe auto")
    if adam:
        add("compression: fp32 AdamW state, auto ratio", adam.ratio, ">= 1.15", (adam.ratio or 0) >= 1.15)
    floats = [r["shardsafe auto"] for k, r in res.items() if k in FLOAT_TENSORS]
    if floats:
        whole = _combined(floats)
        c, d = whole.gbs(whole.compress_s), whole.gbs(whole.decompress_s)
        add(f"compression: auto compress GB/s, float tensors, {THREADS} threads", c, ">= 1.0",
            (c or 0) >= 1.0)
        add(f"compression: auto decompress GB/s, float tensors, {THREADS} threads", d, ">= 2.0",
            (d or 0) >= 2.0)
    return out


def section(nbytes: int, repeat: int,
            log: Callable[[str], None] | None = None) -> tuple[str, list[Any], dict[str, Any]]:
    """Runs the case: its markdown table, its targets and its raw samples."""
    results = measure_all(nbytes, repeat, log)
    raw = {t: {s: {"raw": m.raw, "stored": m.stored, "compress_s": m.compress_s,
                   "decompress_s": m.decompress_s, "compress_cpu": m.compress_cpu,
                   "decompress_cpu": m.decompress_cpu, "note": m.note} for s, m in row.items()}
           for t, row in results.items()}
    return table(results, nbytes, repeat), targets(results), raw
