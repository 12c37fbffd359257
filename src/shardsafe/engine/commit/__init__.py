"""The life of a checkpoint on storage: what "committed" means, how a save becomes
committed (one rank, or every rank of a collective save), and how checkpoints are
retired and made self-contained.

- ``transaction``: the commit protocol (working directory, atomic publish of the index,
  ``is_committed``, ``read_index``); its functions are this package's own names, so
  ``engine.commit.read_index`` is the one index reader.
- ``two_phase``: the store-only begin/commit/abort of a collective save.
- ``entries``: each rank's part of the index as columns, and the index built from all.
- ``locations``: where the data files an index names live.
- ``sweep``: mark-and-sweep deletion; ``detach``: copying referenced data in.
- ``names``: which keys under a directory of checkpoints shardsafe writes (what ``gc``
  may abort of the unfinished uploads it finds).
"""

from .transaction import (
    TMP_MARKER,
    Transaction,
    abort,
    abort_quietly,
    begin,
    delete_checkpoint,
    finish,
    is_committed,
    is_temporary,
    list_entries,
    plan_transaction,
    read_index,
    read_index_bytes,
    split_path,
    uncommit,
)

__all__ = ["TMP_MARKER", "Transaction", "abort", "abort_quietly", "begin", "delete_checkpoint", "finish",
           "is_committed", "is_temporary", "list_entries", "plan_transaction", "read_index",
           "read_index_bytes", "split_path", "uncommit"]
