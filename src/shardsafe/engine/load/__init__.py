"""Loading: match a checkpoint's index against a target (or build a new state), plan the
reads, read and verify every block, and place the bytes.

- ``match``: the walk that pairs a live state's tensors with the checkpoint's;
  ``new_state``: the structure of ``load(path)`` with its tensors allocated;
- ``targets``: what each target needs read, turned into the reader's tasks;
- ``reader``: the parallel, verified reads; ``mapped``: memory-mapped loads;
- ``index_exchange``: the collective index read of a load.
"""
