"""The `phalanx` command line: one argparse tree; each subcommand lives beside what it drives.

Subcommands register themselves through `add_*_command(subparsers)` functions in their own
modules. To keep start-up fast (`phalanx kv get` should not import the simulator, the demo
and rich), only the module of the subcommand being run is imported; the top-level `--help`
lists every command from the table below without importing any of them.

Errors: every failure is one line on stderr and an exit code from the table in
`phalanx.cli.errors` (printed by `phalanx --help`); `main` runs the chosen handler through
`phalanx.cli.errors.run_handler`, so no operator mistake ends in a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from phalanx import __version__
from phalanx.cli.errors import (
    EXIT_CODES_HELP,
    EXIT_USAGE,
    Parser,
    print_error,
    run_handler,
    tolerate_undecodable_output,
)

# (command, module, registration function, one-line help for the top-level listing)
COMMANDS: tuple[tuple[str, str, str, str], ...] = (
    ("demo", "phalanx.demo.command", "add_demo_command",
     "a 3-node cluster, a leader crash, and a linearizability check"),
    ("cluster", "phalanx.ops.cluster_command", "add_cluster_command",
     "create and run a local cluster"),
    ("node", "phalanx.cli.node", "add_node_command", "run a phalanx node"),
    ("kv", "phalanx.cli.kv", "add_kv_command", "read and write keys of a running cluster"),
    ("call", "phalanx.cli.call", "add_call_command",
     "send one raw command to any app of a running cluster (your own state machine)"),
    ("chain", "phalanx.cli.chain", "add_chain_command",
     "accounts, transfers, blocks and proofs of a chain cluster"),
    ("gossip", "phalanx.cli.gossip", "add_gossip_command",
     "publish rumors and watch the gossip service of a running cluster"),
    ("announce", "phalanx.cli.announce", "add_announce_command",
     "show the checkpoints linked clusters announce to each other"),
    ("status", "phalanx.cli.status", "add_status_command",
     "show every node's role, term, commit and applied index"),
    ("member", "phalanx.cli.member", "add_member_command",
     "list, add, promote and remove members of a running Raft cluster"),
    ("leader", "phalanx.cli.member", "add_leader_command",
     "move the leadership of a running Raft cluster"),
    ("cert", "phalanx.cli.cert", "add_cert_command",
     "issue, show, rotate and reload certificates (client roles, expiry, CA rotation)"),
    ("snapshot", "phalanx.cli.snapshot", "add_snapshot_command",
     "back up a running cluster into a file; restore it as a new cluster"),
    ("sim", "phalanx.jepsen.sim.cli", "add_sim_command",
     "run seeded deterministic simulations and check safety, linearizability, liveness"),
    ("jepsen", "phalanx.jepsen.cli", "add_jepsen_command",
     "run fault-injection tests on real clusters; check recorded histories"),
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; the full definition of `command` only (all of them when None)."""
    parser = Parser(
        prog="phalanx",
        description="Crash- and Byzantine-fault-tolerant replicated state machines.",
        epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"phalanx {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module, function, help_text in COMMANDS:
        if command is None or command == name:
            getattr(importlib.import_module(module), function)(subparsers)
        else:
            subparsers.add_parser(name, help=help_text)
    return parser


def _chosen_command(argv: Sequence[str]) -> str | None:
    names = {c[0] for c in COMMANDS}
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in names else None
    return None


def _runs_a_node(argv: Sequence[str]) -> bool:
    """`phalanx node run CONFIG ...` (and not a request for its help)."""
    words = [a for a in argv if not a.startswith("-")]
    return words[:2] == ["node", "run"] and not {"-h", "--help"} & set(argv)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and _runs_a_node(sys.argv[1:]):
        # Before the node runtime is imported (~0.7 s), so the re-executed interpreter is
        # the only one that imports it (`phalanx.runtime.process_tuning.use_system_malloc`).
        from phalanx.runtime.process_tuning import use_system_malloc
        use_system_malloc()
    argv = list(sys.argv[1:] if argv is None else argv)
    tolerate_undecodable_output()
    command = _chosen_command(argv)
    parser = build_parser(command) if command else build_parser("")
    args = parser.parse_args(argv)  # a usage error: one line, SystemExit(2)
    handler = getattr(args, "handler", None)
    if handler is None:
        print_error("phalanx", "no command given (see 'phalanx --help')")
        return EXIT_USAGE
    return run_handler(handler, args, f"phalanx {command}" if command else "phalanx")
