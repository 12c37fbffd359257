"""plan.collective.report: what a rank sends about its state (split, columns, wire format, digests)."""

from __future__ import annotations

import numpy as np
import pytest
from plan_ranks import describe_rank, fsdp_rank

from shardsafe.plan.flatten import flatten
from shardsafe.plan.collective.report import (EMPTY, HELLO_BYTES, NO_VALUES, OWN, PER_RANK_CLASS, PLAIN, Boxes,
                                   decode_report, describe, hello, report, split_state)
from shardsafe.plan.collective.writers import PlanError


def _per_rank_state(rank: int, draws: int = 3) -> dict:
    return {"w": np.ones(4, np.float32), "step": 7,
            "rng": {str(rank): {"seed": rank, "draws": draws, "state": np.arange(3) + rank}}}


def test_per_rank_entries_leave_the_shape_and_keep_their_tensors() -> None:
    r = describe_rank(2, _per_rank_state(2), per_rank=["rng"])
    parts = r.desc.parts
    assert parts.tree["v"][2] == {"t": "dict", "k": [], "v": [], "cls": PER_RANK_CLASS}
    assert parts.shape_ids == [0] and parts.value_ids == [1]
    [[path, key, sub]] = parts.entries
    assert path == ["rng"] and key == "2"
    assert sub["v"][2] == {"t": "tensor", "id": 0}  # ids count the values' own tensors
    # another rank with other values has the same shape, another values digest
    other = describe_rank(5, _per_rank_state(5), per_rank=["rng"])
    assert other.desc.shape.digest == r.desc.shape.digest
    assert other.desc.values.digest not in (r.desc.values.digest, NO_VALUES)


def test_values_change_values_digest_but_not_layout() -> None:
    a = describe_rank(1, _per_rank_state(1, draws=3), per_rank=["rng"]).desc
    b = describe_rank(1, _per_rank_state(1, draws=4), per_rank=["rng"]).desc
    assert a.layout == b.layout and a.shape.digest == b.shape.digest
    assert a.values.digest != b.values.digest


def test_a_tensor_shared_across_the_per_rank_border_is_refused() -> None:
    w = np.ones(4, np.float32)
    tree, items = flatten({"w": w, "rng": {"0": {"same": w}}})
    tree["v"][1]["cls"] = PER_RANK_CLASS
    with pytest.raises(TypeError, match="shares its memory"):
        split_state(tree, len(items))


def test_dtensor_inside_per_rank_is_refused() -> None:
    tree, items = flatten({"rng": {"0": {"x": np.ones(2)}}})
    tree["v"][0]["cls"] = PER_RANK_CLASS
    with pytest.raises(TypeError, match=r"DTensor inside a shardsafe.PerRank value at key path 'rng.0.x'"):
        describe(tree, items, [(0, 1)], 0)


def test_holder_codes_and_led_boxes() -> None:
    state = {"plain": np.ones(3), "own": np.ones(2), "empty": np.ones(0), "tp": np.ones(4), "dp": np.ones(5)}
    boxes = {"own": ((3,), (0,), (8,)), "empty": ((), (8,), (8,)), "tp": ((3, 7), (0,), (4,)),
             "dp": ((1, 3), (0,), (5,))}
    d = describe_rank(3, state, boxes).desc
    assert d.boxes.holder.tolist() == [PLAIN, OWN, EMPTY, 0, 1]
    assert d.boxes.sets == [(3, 7), (1, 3)]
    rep = decode_report(report(3, d.boxes), 3)
    assert rep.own == 16  # the box only rank 3 holds
    # rank 3 leads (3, 7) only: rank 1 reports the box of (1, 3)
    assert rep.item.tolist() == [3] and rep.set.tolist() == [0] and rep.sets == [(3, 7)]
    assert rep.nbytes.tolist() == [32] and rep.shape == rep.values == b""


def test_report_round_trips_with_shape_and_values() -> None:
    d = describe_rank(0, _per_rank_state(0), per_rank=["rng"]).desc
    raw = report(0, d.boxes, d.shape.body, d.values.body)
    rep = decode_report(raw, 0)
    assert rep.shape == d.shape.body and rep.values == d.values.body
    assert decode_report(report(0, None, b"", d.values.body), 0).own == 0


@pytest.mark.parametrize("cut", [1, 10, 39, -1])
def test_malformed_reports_name_the_rank(cut: int) -> None:
    d = fsdp_rank(1, 2, [4, 5]).desc
    raw = report(1, Boxes(d.boxes.holder, d.boxes.nbytes, [(1, 3)], d.boxes.offsets), b"xy")
    with pytest.raises(PlanError, match="rank 4 sent a malformed report"):
        decode_report(raw[:cut], 4)
    with pytest.raises(PlanError, match="rank 4"):
        decode_report(b"XXXX" + raw[4:], 4)


def test_layout_digest_sees_boxes_and_positions() -> None:
    base = fsdp_rank(1, 4, [8, 8]).desc
    assert fsdp_rank(1, 4, [8, 8]).desc.layout == base.layout
    assert fsdp_rank(2, 4, [8, 8]).desc.layout != base.layout  # other offsets
    assert fsdp_rank(1, 4, [8, 9]).desc.layout != base.layout  # other global shape
    h = hello(True, base.layout, base.shape.digest, base.values.digest)
    assert len(h) == HELLO_BYTES and h[:1] == b"D"
