"""Compressed collective saves (gloo, 3 ranks) reloaded resharded on 2 ranks and in one process
(phases of the shared ``cluster`` job)."""

from __future__ import annotations

import os

import torch
from dist_worker import compressed_tensors

import shardsafe
from shardsafe.api.load import read_checkpoint_index
from shardsafe.cli.verify import verify_checkpoint
from shardsafe.cli._listing import checkpoints_at
from shardsafe.storage.local import LocalStorage


def test_each_rank_writes_its_compressed_shards_to_its_block_file(cluster) -> None:  # noqa: ANN001
    out, _ = cluster
    index = read_checkpoint_index(os.path.join(out, "cz-sync"))
    names = sorted(f.name for f in index.files)
    assert [n for n in names if n.endswith(".blocks")] == [f"data-r{r:05d}-000.blocks" for r in range(3)]
    w = next(t for t in index.tensors if t.key == ("m", "w"))
    assert [c.file for c in w.chunks] == [f"data-r{r:05d}-000.blocks" for r in range(3)]
    assert all(c.stored is not None and c.stored.nbytes < c.nbytes for c in w.chunks)
    small = next(t for t in index.tensors if t.key == ("small",))
    assert small.chunks[0].stored is None and small.chunks[0].file.endswith(".safetensors")
    mixed = read_checkpoint_index(os.path.join(out, "cz-mixed"))
    w = next(t for t in mixed.tensors if t.key == ("m", "w"))
    assert [c.stored is not None for c in w.chunks] == [True, False, True]  # rank 1 chose None


def test_compressed_checkpoints_reload_resharded_and_in_one_process(cluster) -> None:  # noqa: ANN001
    out, results = cluster
    assert all(r == {"cz-sync": True, "cz-async": True, "cz-mixed": True}
               for r in results[("compressed_load", 2)])
    full = compressed_tensors()
    for name in ("cz-sync", "cz-async", "cz-mixed"):
        state = shardsafe.load(os.path.join(out, name))
        assert all(torch.equal(state["m"][k], full[k]) for k in full), name
        entry = next(e for e in checkpoints_at(LocalStorage(), os.path.join(out, name)))
        assert verify_checkpoint(LocalStorage(), entry, name) == []
