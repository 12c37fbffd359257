"""shardsafe as the storage layer of ``torch.distributed.checkpoint`` (DCP).

::

    import torch.distributed.checkpoint as dcp
    from shardsafe.dcp import Reader, Stager, Writer

    dcp.save(state_dict, storage_writer=Writer("ckpt/step-100"))
    dcp.async_save(state_dict, storage_writer=Writer("ckpt/step-200"), async_stager=Stager())
    dcp.load(state_dict, storage_reader=Reader("ckpt/step-100"))

``Writer`` makes DCP write an ordinary committed shardsafe checkpoint (atomic commit,
CRC32C per block, DCP's metadata as JSON); ``Reader`` reads any shardsafe checkpoint for
``dcp.load``, resharded to the target's layout, and hands DCP nothing it would have to
unpickle unless asked to; ``Stager`` is DCP's ``AsyncStager`` on shardsafe's reused
staging buffers. ``import shardsafe`` does not import this
package (nor DCP); importing it imports ``torch.distributed.checkpoint``.
"""

from __future__ import annotations

from .reader import Reader
from .stager import Stager
from .writer import Writer

__all__ = ["Reader", "Stager", "Writer"]
