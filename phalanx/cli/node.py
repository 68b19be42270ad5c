"""`phalanx node run CONFIG`: run one node in the foreground until SIGINT or SIGTERM.

Owns: `run_node` (load the config, tune malloc, run `phalanx.runtime.node.open_node` with a task
that
trims the C heap after checkpoints, shut down cleanly on SIGINT/SIGTERM and exit 0) and
`add_node_command` (registers the `node` command group on the CLI's argparse subparsers;
`phalanx.cli.main` wires it). The allocator switch happens earlier, in `phalanx.cli.main.main`.

Exit codes: 0 after a clean shutdown; 2 for an operator's mistake, one line on stderr (a
missing, unreadable or invalid config; a missing certificate, key or PBFT key file, checked
before storage is opened; an address it cannot listen on: in use, not local, not resolvable;
TLS credentials that do not load); 1 when the node stopped on another error (logged with its
traceback). Must not import the client library.

Start-up: trio and the runtime are imported by `run_node`, not at the top, so building the
`node` parser (every `phalanx` command that is not `node run`) does not load them.
"""

from __future__ import annotations

import argparse
import errno
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phalanx.cli.errors import EXIT_USAGE, print_error
from phalanx.ops.node_config import Address, ConfigError, NodeConfig, check_files, load_node_config
from phalanx.protocols import UnknownProtocol, byzantine_mode_problem, specs
from phalanx.protocols import get as get_protocol

if TYPE_CHECKING:
    import logging

    from phalanx.runtime.node import Node


def _logger() -> logging.Logger:
    import logging  # (`node run` only: `node --help` skips it, as it skips ssl and socket)

    return logging.getLogger(__name__)


TRIM_POLL_S = 1.0
"""How often the node looks whether a heap trim is due (a status read: microseconds)."""


async def _run(config: NodeConfig, byzantine: str | None, bootstrap: bool) -> None:
    import trio

    from phalanx.apps.gc_pacer import GcPacer
    from phalanx.runtime.node import open_node

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
                    _logger().info("%s: %s received, shutting down", node.id,
                                signal.Signals(signum).name)
                    break
                nursery.cancel_scope.cancel()


async def _release_free_memory(node: Node) -> None:
    """Trim the C heap after each checkpoint (`phalanx.runtime.process_tuning.TrimPolicy`)."""
    import trio

    from phalanx.runtime.process_tuning import TrimPolicy, trim_malloc

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

    `byzantine` (a protocol's Byzantine mode; tests and demos): run the replica in that
    Byzantine mode.
    `bootstrap`: an empty data directory without IDENTITY is a new cluster's node
    (`phalanx.runtime.node.open_node`).
    The `phalanx node run` command has already put the process on the system allocator by
    then (`phalanx.cli.main.main`, `phalanx.runtime.process_tuning.use_system_malloc`); this
    function
    never re-executes its caller's process."""
    import logging

    import trio

    from phalanx.runtime.node import NodeError
    from phalanx.runtime.process_tuning import tune_malloc
    from phalanx.storage.lock import probe_data_dir

    try:
        config = load_node_config(config_path)
        check_files(config)
    except ConfigError as exc:
        print_error(_PROG, str(exc))
        return EXIT_USAGE
    held = probe_data_dir(str(config.data_dir))  # a live node here: name it, first
    if held is not None:
        print_error(_PROG, f"{config.id}: {held}")
        return EXIT_USAGE
    problem = _unlistenable(config)  # before the storage is opened (a race is caught below)
    if problem is not None:
        print_error(_PROG, problem)
        return EXIT_USAGE
    try:
        spec = get_protocol(config.protocol)
    except UnknownProtocol as exc:
        print_error(_PROG, f"{config_path}: {exc}")
        return EXIT_USAGE
    problem = None if byzantine is None else byzantine_mode_problem(spec, byzantine)
    if problem is not None:
        print_error(_PROG, f"--byzantine {byzantine}: {problem}; {config_path} runs "
                    f"{config.protocol}")
        return EXIT_USAGE
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO,
                            format=f"%(asctime)s {config.id} %(levelname)s %(name)s: %(message)s")
    tune_malloc()
    try:
        trio.run(_run, config, byzantine, bootstrap)
    except (NodeError, ConfigError) as exc:
        print_error(_PROG, str(exc))
        return EXIT_USAGE
    except Exception as exc:
        problem = _operator_problem(exc, config)
        if problem is not None:
            print_error(_PROG, problem)
            return EXIT_USAGE
        _logger().exception("%s: node stopped on an error", config.id)
        return 1
    return 0


_PROG = "phalanx node run"
_LISTEN_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def _operator_problem(exc: BaseException, config: NodeConfig) -> str | None:
    """One line for a start-up failure the operator can fix (a listen address in use, not
    on this machine or not resolvable; TLS credentials that do not load), else None."""
    import socket
    import ssl

    leaves = _leaves(exc)
    if len(leaves) != 1:
        return None
    leaf = leaves[0]
    where = config.source or config.id
    if isinstance(leaf, ssl.SSLError):
        return (f"{where}: the TLS credentials do not load ({leaf}); check tls.ca "
                f"{config.tls.ca}, tls.cert {config.tls.cert}, tls.key {config.tls.key}")
    if isinstance(leaf, socket.gaierror) or (
            isinstance(leaf, OSError) and leaf.errno in _LISTEN_ERRNOS):
        # (Which address is not knowable here: the listeners already bound are still open.)
        addresses = ", ".join(f"node.{k} {a}" for k, a in _listen_addresses(config))
        return f"{where}: cannot listen ({leaf.strerror or leaf}); check {addresses}"
    return None


def _unlistenable(config: NodeConfig) -> str | None:
    """Why the node could not listen on one of its addresses (in use, not on this machine,
    not resolvable), or None: checked before start-up, so the error names the key."""
    for key, address in _listen_addresses(config):
        reason = _cannot_bind(address)
        if reason is not None:
            return f"{config.source or config.id}: cannot listen on node.{key} {address}: {reason}"
    return None


def _listen_addresses(config: NodeConfig) -> list[tuple[str, Address]]:
    pairs = [("peer_listen", config.peer_listen), ("client_listen", config.client_listen)]
    if config.metrics_listen is not None:
        pairs.append(("metrics_listen", config.metrics_listen))
    return pairs


def _cannot_bind(address: Address) -> str | None:
    """Why `address` cannot be bound now (None if it can), with SO_REUSEADDR as the node's
    listeners have (so a port in TIME_WAIT after a restart is not mistaken for in use)."""
    import socket

    try:
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return f"cannot resolve {address.host!r} ({e.strerror})"
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(sockaddr)
            except OSError as e:
                hint = "; is another node running?" if e.errno == errno.EADDRINUSE else ""
                return f"{e.strerror}{hint}"
    return None


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
    modes = {mode: s.name for s in specs() for mode in s.byzantine_modes}
    run.add_argument("--byzantine", metavar="MODE", choices=tuple(modes), default=None,
                     help="for tests and demos, on a protocol that tolerates Byzantine "
                     f"replicas ({', '.join(sorted(set(modes.values())))}): run this replica "
                     f"in a Byzantine mode ({', '.join(modes)})")
    run.add_argument("--bootstrap", action="store_true",
                     help="the data directory is empty because this is a NEW node of a NEW "
                     "cluster (cluster init marks new directories, so this is for clusters "
                     "laid out by hand). Without it an empty directory is treated as a lost "
                     "disk: the node recovers from its peers before it votes")
    run.set_defaults(handler=_handle_run)
    return parser


if __name__ == "__main__":
    sys.exit(run_node(sys.argv[1]) if len(sys.argv) == 2 else EXIT_USAGE)
