"""The `phalanx` command line: one argparse tree; each subcommand lives beside what it drives.

Subcommands register themselves through `add_*_command(subparsers)` functions in their own
modules, so this file only wires them together.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from phalanx import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="phalanx",
        description="Crash- and Byzantine-fault-tolerant replicated state machines.",
    )
    parser.add_argument("--version", action="version", version=f"phalanx {__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    result: int = handler(args)
    return result
