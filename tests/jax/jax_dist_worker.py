"""One process of a real multi-process ``jax.distributed`` job on this CPU (gloo collectives,
emulated devices), started by ``test_jax_distributed``: it runs the scenarios named on its
command line in order and writes what it saw to ``<out>/<scenario>-r<process>.json``.

    jax_dist_worker.py OUT DEVICES SCENARIO[,SCENARIO...]

The process index, process count and coordinator port come from the launcher's RANK,
WORLD_SIZE and MASTER_PORT. Every process checks what it restored against the expected
values itself (bit-exact, shard by shard) and exits non-zero on any difference.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback

OUT, DEVICES, SCENARIOS = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
RANK, WORLD, PORT = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), os.environ["MASTER_PORT"]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{PORT}", num_processes=WORLD, process_id=RANK,
                           initialization_timeout=60)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from jax_dist_state import SPECS, expected, state_on  # noqa: E402

import shardsafe  # noqa: E402
from shardsafe.comm import get_comm  # noqa: E402

CKPT = os.path.join(OUT, "ckpt")


def mesh() -> jax.sharding.Mesh:
    """All devices of the job as ``("dp", "tp")``: 4 x (devices / 4), or 2 x 1 for 2 devices."""
    n = len(jax.devices())
    return jax.make_mesh((4, n // 4) if n >= 4 else (n, 1), ("dp", "tp"))


def abstract(specs: dict[str, P]) -> dict[str, object]:
    """``ShapeDtypeStruct`` targets of the state on this job's mesh with ``specs``."""
    m, want = mesh(), expected(0)
    return {"params": {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(m, specs[k]))
                       for k, v in want["params"].items()}, "step": 0}


def check(tree: dict, seed: int, specs: dict[str, P] | None = None) -> int:
    """Asserts every addressable shard of ``tree`` equals the expected values; returns the
    number of shards compared."""
    want, n = expected(seed), 0
    assert tree["step"] == want["step"], (tree["step"], want["step"])
    for k, w in want["params"].items():
        got = tree["params"][k]
        assert isinstance(got, jax.Array) and got.shape == w.shape and got.dtype == w.dtype, (k, got)
        if specs is not None:
            assert got.sharding.spec == specs[k], (k, got.sharding.spec, specs[k])
        for s in got.addressable_shards:
            assert np.asarray(s.data).tobytes() == w[s.index].tobytes(), (k, s.index)
            n += 1
    return n


def files(path: str) -> list[str]:
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def _data_files() -> set[str]:
    return {os.path.join(d, n) for d, _, names in os.walk(OUT) for n in names if n.startswith("data-r00001")}


def kill_when_writing(before: set[str]) -> None:
    """SIGKILLs this process as soon as a new data file of it exists (the save in progress)."""
    while not _data_files() - before:
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGKILL)


def run(name: str) -> dict:
    """Runs scenario ``name``; returns what the test checks."""
    comm = get_comm()
    if name == "comm":
        gathered = comm.gather({"rank": comm.rank}, 0)
        big = comm.broadcast_bytes(bytes(range(256)) * 10_000 if comm.rank == 0 else None, 0)
        comm.barrier()
        ch = comm.channel("channel-test")
        late = ch.wait([f"never/{comm.rank}"], 0.2)  # nobody sets it: the wait gives up
        ch.set(f"long/{comm.rank}", bytes(range(256)) * 12_000)  # 3 MB: in pieces
        comm.barrier()
        other = ch.fetch([f"long/{1 - comm.rank}"])[0] if ch.wait([f"long/{1 - comm.rank}"], 30)[0] else b""
        comm.barrier()
        ch.delete(f"long/{comm.rank}")
        comm.barrier()
        gone = ch.wait([f"long/{1 - comm.rank}"], 0.2)
        return {"late": late, "long_ok": other == bytes(range(256)) * 12_000, "gone": gone,
                "type": type(comm).__name__, "rank": comm.rank, "world": comm.world_size,
                "gathered": gathered, "big": len(big), "big_ok": big == bytes(range(256)) * 10_000,
                "max": comm.allreduce_max([comm.rank, 10 - comm.rank])}
    if name == "save":
        state = state_on(mesh(), 0)
        assert not state["params"]["w"].is_fully_addressable
        shardsafe.save(state, CKPT, timeout=60)
        return {"files": files(CKPT)}
    if name == "restore":
        from shardsafe.engine.load.index_exchange import STATS

        out = shardsafe.load(CKPT, abstract(SPECS[0]), timeout=60)
        # the index head comes from storage on every process, never through the key-value store
        return {"shards": check(out, 0, SPECS[0]), "index_read": STATS.read, "index_received": STATS.received}
    if name == "reshard":
        other = SPECS[1] if len(jax.devices()) >= 4 else SPECS[2]
        out = shardsafe.load(CKPT, abstract(other), timeout=60)
        return {"shards": check(out, 0, other)}
    if name == "async":
        h = shardsafe.async_save(state_on(mesh(), 1), CKPT + "-async", timeout=60)
        h.result(60)
        return {"shards": check(shardsafe.load(CKPT + "-async", abstract(SPECS[1]), timeout=60), 1)}
    if name == "manager":
        mgr = shardsafe.CheckpointManager(os.path.join(OUT, "mgr"), max_to_keep=2, timeout=60)
        for step in range(1, 4):
            mgr.save(step, state_on(mesh(), step))
        mgr.wait_until_finished()
        steps = mgr.all_steps()
        target = abstract(SPECS[1])
        restored = mgr.restore(target)
        mgr.close()
        return {"steps": steps, "restored": restored, "shards": check(target, 3)}
    if name == "local":
        # the local tier holds a process's own state alone: refused in a jax.distributed job
        try:
            shardsafe.CheckpointManager(os.path.join(OUT, "mgr-local"), local_directory=os.path.join(OUT, "local"))
        except ValueError as e:
            return {"error": str(e)}
        return {"error": None}
    if name == "preempt":
        # a preemption signal reaches process 1 only, at step 4: every process saves the
        # same step and stops there
        mgr = shardsafe.CheckpointManager(os.path.join(OUT, "preempt"), save_interval_steps=100,
                                          preemption_signals=[signal.SIGUSR1], timeout=60)
        stopped = None
        for step in range(1, 20):
            if step == 4 and RANK == 1:
                os.kill(os.getpid(), signal.SIGUSR1)
            mgr.save(step, state_on(mesh(), step))
            if mgr.reached_preemption(step):
                stopped = step
                break
        mgr.wait_until_finished()
        steps = mgr.all_steps()
        mgr.close()
        target = abstract(SPECS[1])
        restored = shardsafe.CheckpointManager(os.path.join(OUT, "preempt"), timeout=60).restore(target)
        return {"stopped": stopped, "steps": steps, "restored": restored, "shards": check(target, restored)}
    if name == "absent":
        # process 1 crashed before the save: it never calls it
        comm.barrier()  # the others start the save together
        if RANK != 1:
            t0 = time.monotonic()
            try:
                shardsafe.save(state_on(mesh(), 5), CKPT, overwrite=True, timeout=3)
                error = None
            except shardsafe.CheckpointError as e:
                error = f"{type(e).__name__}: {e}"
            took = time.monotonic() - t0
            out = shardsafe.load(CKPT, None, collective=False)  # the previous checkpoint
            return {"error": error, "took": took, "step": out["step"], "files": files(OUT)}
        return {}
    if name == "kill":
        # process 1 dies in the middle of the save: once its data file has begun
        state = state_on(mesh(), 6, big=True)
        if RANK == 1:
            threading.Thread(target=kill_when_writing, args=(_data_files(),), daemon=True).start()
        t0 = time.monotonic()
        try:
            shardsafe.save(state, CKPT, overwrite=True, timeout=5)
            error = None
        except shardsafe.CheckpointError as e:
            error = f"{type(e).__name__}: {e}"
        took = time.monotonic() - t0
        out = shardsafe.load(CKPT, None, collective=False)
        return {"error": error, "took": took, "step": out["step"]}
    raise ValueError(name)


def finish() -> None:
    """Leaves the job together (process 0, which hosts the service, leaves last)."""
    jax.distributed.shutdown()


def main() -> None:
    code = 0
    try:
        for name in SCENARIOS:
            result = run(name)
            with open(os.path.join(OUT, f"{name}-r{RANK}.json"), "w") as f:
                json.dump(result, f)
            if name == "kill":  # process 1 is gone: nobody to wait for
                break
            if name == "absent":  # the job's collectives are out of step now
                finish()
                break
        else:
            finish()
    except BaseException:  # noqa: BLE001 - any failure of this process fails the test with its trace
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
