"""Child process of test_fuzz_checkpoints: seeded random damage to real checkpoints.

Usage: ``python fuzz_cases.py ROOT SEED CASES VERSION``. Each case copies a healthy
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
from v4_forge import seal_v4, split_v4  # noqa: E402

CASE_SECONDS = 20
INDEX = "index.json"
HUGE = [0, 1, 7, 4095, 4096, 2**31, 2**40, 2**62, 2**63 - 1]


def state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(64, 300, generator=g), "b": torch.arange(77, dtype=torch.int16),
            "h": torch.ones(5, dtype=torch.bfloat16), "e": torch.zeros(0), "step": 3,
            "opt": {"lr": 0.1, "m": [torch.full((3,), 2.0), torch.zeros(2, 2, dtype=torch.float64)]}}


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
                       "truncate-index", "replace-data", "replace-index", "forge", "forge", "forge-dcp"])
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
            out = _forge_v4(index_bytes, rng)
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


def operations(ckpt: str, mgr: str) -> dict:
    def in_place() -> None:
        target = state()
        shardsafe.load(ckpt, target)

    def dcp_load() -> None:
        try:
            dcp.load(state(), storage_reader=Reader(ckpt))
        except CheckpointException as e:
            for exc, _ in e.failures.values():
                if not isinstance(exc, shardsafe.CheckpointError):
                    # DCP reports a failed read_metadata as an AssertionError of its own
                    # (with the reader's message): ask the reader itself what it raised
                    Reader(ckpt).read_metadata()
                    raise exc
            raise next(iter(e.failures.values()))[0] from None

    def restore() -> None:
        step = CheckpointManager(mgr).restore(state())
        if step not in (1, 2):
            raise AssertionError(f"restore returned step {step}")

    return {"load": lambda: shardsafe.load(ckpt), "load-mmap": lambda: shardsafe.load(ckpt, mmap=True),
            "load-in-place": in_place, "verify": lambda: _verify(ckpt),
            "ls": lambda: _cli("ls", mgr), "info": lambda: _cli("info", ckpt),
            "diff": lambda: _cli("diff", os.path.join(mgr, "step_1"), ckpt),
            "export": lambda: _cli("export", ckpt, os.path.join(mgr, "out.safetensors")),
            "export-pt": lambda: _cli("export", ckpt, os.path.join(mgr, "out.pt")),
            "dcp-reader": dcp_load,
            "restore": restore}  # last: a writable manager moves the damaged step aside


class CaseTimeout(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise CaseTimeout(f"took more than {CASE_SECONDS} s")


def run_case(base: str, root: str, case: int, rng: random.Random, version: int, outside: str) -> list[str]:
    mgr = os.path.join(root, f"case{case}")
    ckpt = os.path.join(mgr, "step_2")
    shutil.copytree(base, os.path.join(mgr, "step_1"))
    shutil.copytree(base, ckpt)
    what = damage(ckpt, rng, version, outside)
    if os.environ.get("FUZZ_SHOW_OK"):
        print(f"case {case}: {what}", file=sys.stderr)
    bad = []
    for name, op in operations(ckpt, mgr).items():
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
    shardsafe.save(state(), base)
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
        bad += run_case(base, root, case, rng, version, outside)
    for line in bad:
        print(line)
    print(f"{cases} cases, {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
