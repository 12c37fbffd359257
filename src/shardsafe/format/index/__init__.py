"""The checkpoint index (``index.json``): its versions, what they decode into, and how
untrusted index bytes are checked (docs/FORMAT.md).

The index is a checkpoint's commit record. Modules, from the leaves up:

* ``rows``: data file, chunk and stored-block rows as objects; the file names an index may list;
* ``rules``: limits and checks every version's decoder applies (FORMAT.md section 9);
* ``chunk_table``: every chunk as numpy columns, validated;
* ``model``: ``ColumnarIndex``, what every version decodes into;
* ``container``: the binary container of versions 2 and later, and their chunk columns;
* ``objects``: ``Index``, the same index as objects built on demand;
* ``v1``, ``v2``, ``v3``, ``v4``: each version's encoder and decoder; ``v4_layout`` and
  ``v4_global``: version 4's byte layout and its global part, which a rank reads alone;
* ``versions``: the version saves write (``WRITE_VERSION``) and reading any version.

Pure: no threads, no I/O, no torch.distributed.
"""
