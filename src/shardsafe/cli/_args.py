"""What a subcommand's operands and options name: storage options, the checkpoint an
operand names (``DIR@latest``, ``DIR@N``), the shared options and how a command is added."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable

from . import UsageError
from ..engine.commit.diagnose import describe, read_index_explained
from ..errors import CheckpointNotFoundError
from ..format.index.objects import Index
from ..manager.steps import StepDirectory
from ..storage import Storage, storage_for


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    """Adds ``--storage-options JSON`` (passed to fsspec for URLs such as ``s3://``)."""
    parser.add_argument("--storage-options", metavar="JSON", default=None,
                        help="fsspec options for URLs, as a JSON object, e.g. "
                             "'{\"endpoint_url\": \"http://127.0.0.1:9000\"}'")


CKPT = ("ckpt", "CKPT", "checkpoint directory or URL")  # the operand naming one checkpoint


def add_command(sub: argparse._SubParsersAction, name: str, run: Callable[[argparse.Namespace], int],
                help: str, description: str, *operands: tuple[str, str, str],
                json_help: str | None = None) -> argparse.ArgumentParser:
    """Adds subcommand ``name`` that calls ``run``: its ``operands`` (``(dest, metavar,
    help)`` each, positional), ``--json`` when ``json_help`` is given, and
    ``--storage-options``. Returns the parser, for the command's own options."""
    p = sub.add_parser(name, help=help, description=description)
    for dest, metavar, text in operands:
        p.add_argument(dest, metavar=metavar, help=text)
    if json_help is not None:
        p.add_argument("--json", action="store_true", help=json_help)
    add_storage_options(p)
    p.set_defaults(func=run)
    return p


def storage_options(args: argparse.Namespace, name: str = "storage_options") -> dict:
    """The parsed ``--storage-options`` (or the option stored as ``name``; an empty dict
    when absent)."""
    raw = getattr(args, name, None)
    flag = "--" + name.replace("_", "-")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise UsageError(f"{flag} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a JSON object")
    return value



def add_quiet_option(parser: argparse.ArgumentParser) -> None:
    """Adds ``-q/--quiet``: no progress bar."""
    parser.add_argument("-q", "--quiet", action="store_true", help="draw no progress bar")



_STEP_SUFFIX = re.compile(r"@(latest|\d+)$")


def resolve_step(path: str, options: dict) -> str:
    """The checkpoint a command's operand names: ``DIR@latest`` is the newest committed
    step of the manager directory ``DIR``, ``DIR@N`` its step N; any other path is itself.

    Raises:
        CheckpointNotFoundError: ``DIR`` has no such committed step.
    """
    m = _STEP_SUFFIX.search(path)
    if m is None:
        return path
    directory = path[:m.start()]
    storage, spath = storage_for(directory, options)
    steps = StepDirectory(storage, spath).committed()
    want = max(steps, default=None) if m.group(1) == "latest" else int(m.group(1))
    if want is None:
        raise CheckpointNotFoundError(f"{path!r}: no committed step; {describe(storage, spath, directory)}")
    if want not in steps:
        listed = ", ".join(str(s) for s in list(steps)[-5:])
        raise CheckpointNotFoundError(f"{path!r}: {directory!r} has no committed step {want} "
                                      f"(newest: {listed})")
    return f"{directory.rstrip('/')}/{steps[want]}"


def open_checkpoint(path: str, options: dict) -> tuple[Storage, str, Index]:
    """Storage, backend path and validated index of the committed checkpoint at ``path``
    (``DIR@latest`` and ``DIR@N`` name a step: ``resolve_step``).

    Raises:
        CheckpointNotFoundError: ``path`` holds none; the message says what it is instead.
    """
    path = resolve_step(path, options)
    storage, spath = storage_for(path, options)
    return storage, spath, read_index_explained(storage, spath, path)
