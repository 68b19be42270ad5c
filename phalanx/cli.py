"""The `phalanx` command line: one argparse tree; each subcommand lives beside what it drives.

Subcommands register themselves through `add_*_command(subparsers)` functions in their own
modules, so this file only wires them together.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from phalanx import __version__
from phalanx.demo_local import add_demo_command
from phalanx.jepsen.cli import add_jepsen_command
from phalanx.jepsen.sim.cli import add_sim_command
from phalanx.node_cli import add_node_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="phalanx",
        description="Crash- and Byzantine-fault-tolerant replicated state machines.",
    )
    parser.add_argument("--version", action="version", version=f"phalanx {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_demo_command(subparsers)
    add_node_command(subparsers)
    add_sim_command(subparsers)
    add_jepsen_command(subparsers)
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
