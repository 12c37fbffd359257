"""The ``shardsafe`` command line. Each subcommand lives in its own module ``cli/<name>.py``
exposing ``register(subparsers)``; that function adds a parser whose ``func(args) -> int``
runs the command. Errors print one line and exit with a documented code (see
docs/guides/cli.md).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence

from .._version import __version__
from ..errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError
from ..format import planes_kernel
from ..format.index.versions import WRITE_VERSION

# Exit codes (documented in docs/guides/cli.md, "Exit codes").
EXIT_OK = 0
EXIT_FAILED = 1       # the command ran and found a problem (verify: corruption; demo: states differ)
EXIT_USAGE = 2        # bad arguments
EXIT_NOT_FOUND = 3    # no committed checkpoint at the path
EXIT_CORRUPT = 4      # the checkpoint is damaged
EXIT_BROKEN_PIPE = 141  # stdout was closed by its reader (``shardsafe ls | head -1``), as 128 + SIGPIPE

_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")  # colours, cursor moves, titles


class UsageError(ValueError):
    """Bad arguments that argparse cannot check (JSON options, a file suffix): exit code 2."""

COMMANDS: tuple[str, ...] = ("demo", "bench", "ls", "info", "verify", "export", "import_", "diff", "gc",
                             "cp")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shardsafe", description="Fast, safe checkpoints for training jobs.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # --version unwrapped
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug output")
    parser.add_argument("--version", action="version", version=version_line(),
                        help="print the version, the index format saves write and which planes transform runs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def version_line() -> str:
    """What ``shardsafe --version`` prints: the package version, the index format saves
    write, and which planes transform ``compression="auto"`` runs (the compiled kernel's file)."""
    kernel = planes_kernel.loaded()
    where = "" if kernel is None else f" {kernel.__file__}"
    return (f"shardsafe {__version__} (index format {WRITE_VERSION}; compression planes transform: "
            f"{planes_kernel.describe()}{where})")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``shardsafe`` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:
        # nobody reads the rest: say nothing, and keep Python from reporting the failed
        # flush of the lines still buffered when it exits
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except CheckpointNotFoundError as e:
        return _error("error", e, EXIT_NOT_FOUND)
    except CorruptCheckpointError as e:
        return _error("corrupt checkpoint", e, EXIT_CORRUPT)
    except UsageError as e:
        return _error("error", e, EXIT_USAGE)
    except (CheckpointError, OSError, ValueError, TypeError, ImportError) as e:
        return _error("error", e, EXIT_FAILED)
    except KeyboardInterrupt:
        print("shardsafe: interrupted", file=sys.stderr)
        return 130


def _error(what: str, e: BaseException, code: int) -> int:
    """Prints ``e`` as one line on stderr (terminal escapes from other libraries' messages
    removed) and returns ``code``."""
    print(f"shardsafe: {what}: {_ESCAPES.sub('', str(e))}", file=sys.stderr)
    return code
