"""shardsafe against Orbax on a multi-process ``jax.distributed`` job, in one run.

    python -m shardsafe.bench.jax --processes 2 [--mib 256] [--repeat 3] [--dir DIR]

``--processes N`` starts N processes on this machine that form one ``jax.distributed``
job (gloo CPU collectives, 8 / N emulated CPU devices each, 8 in all); its state is
``mib`` MiB of layers {kernel 2048 x 2048 float32 ``P("dp", "tp")``, bias 2048
``P("tp")``} on a 4x2 mesh over every device, so each array spans the processes. Every
process makes the same calls (as a real job does) and times them between barriers; a
sample is the slowest process's time (what the job waits for). Measured, medians of
``repeat`` runs taken in turn after one untimed warm-up of each system:

* blocking: how long ``async_save`` (``StandardCheckpointer.save``) holds the caller;
* durable: until ``result()`` (``wait_until_finished()``) returns;
* cold restore onto the saving shardings (the files evicted from the page cache first).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

DIM = 2048
METRICS = ("blocking", "durable", "restore_same")
TARGETS = {"blocking": 0.5, "durable": 0.5, "restore_same": 0.7}


def launch(processes: int, mib: int, repeat: int, directory: str) -> dict[str, dict[str, float]]:
    """Runs the job; every metric's median (seconds), by system.

    Raises:
        RuntimeError: a process of the job failed (its output is in the message).
    """
    from ..harness.processes import start_ranks, wait_ranks

    out = os.path.join(directory, "results")
    os.makedirs(out, exist_ok=True)
    logs = [open(os.path.join(directory, f"worker-{r}.log"), "w+") for r in range(processes)]
    try:
        procs = start_ranks(["-m", "shardsafe.bench.jax_multi", out, str(mib), str(repeat)], processes,
                            per_rank=lambda r: {"stdout": logs[r], "stderr": logs[r]})
        finished = wait_ranks(procs, 3600)
        if not finished or any(p.returncode != 0 for p in procs):
            text = []
            for r, log in enumerate(logs):
                log.seek(0)
                text.append(f"--- process {r} (exit {procs[r].returncode})\n{log.read()[-3000:]}")
            raise RuntimeError("the benchmark job failed:\n" + "\n".join(text))
    finally:
        for log in logs:
            log.close()
    per: list[dict[str, dict[str, list[float]]]] = []
    for r in range(processes):
        with open(os.path.join(out, f"r{r}.json")) as f:
            per.append(json.load(f))
    return {s: {m: statistics.median(max(p[s][m][i] for p in per) for i in range(len(per[0][s][m])))
                for m in per[0][s]} for s in per[0]}


def report(res: dict[str, dict[str, float]], mib: int, processes: int) -> str:
    """The results as a markdown table (seconds, shardsafe / Orbax, and the target)."""
    lines = [f"| {mib} MiB, {processes} processes x {8 // processes} devices | shardsafe (s) | Orbax (s) "
             f"| shardsafe / Orbax | target |", "|---|---|---|---|---|"]
    for m in METRICS:
        s, o = res["shardsafe"][m], res["orbax"][m]
        verdict = "met" if s / o <= TARGETS[m] else "missed"
        lines.append(f"| {m.replace('_', ' ')} | {s:.3f} | {o:.3f} | {s / o:.2f}x | <= {TARGETS[m]}x, {verdict} |")
    return "\n".join(lines)


def _state(mib: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The state (each process builds its own shards) and its restore targets."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((4, 2), ("dp", "tp"))
    ks, bs = NamedSharding(mesh, P("dp", "tp")), NamedSharding(mesh, P("tp"))
    layers = max(1, mib * (1 << 20) // (DIM * DIM * 4))
    params = {}
    for i in range(layers):
        rng = np.random.default_rng(i)
        k = rng.standard_normal((DIM, DIM), dtype=np.float32)
        b = rng.standard_normal(DIM, dtype=np.float32)
        params[f"layer_{i}"] = {"kernel": jax.make_array_from_callback(k.shape, ks, lambda ix, k=k: k[ix]),
                                "bias": jax.make_array_from_callback(b.shape, bs, lambda ix, b=b: b[ix])}
    state = {"params": params}
    target = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    return state, target


def worker(out: str, mib: int, repeat: int) -> None:
    """One process of the job (RANK, WORLD_SIZE, MASTER_PORT from the launcher)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={8 // world}"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{os.environ['MASTER_PORT']}",
                               num_processes=world, process_id=rank)
    import orbax.checkpoint as ocp

    import shardsafe
    from shardsafe.comm import get_comm

    from .measure import drop_cache, remove, settle

    comm = get_comm()
    state, target = _state(mib)
    orbax = ocp.StandardCheckpointer()
    base = os.path.dirname(out)
    ss, op = os.path.join(base, "shardsafe"), os.path.join(base, "orbax")
    samples: dict[str, dict[str, list[float]]] = {"shardsafe": {}, "orbax": {}}

    def fresh(path: str) -> None:
        if rank == 0:
            remove(path)
            settle()
        comm.barrier()

    def timed_save(save: Callable[[str], Callable[[], None]], path: str) -> tuple[float, float]:
        fresh(path)
        t = time.perf_counter()
        wait = save(path)
        blocked = time.perf_counter() - t
        wait()
        durable = time.perf_counter() - t
        comm.barrier()
        return blocked, durable

    def timed_restore(load: Callable[[], Any], path: str) -> float:
        drop_cache(path)
        comm.barrier()
        t = time.perf_counter()
        jax.block_until_ready(load())
        took = time.perf_counter() - t
        comm.barrier()
        return took

    def ss_save(p: str) -> Callable[[], None]:
        return shardsafe.async_save(state, p).result

    def orbax_save(p: str) -> Callable[[], None]:
        orbax.save(p, state)
        return orbax.wait_until_finished

    for save, p in ((ss_save, ss), (orbax_save, op)):  # warm-up: first calls, compilations
        timed_save(save, p)
    jax.block_until_ready((shardsafe.load(ss, target), orbax.restore(op, target)))
    comm.barrier()
    for _ in range(repeat):
        for system, save, p in (("shardsafe", ss_save, ss), ("orbax", orbax_save, op)):
            b, d = timed_save(save, p)
            samples[system].setdefault("blocking", []).append(b)
            samples[system].setdefault("durable", []).append(d)
        samples["shardsafe"].setdefault("restore_same", []).append(
            timed_restore(lambda: shardsafe.load(ss, target), ss))
        samples["orbax"].setdefault("restore_same", []).append(timed_restore(lambda: orbax.restore(op, target), op))
    orbax.close()
    with open(os.path.join(out, f"r{rank}.json"), "w") as f:
        json.dump(samples, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
