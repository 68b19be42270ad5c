"""`phalanx node run CONFIG`: run one node in the foreground until SIGINT or SIGTERM.

Owns: `run_node` (load the config, tune malloc, run `phalanx.node.open_node` with a task that
trims the C heap after checkpoints, shut down cleanly on SIGINT/SIGTERM and exit 0) and
`add_node_command` (registers the `node` command group on the CLI's argparse subparsers;
`phalanx.cli` wires it). The allocator switch happens earlier, in `phalanx.cli.main`.

Exit codes: 0 after a clean shutdown; 2 for a configuration error; 1 when the node stopped on
an error (logged). Must not import the client library.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from phalanx.apps.gc_pacer import GcPacer
from phalanx.config import ConfigError, NodeConfig, load_node_config
from phalanx.node import Node, NodeError, open_node
from phalanx.process_tuning import TrimPolicy, trim_malloc, tune_malloc
from phalanx.protocols import BYZANTINE_MODES

logger = logging.getLogger(__name__)
TRIM_POLL_S = 1.0
"""How often the node looks whether a heap trim is due (a status read: microseconds)."""


async def _run(config: NodeConfig, byzantine: str | None, bootstrap: bool) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_node(config, byzantine=byzantine, gc_pacer=GcPacer(),
                             bootstrap=bootstrap) as node:
            print(f"phalanx node {node.id}: peers on {node.peer_address}, clients on "
                  f"{node.client_address}"
                  + (f", metrics on port {node.metrics_port}" if node.metrics_port else "")
                  + (f", BYZANTINE mode {byzantine}" if byzantine else ""),
                  flush=True)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_release_free_memory, node)
                async for signum in signals:
                    logger.info("%s: %s received, shutting down", node.id,
                                signal.Signals(signum).name)
                    break
                nursery.cancel_scope.cancel()


async def _release_free_memory(node: Node) -> None:
    """Trim the C heap after each checkpoint (`phalanx.process_tuning.TrimPolicy`)."""
    policy = TrimPolicy(now=trio.current_time())
    while True:
        await trio.sleep(TRIM_POLL_S)
        status = node.replica.status()
        if policy.due(now=trio.current_time(), checkpoints_written=status.checkpoints_written,
                      in_flight=status.checkpoint_in_flight is not None):
            await trio.to_thread.run_sync(trim_malloc)


def run_node(config_path: str | Path, *, byzantine: str | None = None,
             bootstrap: bool = False) -> int:
    """Run the node configured in `config_path` until SIGINT/SIGTERM; returns the exit code.

    `byzantine` (PBFT only; tests and demos): run the replica in that Byzantine mode.
    `bootstrap`: an empty data directory without IDENTITY is a new cluster's node
    (`phalanx.node.open_node`).
    The `phalanx node run` command has already put the process on the system allocator by
    then (`phalanx.cli.main`, `phalanx.process_tuning.use_system_malloc`); this function
    never re-executes its caller's process."""
    try:
        config = load_node_config(config_path)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if byzantine is not None and config.protocol != "pbft":
        print(f"error: --byzantine {byzantine} needs a PBFT cluster; {config_path} runs "
              f"{config.protocol}", file=sys.stderr)
        return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO,
                            format=f"%(asctime)s {config.id} %(levelname)s %(name)s: %(message)s")
    tune_malloc()
    try:
        trio.run(_run, config, byzantine, bootstrap)
    except NodeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception:
        logger.exception("%s: node stopped on an error", config.id)
        return 1
    return 0


def _handle_run(args: argparse.Namespace) -> int:
    return run_node(args.config, byzantine=args.byzantine, bootstrap=args.bootstrap)


def add_node_command(subparsers: Any) -> argparse.ArgumentParser:
    """Register `phalanx node run CONFIG` on an argparse subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "node", help="run a phalanx node", description="Run a phalanx node.")
    commands = parser.add_subparsers(dest="node_command", required=True)
    run = commands.add_parser(
        "run", help="run one node in the foreground (SIGINT/SIGTERM stop it cleanly)",
        description="Run the node configured in CONFIG (DIR/nodes/<id>.toml) in the "
        "foreground until SIGINT or SIGTERM. On glibc the node runs on the system allocator "
        "(it re-executes itself with PYTHONMALLOC=malloc, which keeps its memory close to its "
        "live data); set PYTHONMALLOC yourself to choose otherwise, e.g. "
        "PYTHONMALLOC=pymalloc.")
    run.add_argument("config", metavar="CONFIG", help="the node's TOML configuration file")
    run.add_argument("--byzantine", metavar="MODE", choices=BYZANTINE_MODES, default=None,
                     help="PBFT only, for tests and demos: run this replica in a Byzantine "
                     f"mode ({', '.join(BYZANTINE_MODES)})")
    run.add_argument("--bootstrap", action="store_true",
                     help="the data directory is empty because this is a NEW node of a NEW "
                     "cluster (cluster init marks new directories, so this is for clusters "
                     "laid out by hand). Without it an empty directory is treated as a lost "
                     "disk: the node recovers from its peers before it votes")
    run.set_defaults(handler=_handle_run)
    return parser


if __name__ == "__main__":
    sys.exit(run_node(sys.argv[1]) if len(sys.argv) == 2 else 2)
