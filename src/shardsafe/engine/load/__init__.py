"""Loading, as one pipeline (docs/development.md, "The load pipeline").

- ``request``: the ``LoadRequest`` built at the API edge, and the kind of its target;
- ``run``: the one driver, from the index to what the load returns;
- ``index_exchange``: the index read once (collectively, or in parts for version 4);
- ``placers``: where bytes land (in place, new tensors, memory-mapped, JAX arrays; staged
  through bounded buffers where they cannot land directly); ``match``: pairing a live
  state's tensors with the checkpoint's;
- ``reader``: each target region cut into units; ``sources``: byte ranges from storage;
  ``transforms``: checksum verification and decoding.
"""
