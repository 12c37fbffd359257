"""The scale benchmark runs end to end on a small job and reports what it promises."""

from __future__ import annotations

import json
import subprocess
import sys

from shardsafe.bench.scale import build_index, run
from shardsafe.format.index_v2 import decode, encode


def test_simulated_job_is_a_valid_fsdp_index() -> None:
    index = build_index(8, 10)
    assert decode(encode(index)) == index
    ct = index.chunks
    assert all(s is not None and s.dim == 0 and s.file_stride == 1 for s in ct.splits)
    # tensor 7 is uneven (8 * 2 - 3 = 13 rows over 8 ranks: parts of 2, the last of 1)
    assert index.tensors[7].shape[0] == 13 and ct.tensor_chunks(7).extent[:, 0].tolist() == [2] * 6 + [1]
    assert len(index.files) == 8 and [f.rank for f in index.files] == list(range(8))


def test_figures() -> None:
    out = run(16, 20, v1=True)
    assert out["chunks"] == build_index(16, 20).chunks.num_chunks
    assert out["bytes_per_chunk"] == round(out["index_bytes"] / out["chunks"], 2) < 24
    assert out["v1_bytes_per_chunk"] > 4 * out["bytes_per_chunk"]
    assert out["reads_one_rank"] == 20 and out["write_imbalance"] < 1.1


def test_command_line_ends_with_one_json_line(subprocess_env: dict[str, str]) -> None:
    res = subprocess.run([sys.executable, "-m", "shardsafe.bench.scale", "--ranks", "8", "--tensors", "5"],
                         env=subprocess_env, capture_output=True, text=True, check=True, timeout=120)
    last = json.loads(res.stdout.strip().splitlines()[-1])
    for key in ("index_bytes", "encode_s", "decode_s", "plan_s", "peak_rss_mib", "bytes_per_chunk"):
        assert key in last
    assert last["ranks"] == 8 and last["chunks"] == 40
