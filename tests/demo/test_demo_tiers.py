"""The demo's local-tier section (a small state, in process)."""

from __future__ import annotations

import re

from shardsafe.demo.tiers import local_tier_section


def test_local_tier_section_times_both_tiers() -> None:
    text = local_tier_section(4 << 20)
    assert "restoring a 4 MiB state" in text
    local = float(re.search(r"from the local tier .*:\s+([\d.]+) s", text).group(1))
    cold = float(re.search(r"cold page cache:\s+([\d.]+) s", text).group(1))
    speedup = float(re.search(r"the local tier is ([\d.]+)x faster", text).group(1))
    assert local > 0 and cold > 0 and abs(speedup - cold / local) < 0.1 * speedup + 0.1
