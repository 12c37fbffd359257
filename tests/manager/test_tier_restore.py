"""``tier_restore.choose``: which step every rank can get, and from which tier (a table)."""

from __future__ import annotations

from shardsafe.manager.tier_restore import choose


def rep(local=(), held=None, bad_local=(), bad_peer=()) -> dict:  # noqa: ANN001
    return {"local": list(local), "held": {str(k): v for k, v in (held or {}).items()},
            "bad_local": list(bad_local), "bad_peer": list(bad_peer)}


HOLDERS = [2, 3, 0, 1]  # 2 nodes of 2 ranks


def test_every_rank_local() -> None:
    reports = [rep([4, 6], {2: [4, 6]}), rep([4, 6], {3: [4, 6]}), rep([4, 6], {0: [4, 6]}),
               rep([4, 6], {1: [4, 6]})]
    assert choose(reports, HOLDERS, None) == {"step": 6, "tiers": ["local"] * 4}


def test_lost_node_takes_peers() -> None:
    reports = [rep([4, 6], {2: [4, 6]}), rep([4, 6], {3: [4, 6]}), rep(), rep()]
    assert choose(reports, HOLDERS, 4) == {"step": 6, "tiers": ["local", "local", "peer", "peer"]}


def test_newest_common_step_and_bad_copies() -> None:
    reports = [rep([4, 6], {2: [4, 6]}), rep([4], {3: [4]}), rep([4, 6], {0: [4, 6]}),
               rep([4, 6], {1: [4]})]
    assert choose(reports, HOLDERS, None) == {"step": 4, "tiers": ["local"] * 4}
    reports[1] = rep([4, 6], {3: [4]}, bad_local=[6])  # rank 1's 6 is bad, its peer copy too old
    assert choose(reports, HOLDERS, None)["step"] == 4
    reports[3] = rep([4, 6], {1: [4, 6]})
    assert choose(reports, HOLDERS, None) == {"step": 6, "tiers": ["local", "peer", "local", "local"]}
    reports[1] = rep([4, 6], {3: [4]}, bad_local=[6], bad_peer=[6])
    assert choose(reports, HOLDERS, None)["step"] == 4


def test_persistent_newer_or_nothing_common() -> None:
    reports = [rep([4, 6], {2: [4, 6]}), rep([4, 6], {3: [4, 6]}), rep(), rep()]
    assert choose(reports, HOLDERS, 8) is None
    assert choose([rep(), rep(), rep(), rep()], HOLDERS, None) is None
    assert choose([rep([2])], [None], 2) == {"step": 2, "tiers": ["local"]}  # a tie goes local
