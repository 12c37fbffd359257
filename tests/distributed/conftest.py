"""One real multi-process job shared by the distributed tests (start-up is the cost)."""

from __future__ import annotations

from typing import Any

import pytest
from dist_harness import run_ranks

Results = dict[tuple[str, int], list[dict[str, Any] | None]]

# save on 4 ranks, reload on 4, 3 and 2, comm checks, async, manager, incremental and
# compressed saves on 3, ranks with different trees saved on 4 and loaded on 3, a
# compressed reload and a lost plan share on 2, entries sent through files on 3: one interpreter start-up per process
# instead of one per phase (or per job)
PHASES = [("save", 4), ("load", 4), ("load", 3), ("load", 2), ("comm", 3), ("async", 3),
          ("manager", 3), ("incremental", 3), ("many", 4), ("many_load", 3), ("compressed", 3),
          ("compressed_load", 2), ("lost", 2), ("entries_in_files", 3)]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Results]:
    out = str(tmp_path_factory.mktemp("cluster"))
    return out, run_ranks(4, PHASES, out, timeout=420)
