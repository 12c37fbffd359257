"""shardsafe against Orbax on one sharded JAX state, in one run.

    python -m shardsafe.bench.jax [--mib 512] [--repeat 3] [--dir DIR] [--processes N]

The state is a model's parameters as a JAX user holds them: ``layers`` x {kernel
(2048 x 2048 float32), bias (2048)} on a 4x2 mesh of emulated CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``), kernels ``P("dp", "tp")``,
biases ``P("tp")``. Measured, medians of ``repeat`` runs taken in turn:

* blocking: how long ``async_save`` (``StandardCheckpointer.save``) holds the caller;
* durable: until ``result()`` (``wait_until_finished()``) returns; shardsafe's includes
  the fsync of every file and the directory, Orbax's whatever its writer does;
* the same two through each library's ``CheckpointManager``;
* cold restore onto the saving sharding and onto another (an 8x1 mesh, kernels split by
  rows only), each after evicting the checkpoint's files from the page cache.

``--processes N`` runs the multi-process form instead: one ``jax.distributed`` job of N
processes (``bench.jax_multi``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardsafe  # noqa: E402

from .measure import drop_cache, remove, settle  # noqa: E402

DIM = 2048


def make_state(mib: int) -> dict[str, Any]:
    """``mib`` MiB of kernels (plus their biases) sharded over a 4x2 mesh."""
    mesh = jax.make_mesh((4, 2), ("dp", "tp"))
    rng = np.random.default_rng(0)
    layers = max(1, mib * (1 << 20) // (DIM * DIM * 4))
    ks, bs = NamedSharding(mesh, P("dp", "tp")), NamedSharding(mesh, P("tp"))
    return {"params": {f"layer_{i}": {
        "kernel": jax.device_put(rng.standard_normal((DIM, DIM), dtype=np.float32), ks),
        "bias": jax.device_put(rng.standard_normal(DIM, dtype=np.float32), bs)} for i in range(layers)}}


def abstract(state: dict[str, Any], other: bool) -> dict[str, Any]:
    """Restore targets: the saving shardings, or (``other``) an 8x1 mesh's."""
    mesh = jax.make_mesh((8, 1), ("dp", "tp"))

    def one(x: jax.Array) -> jax.ShapeDtypeStruct:
        sh = NamedSharding(mesh, P("dp", None) if x.ndim == 2 else P()) if other else x.sharding
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh)

    return jax.tree_util.tree_map(one, state)


def _ready(tree: Any) -> Any:
    return jax.block_until_ready(tree)


def _save_pair(save: Callable[[str], Callable[[], None]], path: str) -> tuple[float, float]:
    """``save(path)`` returns the wait for durability: (blocking, durable) seconds."""
    remove(path)
    settle()
    t = time.perf_counter()
    wait = save(path)
    blocked = time.perf_counter() - t
    wait()
    return blocked, time.perf_counter() - t


def _restore(load: Callable[[], Any], path: str) -> float:
    drop_cache(path)
    t = time.perf_counter()
    _ready(load())
    return time.perf_counter() - t


def run(mib: int, repeat: int, directory: str) -> dict[str, dict[str, float]]:
    """Every measurement's median, by system then metric."""
    import orbax.checkpoint as ocp

    state = make_state(mib)
    same, other = abstract(state, False), abstract(state, True)
    orbax = ocp.StandardCheckpointer()
    ss, op = os.path.join(directory, "shardsafe"), os.path.join(directory, "orbax")
    samples: dict[str, dict[str, list[float]]] = {"shardsafe": {}, "orbax": {}}

    def add(system: str, **metrics: float) -> None:
        for k, v in metrics.items():
            samples[system].setdefault(k, []).append(v)

    def ss_save(p: str) -> Callable[[], None]:
        return shardsafe.async_save(state, p).result

    def orbax_save(p: str) -> Callable[[], None]:
        orbax.save(p, state)
        return orbax.wait_until_finished

    for save, p in ((ss_save, ss), (orbax_save, op)):  # warm-up: first calls, compilations
        _save_pair(save, p)
    _ready((shardsafe.load(ss, same), orbax.restore(op, same)))
    for _ in range(repeat):
        b, d = _save_pair(ss_save, ss)
        add("shardsafe", blocking=b, durable=d)
        b, d = _save_pair(orbax_save, op)
        add("orbax", blocking=b, durable=d)
        add("shardsafe", restore_same=_restore(lambda: shardsafe.load(ss, same), ss),
            restore_other=_restore(lambda: shardsafe.load(ss, other), ss))
        add("orbax", restore_same=_restore(lambda: orbax.restore(op, same), op),
            restore_other=_restore(lambda: orbax.restore(op, other), op))
    _managers(state, directory, repeat, add)
    orbax.close()
    return {s: {k: statistics.median(v) for k, v in m.items()} for s, m in samples.items()}


def _managers(state: dict[str, Any], directory: str, repeat: int, add: Callable[..., None]) -> None:
    """Each library's CheckpointManager saving ``repeat`` steps (2 kept): blocking and durable."""
    import orbax.checkpoint as ocp

    sd, od = os.path.join(directory, "ss-mgr"), os.path.join(directory, "orbax-mgr")
    for d in (sd, od):
        remove(d)
    smgr = shardsafe.CheckpointManager(sd, max_to_keep=2)
    omgr = ocp.CheckpointManager(od, options=ocp.CheckpointManagerOptions(max_to_keep=2))
    for step in range(1, repeat + 1):
        settle()
        t = time.perf_counter()
        smgr.save(step, state)
        b = time.perf_counter() - t
        smgr.wait_until_finished()
        add("shardsafe", manager_blocking=b, manager_durable=time.perf_counter() - t)
        settle()
        t = time.perf_counter()
        omgr.save(step, args=ocp.args.StandardSave(state))
        b = time.perf_counter() - t
        omgr.wait_until_finished()
        add("orbax", manager_blocking=b, manager_durable=time.perf_counter() - t)
    smgr.close()
    omgr.close()


METRICS = ("blocking", "durable", "manager_blocking", "manager_durable", "restore_same", "restore_other")


def report(res: dict[str, dict[str, float]], mib: int) -> str:
    """The results as a markdown table (seconds, and shardsafe / Orbax)."""
    lines = [f"| {mib} MiB, 4x2 mesh | shardsafe (s) | Orbax (s) | shardsafe / Orbax |", "|---|---|---|---|"]
    for m in METRICS:
        s, o = res["shardsafe"].get(m), res["orbax"].get(m)
        if s is not None and o is not None:
            lines.append(f"| {m.replace('_', ' ')} | {s:.3f} | {o:.3f} | {s / o:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m shardsafe.bench.jax", description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=None, help="state size in MiB (default 512; 256 with --processes)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement (medians)")
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    ap.add_argument("--processes", type=int, default=1, choices=(1, 2, 4, 8),
                    help="processes of a jax.distributed job (default 1: one process, no job)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        if args.processes > 1:
            from . import jax_multi

            mib = args.mib or 256
            print(jax_multi.report(jax_multi.launch(args.processes, mib, args.repeat, d), mib, args.processes))
            return
        mib = args.mib or 512
        res = run(mib, args.repeat, d)
    print(report(res, mib))


if __name__ == "__main__":
    main()
