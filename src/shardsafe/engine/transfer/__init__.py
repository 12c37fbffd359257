"""Moving committed checkpoints between paths and stores (``shardsafe cp``).

- ``verbatim``: a byte-for-byte copy, every block verified on the way;
- ``recode``: a copy with another coding, through the save pipeline.
"""
