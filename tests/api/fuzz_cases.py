"""Child process of test_fuzz_checkpoints: seeded random damage to real checkpoints.

Usage: ``python fuzz_cases.py ROOT SEED CASES VERSION``. For version 4 the state also
holds two JAX arrays saved from a 4 x 2 mesh of emulated devices (a general 2-D grid and a
row split), so the index has general boxes, split rules, parts and one-chunk tensors, and
structure-aware forgeries (header, directory, parts, ``whole_files``, layout rules, boxes)
join the damage; the readers add a JAX restore onto other shardings and ``cp``, and every
successful load must hand back exactly what a whole read gives (when the whole read and
``verify`` accept the checkpoint) or else the healthy state. Each case copies a healthy
checkpoint, damages it one way (byte flips in data or index, truncation, extension,
symlinks to an outside file or /dev/zero, a FIFO, a directory, a forged table with a
re-sealed checksum, a forged DCP record and values holding pickles), then runs load,
load(mmap=True), an in-place load, ``verify``, ``dcp.load`` through
``shardsafe.dcp.Reader``, ``CheckpointManager.restore`` (whose newest step is the damaged
one) and the CLI's ls, info, diff and export on it. Only CheckpointError may come out
(restore must fall back to the healthy step; DCP reports a reader's error inside its
CheckpointException), each case within CASE_SECONDS, and no pickle from the checkpoint
may run (a sentinel file would appear). Prints one line per violation; exits 1 if there
was any.
The parent runs this under RLIMIT_AS, which proves the memory bound.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import signal
import sys
import traceback

if __name__ == "__main__" and sys.argv[4:5] == ["4"]:  # JAX reads XLA_FLAGS once, when it starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import shardsafe
from shardsafe.cli import build_parser
from shardsafe.dcp import Reader
from shardsafe.format.checksum import crc32c
from shardsafe.format.index.versions import decode_index, encode_index
from shardsafe.manager import CheckpointManager

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(TESTS, "format"), os.path.join(TESTS, "dcp"), TESTS]
from forge_dcp import bytes_node, payload, random_record, rewrite  # noqa: E402
from helpers import flip_byte  # noqa: E402
from v2_forge import seal_v2, split_v2  # noqa: E402
from v3_forge import seal_v3, split_v3  # noqa: E402
from v4_forge import HEADER as V4_HEADER, seal_v4, split_v4  # noqa: E402

CASE_SECONDS = 20
INDEX = "index.json"
HUGE = [0, 1, 7, 4095, 4096, 2**31, 2**40, 2**62, 2**63 - 1]


def state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(64, 300, generator=g), "b": torch.arange(77, dtype=torch.int16),
            "h": torch.ones(5, dtype=torch.bfloat16), "e": torch.zeros(0), "step": 3,
            "opt": {"lr": 0.1, "m": [torch.full((3,), 2.0), torch.zeros(2, 2, dtype=torch.float64)]}}


def _jax():  # noqa: ANN202
    """JAX and the 4 x 2 mesh of the version 4 state, or None where JAX is not installed."""
    try:
        import jax
        from jax.sharding import NamedSharding, PartitionSpec
    except ImportError:
        return None
    return jax, jax.make_mesh((4, 2), ("dp", "tp")), NamedSharding, PartitionSpec


def base_state(version: int) -> dict:
    """``state()``, and for version 4 two JAX arrays: a 2-D grid (general chunks) and a row
    split over the mesh."""
    out = state()
    j = _jax() if version == 4 else None
    if j is not None:
        jax, mesh, sharding, spec = j
        out["grid"] = jax.device_put(np.arange(64, dtype=np.float32).reshape(8, 8), sharding(mesh, spec("dp", "tp")))
        out["rows"] = jax.device_put(np.arange(48, dtype=np.int32).reshape(16, 3), sharding(mesh, spec("dp", None)))
    return out


def jax_targets() -> dict:
    """Targets for the JAX arrays on other shardings: each box spans parts of saved chunks."""
    jax, mesh, sharding, spec = _jax()
    return {"grid": jax.ShapeDtypeStruct((8, 8), np.float32, sharding=sharding(mesh, spec("tp", "dp"))),
            "rows": jax.ShapeDtypeStruct((16, 3), np.int32, sharding=sharding(mesh, spec("tp", None)))}


def values(tree: object, path: str = "") -> dict:
    """Every leaf of a loaded state by key path: arrays as (dtype, shape, bytes)."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in values(sub, f"{path}.{key}").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, sub in enumerate(tree) for k, v in values(sub, f"{path}.{i}").items()}
    if isinstance(tree, torch.Tensor):
        t = tree.detach().contiguous()
        return {path: (str(t.dtype), tuple(t.shape), t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")}
    if hasattr(tree, "__array__") and not isinstance(tree, (int, float)):
        a = np.asarray(tree)
        return {path: (str(a.dtype), a.shape, a.tobytes())}
    return {path: tree}


def differs(got: object, want: dict) -> str | None:
    """The first key path whose loaded value differs from ``want`` (a ``values`` dict)."""
    for k, v in values(got).items():
        if k not in want or want[k] != v:
            return k
    return None


def data_files(ckpt: str) -> list[str]:
    return sorted(n for n in os.listdir(ckpt) if n.endswith(".safetensors"))


def reseal_v1(raw: dict) -> bytes:
    raw.pop("index_checksum", None)
    prefix = json.dumps(raw, separators=(",", ":"))[:-1].encode()
    return prefix + b',"index_checksum":"crc32c:%08x"}\n' % crc32c(prefix)


def _forge_v1(raw: dict, rng: random.Random) -> bytes:
    """One numeric field of the index set to an odd value; the checksum made right again."""
    fields: list[tuple[list | dict, object]] = [(raw, "block_size")]
    for f in raw["files"]:
        fields += [(f, "size"), (f, "data_start")]
    for t in raw["tensors"]:
        fields += [(t["shape"], i) for i in range(len(t["shape"]))]
        for c in t["chunks"]:
            fields += [(c, "offset"), (c, "nbytes")]
            fields += [(c["shape"], i) for i in range(len(c["shape"]))]
            fields += [(c["offsets"], i) for i in range(len(c["offsets"]))]
    holder, key = rng.choice(fields)
    old = holder[key]  # type: ignore[index]
    holder[key] = rng.choice(HUGE + [old + 1, old - 1, old * 2, -1])  # type: ignore[index]
    return reseal_v1(raw)


def _forge_columns(data: bytes, rng: random.Random, split, seal) -> bytes:  # noqa: ANN001
    """One value of one column (v2 or v3) set to an odd value; the checksum made right again."""
    js, cols = split(data)
    name = rng.choice([n for n in cols if len(cols[n])])
    col = cols[name].copy()
    i = rng.randrange(len(col))
    top = 2**32 - 1 if name.endswith("crc32c") else 2**62
    col[i] = min(rng.choice(HUGE + [int(col[i]) + 1, max(int(col[i]) - 1, 0)]), top)
    cols[name] = col
    return seal(js, cols)


def _forge_v4(data: bytes, rng: random.Random) -> bytes:
    """One value of one column of the global part or of a part set to an odd value, every
    CRC32C made right again."""
    forged = split_v4(data)
    sections = [c for c in [forged.cols, *(cols for _, cols in forged.parts)] if any(len(v) for v in c.values())]
    cols = rng.choice(sections)
    name = rng.choice([n for n in cols if len(cols[n])])
    col = cols[name].copy()
    i = rng.randrange(len(col))
    top = 2**32 - 1 if name.endswith("crc32c") else 2**62
    col[i] = min(rng.choice(HUGE + [int(col[i]) + 1, max(int(col[i]) - 1, 0)]), top)
    cols[name] = col
    return seal_v4(forged)


def _reheader(data: bytes, field: int, value: int) -> bytes:
    """``data`` with header field ``field`` (of v4_forge.HEADER) set to ``value``, the header's
    CRC32C made right again."""
    fields = list(V4_HEADER.unpack_from(data))
    fields[field] = value % (1 << (64 if 3 <= field <= 6 else 32))  # S, G, R, P are u64
    head = V4_HEADER.pack(*fields)[:60]
    return head + crc32c(head).to_bytes(4, "little") + data[64:]


def _forge_v4_structure(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One structure-aware forgery of a v4 index, every checksum right; its description."""
    kind = rng.choice(["column", "box-copy", "box-shift", "rule", "whole-files", "part-json", "header",
                       "directory", "chunks"])
    if kind == "header":
        field = rng.choice([3, 4, 5, 6, 7, 9])  # S, G, R, P, codec, reserved
        old = V4_HEADER.unpack_from(data)[field]
        return _reheader(data, field, rng.choice(HUGE + [old + 1, max(old - 1, 0), old * 2, 2**30])), kind
    if kind == "directory":
        g, p = V4_HEADER.unpack_from(data)[4], V4_HEADER.unpack_from(data)[6]
        at = 64 + g + (-g % 8) + 16 * rng.randrange(max(p, 1)) + rng.choice([0, 8, 12])
        out = bytearray(data)
        out[at : at + 4] = rng.choice(HUGE + [0, 1]).to_bytes(8, "little")[:4]
        return bytes(out), kind
    f = split_v4(data)
    if kind == "column":
        return _forge_v4(data, rng), kind
    cols = f.cols
    if kind in ("box-copy", "box-shift") and len(cols["pos"]) >= 4:
        pos, ext = cols["pos"].copy(), cols["extent"].copy()
        n = len(pos) // 2  # the general chunks of the state are 2-D
        i, j = rng.randrange(n), rng.randrange(n)
        if kind == "box-copy":  # equal volumes: one box twice, another region never
            pos[2 * j : 2 * j + 2], ext[2 * j : 2 * j + 2] = pos[2 * i : 2 * i + 2], ext[2 * i : 2 * i + 2]
        else:
            d = 2 * i + rng.randrange(2)
            pos[d] = max(0, int(pos[d]) + rng.choice([-1, 1, 2]))
        cols["pos"], cols["extent"] = pos, ext
    elif kind == "rule" and len(cols["split_step"]):
        name = rng.choice(["split", "split_step", "split_file0", "split_stride"])
        col = cols[name].copy()
        i = rng.randrange(len(col))
        col[i] = rng.choice([0, 1, 2, int(col[i]) + 1, max(int(col[i]) - 1, 0), 2**31])
        cols[name] = col
    elif kind == "chunks":
        col = cols["chunks"].copy()
        i = rng.randrange(len(col))
        col[i] = rng.choice([0, 1, 2, int(col[i]) + 1, max(int(col[i]) - 1, 0), 2**40])
        cols["chunks"] = col
    elif kind == "whole-files":
        wf = [list(e) for e in f.js["whole_files"]]
        how = rng.choice(["drop", "duplicate", "size", "name", "id"])
        if wf and how == "drop":
            wf.pop(rng.randrange(len(wf)))
        elif wf and how == "duplicate":
            wf.append(wf[-1])
        elif wf:
            e = dict(wf[0][1])
            if how == "size":
                e["size"] += rng.choice([-1, 1, 4096])
            elif how == "name":
                e["name"] = rng.choice(["index.json", "../x.safetensors", "other.safetensors"])
            else:
                wf[0][0] = rng.choice([-1, 1, 2**31])
            wf[0] = [wf[0][0], e]
        f.js["whole_files"] = wf
    elif kind == "part-json" and f.parts:
        js = f.parts[rng.randrange(len(f.parts))][0]
        if rng.random() < 0.3:
            js["part"] = rng.choice([1, -1, True, "0"])
        elif js["files"]:
            e = js["files"][0]
            key = rng.choice(["size", "data_start", "rank", "name"])
            e[key] = rng.choice(["x", "index.json", 2**62, 0, 7]) if key == "name" else rng.choice(
                [0, 7, int(e[key]) + 1, max(int(e[key]) - 1, 0), 2**62])
    return seal_v4(f), kind


def _replace(path: str, how: str, outside: str) -> None:
    os.remove(path)
    if how == "symlink-outside":
        os.symlink(outside, path)
    elif how == "symlink-zero":
        os.symlink("/dev/zero", path)
    elif how == "fifo":
        os.mkfifo(path)
    else:
        os.mkdir(path)


def damage(ckpt: str, rng: random.Random, version: int, outside: str) -> str:
    """Damages ``ckpt`` one random way; returns a description."""
    kind = rng.choice(["flip-data", "flip-data", "flip-index", "truncate-data", "extend-data",
                       "truncate-index", "replace-data", "replace-index", "forge", "forge", "forge-dcp"]
                      + ["forge"] * (4 if version == 4 else 0))
    target = os.path.join(ckpt, INDEX if kind.endswith("index") else rng.choice(data_files(ckpt)))
    if kind == "forge-dcp":
        sentinel = os.path.join(os.path.dirname(ckpt), "SENTINEL")
        leaves = {"step": bytes_node(payload(sentinel))} if rng.random() < 0.7 else {}
        record = random_record(rng, sentinel, ["w", "step", "opt.lr", "opt"])
        rewrite(ckpt, metadata={"dcp": record}, leaves=leaves)
        return f"forged DCP record {str(record)[:60]!r}, pickles at {sorted(leaves)}"
    if kind.startswith("replace"):
        how = rng.choice(["symlink-outside", "symlink-zero", "fifo", "directory"])
        _replace(target, how, outside)
        return f"{kind} {os.path.basename(target)} by {how}"
    with open(os.path.join(ckpt, INDEX), "rb") as f:
        index_bytes = f.read()
    if kind == "forge":
        if version == 1:
            out = _forge_v1(json.loads(index_bytes), rng)
        elif version == 2:
            out = _forge_columns(index_bytes, rng, split_v2, seal_v2)
        elif version == 3:
            out = _forge_columns(index_bytes, rng, split_v3, seal_v3)
        else:
            out, what = _forge_v4_structure(index_bytes, rng)
            with open(os.path.join(ckpt, INDEX), "wb") as f:
                f.write(out)
            return f"forged v4 {what}"
        with open(os.path.join(ckpt, INDEX), "wb") as f:
            f.write(out)
        return "forged table"
    size = os.path.getsize(target)
    if kind.startswith("flip"):
        pos = rng.randrange(size)
        flip_byte(target, pos, 1 << rng.randrange(8))
        return f"{kind} at {pos}"
    if kind.startswith("truncate"):
        n = rng.randrange(size)
        os.truncate(target, n)
        return f"{kind} to {n}"
    with open(target, "ab") as f:
        f.write(rng.randbytes(rng.choice([1, 8, 4096, 100_000])))
    return kind


def _verify(path: str) -> None:
    args = build_parser().parse_args(["verify", path])
    with contextlib.redirect_stdout(io.StringIO()):
        code = args.func(args)
    if code == 0 and os.environ.get("FUZZ_SHOW_OK"):
        print("verify OK:", path, file=sys.stderr)


def _cli(*argv: str) -> None:
    """A CLI command's function (not ``main``, which would turn any error into an exit code)."""
    args = build_parser().parse_args(list(argv))
    with contextlib.redirect_stdout(io.StringIO()):
        args.func(args)


def operations(ckpt: str, mgr: str, version: int, want: dict) -> dict:
    """Every reader; a load that succeeds must give ``want``'s values."""
    jax_state = version == 4 and _jax() is not None

    def checked(got: object, what: str) -> None:
        wrong = differs(got, want)
        if wrong is not None:
            raise AssertionError(f"{what} succeeded with a value at {wrong!r} that a whole read does not give")

    def in_place() -> None:
        target = state()
        if jax_state:
            target.update(jax_targets())
        got = shardsafe.load(ckpt, target)
        checked(got if jax_state else target, "load in place")

    def jax_restore() -> None:
        checked(shardsafe.load(ckpt, jax_targets(), strict=False), "JAX restore")

    def dcp_load() -> None:
        try:
            dcp.load(state(), storage_reader=Reader(ckpt))
        except CheckpointException as e:
            for exc, _ in e.failures.values():
                if isinstance(exc, ValueError) and str(exc).startswith("Size mismatch between saved"):
                    return  # DCP's planner refuses a saved shape (a forged shape column) before reading
                if not isinstance(exc, shardsafe.CheckpointError):
                    # DCP reports a failed read_metadata as an AssertionError of its own
                    # (with the reader's message): ask the reader itself what it raised
                    Reader(ckpt).read_metadata()
                    raise exc
            raise next(iter(e.failures.values()))[0] from None

    def restore() -> None:
        target = state()
        if jax_state:
            target.update(jax_targets())
        step = CheckpointManager(mgr).restore(target)
        if step not in (1, 2):
            raise AssertionError(f"restore returned step {step}")

    ops = {"load": lambda: checked(shardsafe.load(ckpt), "load"),
           "load-mmap": lambda: checked(shardsafe.load(ckpt, mmap=True), "load(mmap=True)"),
           "load-in-place": in_place, "verify": lambda: _verify(ckpt),
            "ls": lambda: _cli("ls", mgr), "info": lambda: _cli("info", ckpt),
            "diff": lambda: _cli("diff", os.path.join(mgr, "step_1"), ckpt),
            "export": lambda: _cli("export", ckpt, os.path.join(mgr, "out.safetensors")),
            "export-pt": lambda: _cli("export", ckpt, os.path.join(mgr, "out.pt")),
            "dcp-reader": dcp_load,
            "cp": lambda: _cli("cp", ckpt, os.path.join(mgr, "copy"))}
    if jax_state:
        ops["jax-restore"] = jax_restore
    ops["restore"] = restore  # last: a writable manager moves the damaged step aside
    return ops


class CaseTimeout(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise CaseTimeout(f"took more than {CASE_SECONDS} s")


def _reference(ckpt: str, healthy: dict) -> dict:
    """What a load of ``ckpt`` may give: a whole read's values when the whole read and
    ``verify`` accept it, else the healthy state's (a reader that reads less reads only
    intact bytes or refuses)."""
    try:
        whole = shardsafe.load(ckpt)
        args = build_parser().parse_args(["verify", ckpt])
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = args.func(args)
    except shardsafe.CheckpointError:
        return healthy
    return values(whole) if code == 0 else healthy


def run_case(base: str, root: str, case: int, rng: random.Random, version: int, outside: str,
             healthy: dict) -> list[str]:
    mgr = os.path.join(root, f"case{case}")
    ckpt = os.path.join(mgr, "step_2")
    shutil.copytree(base, os.path.join(mgr, "step_1"))
    shutil.copytree(base, ckpt)
    what = damage(ckpt, rng, version, outside)
    if os.environ.get("FUZZ_SHOW_OK"):
        print(f"case {case}: {what}", file=sys.stderr)
    bad = []
    signal.alarm(CASE_SECONDS)
    try:
        want = _reference(ckpt, healthy)
    except BaseException as e:  # noqa: BLE001 - the fuzz records what escaped
        bad.append(f"case {case} ({what}) whole read: {type(e).__name__}: {e}")
        want = healthy
    finally:
        signal.alarm(0)
    for name, op in operations(ckpt, mgr, version, want).items():
        signal.alarm(CASE_SECONDS)
        try:
            op()
        except shardsafe.CheckpointError:
            pass
        except BaseException as e:  # noqa: BLE001 - the fuzz records what escaped
            tail = traceback.format_exception(e)[-3:]
            bad.append(f"case {case} ({what}) {name}: {type(e).__name__}: {e} | {''.join(tail)!r}")
        finally:
            signal.alarm(0)
        if os.path.exists(os.path.join(mgr, "SENTINEL")):
            bad.append(f"case {case} ({what}) {name}: a pickle from the checkpoint ran")
            os.remove(os.path.join(mgr, "SENTINEL"))
    shutil.rmtree(mgr, ignore_errors=True)
    return bad


def main() -> int:
    root, seed, cases, version = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    signal.signal(signal.SIGALRM, _alarm)
    base = os.path.join(root, "base")
    shardsafe.save(base_state(version), base)
    healthy = values(shardsafe.load(base))
    path = os.path.join(base, INDEX)  # the index in the version under test (saves write v4)
    with open(path, "rb") as f:
        index = decode_index(f.read())
    with open(path, "wb") as f:
        f.write(encode_index(index, version=version))
    outside = os.path.join(root, "outside.bin")
    with open(outside, "wb") as f:
        f.write(os.urandom(1 << 20))
    rng = random.Random(seed)
    bad = []
    for case in range(cases):
        bad += run_case(base, root, case, rng, version, outside, healthy)
    for line in bad:
        print(line)
    print(f"{cases} cases, {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
