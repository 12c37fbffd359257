"""Case ``load``, resharded restores: bytes read / bytes needed, in a child process.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m shardsafe.bench.load_reshard MIB

Prints one JSON line. Bytes read are the kernel's count of bytes read by system calls
(``rchar`` of ``/proc/self/io``) around each restore, the index included:

- FSDP-style 8 -> 6: float32 weights ``(rows, cols)`` split in 8 along rows (saved from an
  8-device mesh, ``P("x")``: one chunk per device, FSDP2's layout), restored as the row
  boxes of 6 ranks through the reader (``ChunkReader`` jobs; no DTensor, no process group);
- JAX 4x2 -> 8x1: the same weights saved from a 4x2 mesh (``P("dp", "tp")``), restored by
  ``shardsafe.load`` onto an 8x1 mesh (``P("dp", None)``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np

import shardsafe

MiB = 1 << 20
ROWS = 4800  # divisible by 8, 6 and 4


def rchar() -> int:
    """Bytes this process has read by system calls so far."""
    with open("/proc/self/io", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def main(mib: int) -> dict[str, float]:
    """Both restores of ``mib`` MiB per tensor (4 tensors); their bytes read and needed."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from ..engine.commit import read_index
    from ..engine.load.reader import ChunkReader, ReadJob
    from ..storage.local import LocalStorage

    devs = np.array(jax.devices()[:8])
    cols = max(8, (mib * MiB // 4 // ROWS) // 8 * 8)
    host = {f"w{i}": np.random.default_rng(i).standard_normal((ROWS, cols), dtype=np.float32) for i in range(4)}
    needed = sum(a.nbytes for a in host.values())
    out: dict[str, float] = {"mib": mib * 4}
    with tempfile.TemporaryDirectory() as d:
        fsdp = NamedSharding(Mesh(devs, ("x",)), P("x"))
        path = os.path.join(d, "fsdp")
        shardsafe.save({k: jax.device_put(jnp.asarray(v), fsdp) for k, v in host.items()}, path)
        storage = LocalStorage()
        before = rchar()
        index = read_index(storage, path)
        for r in range(6):
            lo, n = r * ROWS // 6, ROWS // 6
            jobs = []
            for entry in index.tensors:
                dest = np.empty(n * cols * 4, dtype=np.uint8)
                jobs.append(ReadJob(entry, dest, (lo, 0), (n, cols)))
            ChunkReader(storage, path, index).run(jobs)
            for j, k in zip(jobs, host):
                if not np.array_equal(j.dest.view(np.float32).reshape(n, cols), host[k][lo : lo + n]):
                    raise AssertionError(f"FSDP-style reshard: {k} rows {lo}+{n} differ")
        out.update(fsdp_read=rchar() - before, fsdp_needed=needed)
        mesh42 = Mesh(devs.reshape(4, 2), ("dp", "tp"))
        path = os.path.join(d, "jax")
        shardsafe.save({k: jax.device_put(jnp.asarray(v), NamedSharding(mesh42, P("dp", "tp")))
                        for k, v in host.items()}, path)
        to = NamedSharding(Mesh(devs.reshape(8, 1), ("dp", "tp")), P("dp", None))
        target = {k: jax.ShapeDtypeStruct(v.shape, jnp.float32, sharding=to) for k, v in host.items()}
        before = rchar()
        got = shardsafe.load(path, target)
        out.update(jax_read=rchar() - before, jax_needed=needed)
        for k, v in host.items():
            if not np.array_equal(np.asarray(got[k]), v):
                raise AssertionError(f"JAX 4x2 -> 8x1: {k} differs")
    out["fsdp_ratio"] = out["fsdp_read"] / out["fsdp_needed"]
    out["jax_ratio"] = out["jax_read"] / out["jax_needed"]
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 16)))
