"""A save's replicas (engine.save.replica): fed from the same staged bytes, committed on their own.

Bytes copied out of training memory are counted where every save copies them (the
feed's ``copy_unit``, into staging images, budget slots and bounce buffers alike): a
save with a replica copies the state once.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import numpy as np
import pytest
import torch
from helpers import assert_same

import shardsafe
from shardsafe.cli import main as cli_main
from shardsafe.engine import commit
from shardsafe.engine.save import feeds
from shardsafe.engine.save.incremental import Baseline
from shardsafe.engine.save.request import Replica
from shardsafe.engine.save.request import SaveRequest
from shardsafe.engine.save.units import HEADER
from shardsafe.storage import LocalStorage

MiB = 1 << 20


def make_state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(1 << 20, generator=g), "b": torch.arange(3000) * seed,
            "zeros": torch.zeros(1 << 19, dtype=torch.bfloat16),
            "c": [torch.ones(10, dtype=torch.float16), np.arange(50, dtype=np.int32)], "s": seed}


def nbytes(state: dict) -> int:
    ts = [state["a"], state["b"], state["zeros"], state["c"][0]]
    return sum(t.numel() * t.element_size() for t in ts) + state["c"][1].nbytes


@pytest.fixture
def copied(monkeypatch) -> list[int]:
    """Counts the item bytes copied out of the state's own memory."""
    count = [0]
    unit = feeds.copy_unit

    def spy_unit(units, k, sources, out, base=0):  # noqa: ANN001, ANN202
        parts = units.parts(k)
        count[0] += sum(n for i, n in zip(parts.item, parts.length) if i != HEADER and sources.addr[i])
        return unit(units, k, sources, out, base)

    monkeypatch.setattr(feeds, "copy_unit", spy_unit)
    return count


def submit(ckpt: shardsafe.Checkpointer, state: dict, path: str, replicas: list[Replica], *,
           staging: str | None = "blocking", baseline: Baseline | None = None) -> shardsafe.SaveHandle:
    """A save of ``state`` carrying ``replicas`` (what the manager's tiers submit)."""
    return ckpt._saver.submit(SaveRequest(state=state, path=path, replicas=tuple(replicas),
                                             staging=staging, baseline=baseline)).handle


@pytest.mark.parametrize("mode", ["async", "async-budget", "sync"])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_save_and_its_copy_copy_the_state_once(tmp_path, copied, mode, compression) -> None:
    state = make_state(1)
    budget = 64 * MiB if mode == "async-budget" else None  # (the state is 5 MiB: see the memory test)
    with shardsafe.Checkpointer(max_staging_bytes=budget, compression=compression) as ckpt:
        copy = Replica({"state": state}, str(tmp_path / "copy"), {"mine": 1})
        submit(ckpt, state, str(tmp_path / "save"), [copy], staging=None if mode == "sync" else "blocking").result()
        copy.progress.handle.result()
    assert copied[0] == nbytes(state)  # a second copy would double it
    assert copy.progress.nbytes == 0  # every file mirrored: nothing staged for the replica alone
    assert_same(shardsafe.load(str(tmp_path / "save")), state)
    got = shardsafe.load(str(tmp_path / "copy"))
    assert set(got) == {"state"}
    assert_same(got["state"], state)
    index = commit.read_index(LocalStorage(), str(tmp_path / "copy"))
    assert index.world_size == 1 and index.metadata == {"mine": 1}
    # a mirrored file carries the copy's own header (its key names): verify checks both
    assert cli_main(["verify", str(tmp_path / "copy")]) == 0
    assert cli_main(["verify", str(tmp_path / "save")]) == 0


def test_items_the_save_does_not_write_are_staged_for_the_copy(tmp_path, copied) -> None:
    """An incremental save references unchanged chunks; the copy stands alone, so it stages
    them itself: still every byte leaves training memory once."""
    state, base = make_state(2), Baseline()
    with shardsafe.Checkpointer() as ckpt:
        submit(ckpt, state, str(tmp_path / "s1"), [], baseline=base).result()
        state["b"] += 1  # only "b" changes
        copied[0] = 0
        copy = Replica({"state": state}, str(tmp_path / "copy"))
        h = submit(ckpt, state, str(tmp_path / "s2"), [copy], baseline=base)
        h.result()
        copy.progress.handle.result()
    assert copied[0] == nbytes(state)
    assert copy.progress.nbytes > state["a"].numel() * 4  # "a" went to the replica's own file
    assert_same(shardsafe.load(str(tmp_path / "s2")), state)
    assert_same(shardsafe.load(str(tmp_path / "copy"))["state"], state)


def test_a_failed_copy_does_not_fail_the_save(tmp_path) -> None:
    state = make_state(3)
    (tmp_path / "file").write_text("not a directory")
    with shardsafe.Checkpointer() as ckpt:
        bad = Replica({"state": state}, str(tmp_path / "file" / "copy"))
        submit(ckpt, state, str(tmp_path / "save"), [bad]).result()  # the save commits
        with pytest.raises(OSError):
            bad.progress.handle.result()
    assert_same(shardsafe.load(str(tmp_path / "save")), state)


@pytest.mark.parametrize("budget", [None, 16 * MiB])
def test_a_failed_save_does_not_fail_its_copy(tmp_path, tiny_tmpfs, budget) -> None:
    state = make_state(4)  # 5 MiB: does not fit in the 1 MiB filesystem of the save
    with shardsafe.Checkpointer(max_staging_bytes=budget) as ckpt:
        copy = Replica({"state": state}, str(tmp_path / "copy"))
        h = submit(ckpt, state, str(tiny_tmpfs / "save"), [copy])
        with pytest.raises(OSError, match="No space left"):
            h.result()
        copy.progress.handle.result()
    assert_same(shardsafe.load(str(tmp_path / "copy"))["state"], state)
    assert os.listdir(tiny_tmpfs) == []  # nothing of the failed save is left


MEMORY_CHILD = textwrap.dedent("""
    import json, os, sys, torch, shardsafe
    from shardsafe.engine.save.request import Replica
    from shardsafe.engine.save.request import SaveRequest

    def rss():
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024

    d, budget, compression = sys.argv[1], int(sys.argv[2]) or None, sys.argv[3] if sys.argv[3] != "none" else None
    g = torch.Generator().manual_seed(0)
    half = torch.randn(16 << 20, generator=g)  # 64 MiB of noise (stored raw: it does not shrink)
    state = {"noise": half, "smooth": torch.arange(32 << 20, dtype=torch.float32) / 7,  # 128 MiB
             "zeros": torch.zeros(16 << 20, dtype=torch.float32), "step": 0}  # 64 MiB
    nbytes = sum(t.numel() * 4 for t in (state["noise"], state["smooth"], state["zeros"]))
    warm = {"w": torch.randn(8 << 20)}  # imports, pools, codec contexts: not counted
    with shardsafe.Checkpointer(max_staging_bytes=budget, compression=compression) as ckpt:
        w2 = Replica({"s": warm}, os.path.join(d, "w2"))
        ckpt._saver.submit(SaveRequest(state=warm, path=os.path.join(d, "warm"), replicas=(w2,),
                                          staging="blocking")).handle.result()
    del warm
    ckpt = shardsafe.Checkpointer(max_staging_bytes=budget, compression=compression)  # holds nothing yet
    base, _ = rss()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    copy = Replica({"state": state}, os.path.join(d, "copy"))
    ckpt._saver.submit(SaveRequest(state=state, path=os.path.join(d, "save"), replicas=(copy,),
                                      staging="blocking")).handle.result()
    copy.progress.handle.result()
    peak = rss()[1]
    ckpt.close()
    for path, got in ((os.path.join(d, "save"), None), (os.path.join(d, "copy"), "state")):
        out = shardsafe.load(path)
        out = out[got] if got else out
        assert all(torch.equal(out[k], state[k]) for k in ("noise", "smooth", "zeros"))
    print(json.dumps({"nbytes": nbytes, "extra": peak - base}))
""")


@pytest.mark.parametrize("budget, compression", [(0, "none"), (64 * MiB, "zstd"), (64 * MiB, "auto")])
def test_memory_of_a_save_with_its_copy(tmp_path, subprocess_env, python, budget, compression) -> None:
    """One staged copy of the state (or the budget, + 25% when compressed), however many
    destinations; both round-trip bit-exactly."""
    r = subprocess.run([python, "-c", MEMORY_CHILD, str(tmp_path), str(budget), compression],
                       env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    if budget:
        assert m["extra"] <= 1.25 * budget, (m["extra"] / MiB, m)
    else:
        assert m["extra"] <= m["nbytes"] + 24 * MiB, (m["extra"] / MiB, m)
