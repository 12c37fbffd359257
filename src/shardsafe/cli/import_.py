"""``shardsafe import SRC CKPT``: convert a torch.save file, a safetensors file, a DCP checkpoint
or an Orbax checkpoint.

* torch.save files are read with ``torch.load(weights_only=True)``: files holding
  arbitrary Python objects are refused, never unpickled.
* safetensors files become a flat dict keyed by their tensor names; their
  ``__metadata__`` is kept in the checkpoint's metadata.
* A DCP (torch.distributed.checkpoint) directory is read in this process without a
  process group. DCP's own ``.metadata`` file is a pickle, which can run code when read,
  so this runs only with ``--trust-pickle``, for a local directory the user names
  explicitly (never a URL). Non-tensor values inside DCP are read with
  ``torch.load(weights_only=True)``, not DCP's default full unpickling.
* An Orbax checkpoint (the PyTree layout of ``StandardCheckpointer``, OCDBT or not; a
  ``CheckpointManager`` step with one item) is read through orbax-checkpoint (``_orbax``),
  every array as stored; the new checkpoint is then loaded back and compared with it,
  byte for byte, before the command reports success.

Only regular files (and, for DCP, a directory of regular files) are read: a FIFO,
socket or device is refused before it is opened (opening a FIFO would block forever).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pickle import UnpicklingError  # the error torch raises for refused objects; nothing is unpickled here
from typing import Any

from . import EXIT_OK
from ..values import torch as torch_values
from ..api.load import load
from ..api.save import save
from ..errors import CorruptCheckpointError
from . import _orbax
from ._args import add_command, storage_options
from ._tensors import require_torch
from ..engine.commit.diagnose import DCP_METADATA
from ..storage.files import kind_of


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "import", run, "convert a torch.save / safetensors / DCP / Orbax checkpoint",
                    "Convert SRC into a shardsafe checkpoint at CKPT. SRC is a torch.save file "
                    "(loaded with weights_only=True), a .safetensors file, a DCP checkpoint "
                    "directory (local and trusted, with --trust-pickle: DCP metadata is a pickle), "
                    "or an Orbax checkpoint directory (StandardCheckpointer / PyTree layout; "
                    "needs orbax-checkpoint), verified bit-exact after the import.",
                    ("src", "SRC", "source file, DCP or Orbax directory (local)"),
                    ("ckpt", "CKPT", "checkpoint to create (directory or URL)"),
                    json_help="print JSON for machines: what was imported into which checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint")
    p.add_argument("--trust-pickle", action="store_true",
                   help="allow reading a DCP directory: its .metadata is a Python pickle, which "
                        "can run code when read (only for checkpoints you trust)")
    p.add_argument("--prefix", metavar="KEY", default=None,
                   help="store the imported state under this top-level key (--prefix model: "
                        "load(CKPT, {'model': module}) restores a module in place)")


def read_torch_save(src: str) -> Any:
    """A torch.save file's content, loaded weights-only (no arbitrary objects)."""
    try:
        try:  # memory-mapped: the tensors are paged in while they are saved, not held twice
            return torch_values.torch.load(src, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
            return torch_values.torch.load(src, map_location="cpu", weights_only=True)  # legacy format
    except UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{src}: refused by torch.load(weights_only=True), it holds arbitrary "
                         f"Python objects ({first})") from None
    except RuntimeError as e:  # torch reports a non-zip / damaged file this way
        raise ValueError(f"{src}: not a readable torch.save file ({str(e).splitlines()[0]})") from None


def read_safetensors(src: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The tensors of a safetensors file and its ``__metadata__``."""
    try:
        from safetensors import safe_open
    except ImportError:
        raise ImportError("importing .safetensors needs the safetensors package "
                          "(pip install 'shardsafe[cli]')") from None
    from safetensors import SafetensorError

    try:
        with safe_open(src, framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    except SafetensorError as e:
        raise ValueError(f"{src}: not a valid safetensors file ({e})") from None


def read_dcp(src: str) -> dict[str, Any]:
    """The full state of a DCP checkpoint directory, read without a process group."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    class WeightsOnlyPlanner(_EmptyStateDictLoadPlanner):
        """DCP's own planner unpickles non-tensor values fully; this one refuses objects."""

        def load_bytes(self, read_item: Any, value: Any) -> None:
            loaded = torch_values.torch.load(value, weights_only=True)
            fqn = read_item.dest_index.fqn
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], loaded)
            else:
                self.state_dict[fqn] = loaded

    state: dict[str, Any] = {}
    try:
        _load_state_dict(state, storage_reader=FileSystemReader(src), planner=WeightsOnlyPlanner(),
                         no_dist=True)
    except UnpicklingError as e:
        raise ValueError(f"{src}: a DCP value holds arbitrary Python objects ({e})") from None
    except CheckpointException as e:  # DCP wraps the failures of its reads in this
        failures = getattr(e, "failures", {}) or {}
        first = next(iter(failures.values()), (e,))  # (exception, traceback summary) per rank
        cause = first[0] if isinstance(first, tuple) else first
        raise ValueError(f"{src}: DCP could not read the checkpoint ({type(cause).__name__}: "
                         f"{cause})") from None
    return state


def _check_dcp(src: str, trust_pickle: bool) -> None:
    """A DCP directory may be read: ``.metadata`` and every entry are regular files (or
    directories), and the user trusts its pickle."""
    if not os.path.exists(os.path.join(src, DCP_METADATA)):
        raise ValueError(f"{src} is a directory without {DCP_METADATA}: not a DCP checkpoint")
    for name in sorted(os.listdir(src)):
        kind = kind_of(os.path.join(src, name))
        if kind not in ("a regular file", "a directory") or (name == DCP_METADATA and kind != "a regular file"):
            raise ValueError(f"{os.path.join(src, name)} is {kind}, not a regular file (never opened)")
    if not trust_pickle:
        raise ValueError(f"{src} is a DCP checkpoint: its {DCP_METADATA} is a Python pickle, which "
                         f"can run code when read; pass --trust-pickle to import it if you trust it")


def _verify_orbax(state: Mapping[str, Any], args: argparse.Namespace) -> None:
    """Loads the new checkpoint back and compares it with the Orbax values, byte for byte.

    Raises:
        CorruptCheckpointError: a value differs (naming its key path).
    """
    loaded = load(args.ckpt, storage_options=storage_options(args))
    bad = _orbax.same_values(dict(state), loaded)
    if bad:
        raise CorruptCheckpointError(f"{args.ckpt}: the imported checkpoint differs from the Orbax "
                                     f"checkpoint at {', '.join(bad[:8])}")


def run(args: argparse.Namespace) -> int:
    src = args.src
    if "://" in src:
        raise ValueError("import reads a local SRC; copy it from object storage first")
    metadata: dict[str, Any] = {"source": os.path.abspath(src)}
    try:
        kind = kind_of(src)
    except FileNotFoundError:
        raise FileNotFoundError(f"{src} does not exist") from None
    if kind == "a directory" and _orbax.is_orbax(src):
        state, metadata["format"] = _orbax.read_orbax(src), "orbax"
    elif kind == "a directory":
        require_torch("import")
        _check_dcp(src, args.trust_pickle)
        state, metadata["format"] = read_dcp(src), "dcp"
    elif kind != "a regular file":
        raise ValueError(f"{src} is {kind}, not a regular file (never opened)")
    elif src.lower().endswith(".safetensors"):
        require_torch("import")
        state, st_meta = read_safetensors(src)
        metadata.update(format="safetensors", safetensors_metadata=st_meta)
    else:
        require_torch("import")
        state, metadata["format"] = read_torch_save(src), "torch.save"
    if not isinstance(state, Mapping):
        raise ValueError(f"{src} holds a {type(state).__name__}, not a dict of state")
    if args.prefix is not None:
        if not args.prefix:
            raise ValueError("--prefix needs a non-empty key")
        state, metadata["prefix"] = {args.prefix: state}, args.prefix
    save(state, args.ckpt, overwrite=args.overwrite, metadata={"shardsafe.import": metadata},
         storage_options=storage_options(args))
    if metadata["format"] == "orbax":
        _verify_orbax(state, args)
    if args.json:
        print(json.dumps({"imported": src, "format": metadata["format"], "into": args.ckpt}))
    else:
        print(f"imported {src} ({metadata['format']}) into {args.ckpt}")
    return EXIT_OK
