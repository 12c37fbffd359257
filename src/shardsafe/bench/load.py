"""Case ``load``: how fast, and how much, a load reads, against the machine and its peers.

On states built once per run, medians of ``repeat`` rounds after an unrecorded warm-up:

1. **in place, cold**: ``load(path, state)`` of ``size`` bytes of random fp32 after evicting
   the files from the page cache (``posix_fadvise(DONTNEED)``), against O_DIRECT reads of
   the same data files by 2, 4 and 8 threads (the best is the limit);
2. **new tensors**: ``load(path)`` against ``torch.load(weights_only=True)`` of the same
   state saved by ``torch.save``, cold and warm (the files read buffered just before: a
   load's cold reads use O_DIRECT and leave the page cache as it was);
3. **compressed**: ``load`` of ``shm_size`` bytes of bf16 weights saved with
   ``compression="auto"`` to /dev/shm, end to end, and the codec's decode alone
   (``bench.compression``); ``zstd`` against ``auto`` scaled by the bytes each stores;
4. **resharded**: bytes read / bytes needed (the kernel's count of bytes read by system
   calls, ``rchar`` of ``/proc/self/io``, around each restore) in a child process with 8
   emulated CPU devices: an FSDP-style 8 -> 6 reshard (a tensor split in 8 along dimension
   0 by an 8-device save, restored as 6 row boxes through the reader, without DTensor)
   and a JAX 4x2 -> 8x1 restore (``load`` onto an 8x1 mesh);
5. **manager local tier**: ``CheckpointManager`` saves and restores of ``small_count``
   tensors of 1-64 KiB through its local tier against ``async_save`` + ``load`` of the
   same state in the same memory-backed directory;
6. **DCP**: the in-place cold load against ``dcp.load`` of the same state (cold).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

import shardsafe

from .._numbers import ceil_div
from ..engine.buffers import HostBuffer
from ..format.datafile import ALIGN
from ..harness.processes import child_env
from .compression import weights
from .measure import Samples, drop_cache, settle, timed
from .report import Target, _f
from .states import large_tensors, nbytes, small_tensors, zeros_like

MiB = 1 << 20
THREADS = (2, 4, 8)
GOALS = {"odirect": 1.0, "new": 1.2, "compressed": 2.2, "reshard": 1.1, "tier": 1.0, "dcp": 1.5}


def _odirect(files: list[str], threads: int, buf: HostBuffer) -> None:
    """Reads ``files`` whole with O_DIRECT, 64 MiB requests spread over ``threads`` threads."""
    jobs, at = [], 0
    for f in files:
        n = os.path.getsize(f)
        jobs += [(f, o, min(64 * MiB, n - o), at + o) for o in range(0, n, 64 * MiB)]
        at += ceil_div(n, ALIGN) * ALIGN
    fds = {f: os.open(f, os.O_RDONLY | getattr(os, "O_DIRECT", 0)) for f in files}
    try:
        def one(j: tuple[str, int, int, int]) -> None:
            f, o, n, d = j
            os.preadv(fds[f], [buf.view(d, d + ceil_div(n, ALIGN) * ALIGN)], o)
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, jobs))
    finally:
        for fd in fds.values():
            os.close(fd)


def _data_files(path: str) -> list[str]:
    return sorted(os.path.join(path, f) for f in os.listdir(path) if f.startswith("data-"))


def _warm(files: list[str]) -> None:
    """Reads ``files`` buffered, so that they are in the page cache (a load reads cold
    ranges with O_DIRECT, which leaves them out of it)."""
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.read(16 * MiB):
                pass


def _cold(path: str, fn: Callable[[], object]) -> float:
    drop_cache(path)
    settle()
    return timed(fn)


def measure_local(directory: str, size: int, repeat: int, log: Callable[[str], None] | None) -> dict[str, float]:
    """Cases 1, 2 and 6 on ``size`` bytes of fp32 in ``directory`` (a disk, for O_DIRECT)."""
    state = large_tensors(size, min(size, 64 * MiB))
    total = nbytes(state)
    path, tpath = os.path.join(directory, "load-ss"), os.path.join(directory, "load-torch.pt")
    shardsafe.save(state, path)
    torch.save(state, tpath)
    files = _data_files(path)
    buf = HostBuffer(sum(ceil_div(os.path.getsize(f), ALIGN) * ALIGN for f in files))
    target = zeros_like(state)
    s = Samples()
    dcp_path = os.path.join(directory, "load-dcp")
    try:
        import torch.distributed.checkpoint as dcp

        dcp.save(state, checkpoint_id=dcp_path)
    except (ImportError, RuntimeError, ValueError) as e:
        dcp = None  # type: ignore[assignment]
        if log:
            log(f"  load: DCP unavailable ({e})")
    for r in range(repeat + 1):
        row: dict[str, float | None] = {"inplace_cold": _cold(path, lambda: shardsafe.load(path, target))}
        for t in THREADS:
            drop_cache(path)
            row[f"odirect_{t}"] = timed(lambda t=t: _odirect(files, t, buf))
        row["new_cold"] = _cold(path, lambda: shardsafe.load(path))
        row["torch_cold"] = _cold(tpath, lambda: torch.load(tpath, weights_only=True))
        _warm(files)
        row["new_warm"] = timed(lambda: shardsafe.load(path))
        row["torch_warm"] = timed(lambda: torch.load(tpath, weights_only=True))
        if dcp is not None:
            dt = zeros_like(state)
            row["dcp_cold"] = _cold(dcp_path, lambda: dcp.load(dt, checkpoint_id=dcp_path))
        if r:
            s.add(**row)
        if log:
            log(f"  load local round {r}: " + ", ".join(f"{k} {v:.3f}s" for k, v in row.items() if v))
    buf.close()
    for p in (path, dcp_path):
        shutil.rmtree(p, ignore_errors=True)
    os.remove(tpath)
    out = {k: s.median(k) for k in s.values}
    out["bytes"] = total
    return out  # type: ignore[return-value]


def measure_compressed(shm_size: int, repeat: int) -> dict[str, float]:
    """Case 3: ``auto`` and ``zstd`` loads from /dev/shm, and the codec's decode alone."""
    from .compression import shardsafe_codec

    state = {f"w{i}": weights(min(shm_size, 64 * MiB), torch.bfloat16, seed=i)
             for i in range(max(1, shm_size // (64 * MiB)))}
    total = nbytes(state)
    base = tempfile.mkdtemp(prefix="shardsafe-load-", dir="/dev/shm")
    out: dict[str, float] = {"bytes": total}
    try:
        for comp in ("auto", "zstd"):
            path = os.path.join(base, comp)
            shardsafe.save(state, path, compression=comp)  # type: ignore[arg-type]
            out[f"{comp}_stored"] = sum(os.path.getsize(f) for f in _data_files(path))
            times = [timed(lambda: shardsafe.load(path)) for _ in range(repeat + 1)][1:]
            out[f"{comp}_load_s"] = statistics.median(times)
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            dec = [shardsafe_codec(pool, "auto", t, repeat) for t in state.values()]
        out["decode_s"] = sum(statistics.median(m.decompress_s[1:] or m.decompress_s) for m in dec)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


def measure_tier(count: int, repeat: int) -> dict[str, float]:
    """Case 5: the manager's local tier against plain ``async_save``/``load``, in /dev/shm."""
    state = small_tensors(count)
    target = zeros_like(state)
    base = tempfile.mkdtemp(prefix="shardsafe-tier-", dir="/dev/shm")
    s = Samples()
    try:
        with shardsafe.CheckpointManager(os.path.join(base, "p"), local_directory=os.path.join(base, "l"),
                                         save_interval_steps=None, local_save_interval_steps=1) as mgr:
            for r in range(repeat + 1):
                def msave() -> None:
                    mgr.save(r + 1, state)
                    mgr.wait_until_finished()
                row = {"mgr_save": timed(msave), "mgr_restore": timed(lambda: mgr.restore(target))}
                path = os.path.join(base, f"plain-{r}")
                row["plain_save"] = timed(lambda: shardsafe.async_save(state, path).result())
                row["plain_load"] = timed(lambda: shardsafe.load(path, target))
                if r:
                    s.add(**row)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {k: s.median(k) for k in s.values}  # type: ignore[misc]


def measure_reshard(mib: int) -> dict[str, float]:
    """Case 4 in a child process with 8 emulated devices (``_reshard_child``)."""
    env = child_env(XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-m", "shardsafe.bench.load_reshard", str(mib)], env=env,
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}  # type: ignore[dict-item]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def report(local: dict[str, Any], comp: dict[str, Any], reshard: dict[str, Any],
           tier: dict[str, Any]) -> tuple[str, list[Target]]:
    """The section's table and its targets (ratios > 1: shardsafe faster / reads less)."""
    best = min((local[f"odirect_{t}"] for t in THREADS if local.get(f"odirect_{t}")), default=None)
    gb = local["bytes"] / 1e9
    auto_gbs = comp["bytes"] / comp["auto_load_s"] / 1e9 if comp.get("auto_load_s") else None
    zstd_adj = (comp["zstd_load_s"] / (comp["auto_load_s"] * comp["zstd_stored"] / comp["auto_stored"])
                if comp.get("zstd_load_s") else None)
    rows = [
        ("in-place cold load vs best O_DIRECT read (2-8 threads), speed ratio", _ratio(best, local["inplace_cold"]),
         GOALS["odirect"], True),
        ("new tensors cold vs torch.load(weights_only=True) cold", _ratio(local["torch_cold"], local["new_cold"]),
         GOALS["new"], True),
        ("new tensors warm vs torch.load(weights_only=True) warm", _ratio(local["torch_warm"], local["new_warm"]),
         GOALS["new"], True),
        ("compression=auto load from /dev/shm, GB/s", auto_gbs, GOALS["compressed"], True),
        ("zstd load time / auto's x stored-bytes ratio", zstd_adj, 1.0, False),
        ("FSDP-style 8 -> 6 reshard: bytes read / needed", reshard.get("fsdp_ratio"), GOALS["reshard"], False),
        ("JAX 4x2 -> 8x1: bytes read / needed", reshard.get("jax_ratio"), GOALS["reshard"], False),
        ("manager local-tier save vs async_save (speed ratio)", _ratio(tier.get("plain_save"), tier.get("mgr_save")),
         GOALS["tier"], True),
        ("manager local-tier restore vs load (speed ratio)", _ratio(tier.get("plain_load"), tier.get("mgr_restore")),
         GOALS["tier"], True),
        ("in-place cold load vs dcp.load cold (speed ratio)", _ratio(local.get("dcp_cold"), local["inplace_cold"]),
         GOALS["dcp"], True),
    ]
    targets = [Target(f"(load) {name}", v, f"{'>=' if up else '<='} {goal}",
                      None if v is None else (v >= goal if up else v <= goal)) for name, v, goal, up in rows]
    out = ["### Case load: what a load reads and how fast", "",
           f"{local['bytes'] / MiB:.0f} MiB of random fp32 (cases 1, 2, 6), {comp['bytes'] / MiB:.0f} MiB of bf16 "
           f"(case 3), {tier.get('count', '')} small tensors (case 5); seconds are medians.", "",
           "| operation | s | GB/s |", "|---|---:|---:|"]
    for k in ("inplace_cold", *(f"odirect_{t}" for t in THREADS), "new_cold", "torch_cold", "new_warm",
              "torch_warm", "dcp_cold"):
        v = local.get(k)
        out.append(f"| {k} | {_f(v)} | {_f(gb / v if v else None, '{:.2f}')} |")
    out.append(f"| compressed auto load (stored {comp['auto_stored'] / MiB:.0f} MiB) | {_f(comp['auto_load_s'])} | "
               f"{_f(auto_gbs, '{:.2f}')} |")
    out.append(f"| compressed zstd load (stored {comp['zstd_stored'] / MiB:.0f} MiB) | {_f(comp['zstd_load_s'])} | "
               f"{_f(comp['bytes'] / comp['zstd_load_s'] / 1e9, '{:.2f}')} |")
    out.append(f"| auto codec decode alone | {_f(comp['decode_s'])} | {_f(comp['bytes'] / comp['decode_s'] / 1e9, '{:.2f}')} |")
    for k in ("mgr_save", "plain_save", "mgr_restore", "plain_load"):
        out.append(f"| tier {k} | {_f(tier.get(k))} | |")
    if "error" in reshard:
        out += ["", f"Resharded restores not measured: {reshard['error']}"]
    else:
        out += ["", f"Resharded ({reshard['mib']} MiB; bytes read counted by the kernel, rchar): FSDP-style 8 -> 6 "
                f"read {reshard['fsdp_read'] / MiB:.1f} MiB for {reshard['fsdp_needed'] / MiB:.1f} MiB, JAX 4x2 -> 8x1 "
                f"read {reshard['jax_read'] / MiB:.1f} MiB for {reshard['jax_needed'] / MiB:.1f} MiB."]
    out += ["", "| target | measured | goal | met |", "|---|---:|---:|:---:|"]
    for t in targets:
        out.append(f"| {t.name} | {_f(t.value, '{:.2f}')} | {t.goal} | "
                   f"{'–' if t.ok is None else ('yes' if t.ok else '**no**')} |")
    return "\n".join(out), targets


def section(directory: str, size: int, shm_size: int, small_count: int, repeat: int,
            log: Callable[[str], None] | None = None) -> tuple[str, list[Target], dict[str, Any]]:
    """Runs the case: its markdown, its targets and its raw figures."""
    local = measure_local(directory, size, repeat, log)
    comp = measure_compressed(shm_size, repeat)
    reshard = measure_reshard(max(1, size // MiB // 4))
    tier = {**measure_tier(small_count, repeat), "count": small_count}
    text, targets = report(local, comp, reshard, tier)
    return text, targets, {"local": local, "compressed": comp, "reshard": reshard, "tier": tier,
                           "at": time.time()}
