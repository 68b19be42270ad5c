"""`phalanx cluster init`, `up`, `client-key` and `link`: their command line.

Owns: `add_cluster_command` and the handlers of init, up and client-key. The work is
`phalanx.ops.local_cluster` (`init_cluster`, `add_client_key`, `NodeProcesses`,
`supervise`); this module only parses and reports, and
imports nothing heavier than the registry (PKI and keys load when `init` runs).
"""

from __future__ import annotations

import argparse
import sys

from phalanx.appspec import DEFAULT_APP
from phalanx.appspec import names as app_names
from phalanx.appspec import specs as app_specs
from phalanx.cli.errors import EXIT_USAGE, int_between, non_negative_float, print_error
from phalanx.ops.local_cluster import (
    DEFAULT_BASE_PORT,
    DEFAULT_GRACE,
    DEFAULT_HOST,
    MAX_NODES,
    ClusterError,
    NodeProcesses,
    add_client_key,
    ephemeral_overlap_warning,
    fault_tolerance_warning,
    init_cluster,
    open_cluster,
    supervise,
)
from phalanx.ops.node_config import ConfigError, check_files, load_node_config
from phalanx.protocols import DEFAULT_PROTOCOL
from phalanx.protocols import names as protocol_names
from phalanx.protocols import specs as protocol_specs
from phalanx.services import names as service_names
from phalanx.services import specs as service_specs

_INIT_EPILOG = """\
examples:
  phalanx cluster init ./demo-cluster
  phalanx cluster init ./c5 --nodes 5 --base-port 9000
  phalanx cluster init ./chain --app chain --protocol pbft --nodes 4
  phalanx cluster init ./g5 --nodes 5 --service gossip

Writes DIR/cluster.toml, DIR/nodes/<id>.toml (+ certificate and key), DIR/ca/,
DIR/clients/{admin,client,reader}.pem/.key (client certificates with the roles admin,
read-write and read-only; cluster.toml and `phalanx kv` use client.pem; issue more with
`phalanx cert issue-client`), DIR/data/<id>/, DIR/logs/ and DIR/run/. Node i (0-based)
listens for peers on BASE+i, for clients on BASE+100+i, and serves Prometheus metrics
on BASE+200+i. DIR must not exist or be empty.

A protocol whose clients sign their transactions (leaderless) also gets a client signing
key DIR/clients/client.signing.key (mode 0600; cluster.toml names it, so `phalanx kv
--cluster DIR` signs with it) and every node config gets the public keyring
[keys.clients]. Make more keys with `phalanx cluster client-key DIR NAME`.

--app chain also writes DIR/chain/genesis.bin (the minter and the opening balances) and
DIR/chain/keys/{minter,a1..a5}.key (account keys, mode 0600; a1..a5 hold 1,000,000 each);
every config names the genesis in [app]. Use it with `phalanx chain --cluster DIR`.
It also enables the block-certifier service (a [block-certifier] table, a signing key per
node, every node's signing_public_key in cluster.toml): nodes sign each block and store
quorum certificates a light client checks (docs/CHAIN.md); set enabled = false to stop it.

--service gossip adds a [gossip] table to every node config (docs/GOSSIP.md) and, as the
service signs its rumors, a signing key per node (DIR/nodes/<id>.signing.key) whatever the
protocol. Use it with `phalanx gossip --cluster DIR`.

Refuses a layout with a port some process already listens on; warns (and creates the
cluster) when the size tolerates no fault: 2 Raft nodes, 3 PBFT replicas.

exit status: 0 created; 2 usage error (bad arguments, DIR not empty or not creatable, a
port in use): nothing was created.
"""

_UP_EPILOG = """\
examples:
  phalanx cluster up ./demo-cluster
  phalanx cluster up ./demo-cluster --node n1 --node n2
  phalanx cluster up ./demo-cluster --node n2      # restart n2 after it died or was killed

Runs every node (`phalanx node run DIR/nodes/<id>.toml`) as a subprocess, logging to
DIR/logs/<id>.log, with its pid in DIR/run/<id>.pid. Ctrl-C (or SIGTERM) stops them:
SIGTERM to each node, then SIGKILL after --grace seconds. A node that dies is reported
and not restarted (restart it with a second `cluster up DIR --node ID`, in another
terminal); `up` exits when all its nodes have exited.

A node whose pid file names a live process is already running: `up` refuses to start
any node then (two processes of one node would fight over its data directory), and it
never deletes a pid file it did not write.

exit status: 0 every node stopped cleanly on request; 1 a node failed or stopped on an
error; 2 usage error (no cluster at DIR, an unknown --node, a node already running, a
node config that does not load, a missing certificate or key file): no node was started.
"""

_LINK_EPILOG = """\
examples:
  phalanx cluster init ./shard-a --protocol raft --nodes 3 --service clustersend
  phalanx cluster init ./shard-b --protocol pbft --nodes 4 --base-port 7500 \\
      --service clustersend
  phalanx cluster link ./shard-a ./shard-b

A cluster's id is the fingerprint of its CA (the one its nodes record in their data
directories); qualified node ids name another cluster's nodes: n1@<cluster id>.
Linking again replaces the old link (after addresses or keys changed).

exit status: 0 linked; 2 usage error (not a cluster directory, the same cluster twice,
a node without a signing key): nothing was changed.
"""

_ADD_NODE_EPILOG = """\
examples:
  phalanx cluster add-node ./c            # n4 in a cluster of n1..n3
  phalanx cluster add-node ./c --id spare

Raft only (PBFT's membership is static). The new node's config says `joined = true`: it
starts as a learner and waits for the leader; `phalanx member add` makes it one.

exit status: 0 created; 2 usage error (no cluster at DIR, a protocol with static
membership, an id in use, no CA key in DIR/ca, a port in use): nothing was changed.
"""

_CLIENT_KEY_EPILOG = """\
examples:
  phalanx cluster client-key ./lcluster alice
  phalanx kv --cluster ./lcluster --client-name alice add counter 1

exit status: 0 created; 2 usage error (no cluster at DIR, a protocol whose clients do not
sign, a bad or existing NAME): nothing was changed.
"""


def add_cluster_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``phalanx cluster init``, ``up``, ``client-key`` and ``link``."""
    cluster = subparsers.add_parser(
        "cluster", help="create and run a local cluster",
        description="Create a cluster directory and run its nodes on this machine.",
    )
    sub = cluster.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND", required=True)
    init = sub.add_parser(
        "init", help="create a cluster directory: CA, certificates, node configs",
        description="Create a cluster directory: a CA, node and client certificates and "
                    "one TOML config per node.",
        epilog=_INIT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    init.add_argument("directory", metavar="DIR", help="the cluster directory to create")
    init.add_argument("--protocol", choices=protocol_names(), default=DEFAULT_PROTOCOL,
                      help="consensus protocol (default: %(default)s; "
                      + "; ".join(f"{s.name}: {s.summary}" for s in protocol_specs()) + ")")
    init.add_argument("--app", default=DEFAULT_APP, metavar="APP",
                      help="replicated application: " + ", ".join(app_names())
                      + " (default: %(default)s; "
                      + "; ".join(f"{a.name}: {a.summary}" for a in app_specs())
                      + "), or your own state machine as MODULE:FACTORY or FILE.py:FACTORY "
                      "(docs/STATE_MACHINES.md)")
    init.add_argument("--nodes", type=int_between(1, MAX_NODES), default=3,
                      help=f"number of nodes, 1..{MAX_NODES} (default: 3)")
    init.add_argument("--base-port", type=int_between(1, 65535), default=DEFAULT_BASE_PORT,
                      metavar="P",
                      help="first port of the layout (default: %(default)s)")
    init.add_argument("--host", default=DEFAULT_HOST,
                      help="address every node listens on (default: %(default)s)")
    init.add_argument("--fsync", choices=("every-write", "group", "off"), default="group",
                      help="durability mode of the nodes (default: %(default)s)")
    init.add_argument("--service", action="append", choices=service_names(), default=[],
                      metavar="NAME", dest="services",
                      help="run node service NAME on every node (repeatable; off by default; "
                      + "; ".join(f"{s.name}: {s.summary}" for s in service_specs())
                      + "): writes its [NAME] table with every option at its default")
    init.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                      dest="options",
                      help="an option of the protocol's core, written to every node config's "
                      "[protocol] table (repeatable), e.g. --protocol leaderless --option "
                      "stuck_resolution=pbft (order stuck transactions through PBFT: "
                      "docs/LEADERLESS.md)")
    init.set_defaults(handler=_run_init)
    up = sub.add_parser(
        "up", help="run every node of a cluster directory until Ctrl-C",
        description="Run the nodes of a cluster directory as subprocesses.",
        epilog=_UP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument("directory", metavar="DIR", help="a directory made by `phalanx cluster init`")
    up.add_argument("--node", action="append", metavar="ID", dest="nodes",
                    help="run only this node (repeatable; default: all): restarts a node "
                    "that is down while the others keep running")
    up.add_argument("--grace", type=non_negative_float, default=DEFAULT_GRACE,
                    metavar="SECONDS",
                    help="time between SIGTERM and SIGKILL on stop (default: %(default)s)")
    up.set_defaults(handler=_run_up)
    key = sub.add_parser(
        "client-key", help="add a client signing key (protocols whose clients sign)",
        description="Create DIR/clients/NAME.signing.key (mode 0600) and add its public key "
                    "to the keyring [keys.clients] of every node config. Nodes read their "
                    "config at start-up: restart them to accept the new key.",
        epilog=_CLIENT_KEY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    key.add_argument("directory", metavar="DIR", help="a directory made by `phalanx cluster init`")
    key.add_argument("name", metavar="NAME", help="the key's name (letters, digits, _ and -)")
    key.set_defaults(handler=_run_client_key)
    add = sub.add_parser(
        "add-node", help="lay out one more node of a Raft cluster (then: member add)",
        description="Create the next node's certificate, data directory and config "
                    "(DIR/nodes/<id>.toml, in the init port layout) and add it as a peer to "
                    "every node config and to cluster.toml. Running nodes read their config "
                    "at start-up: restart each one once so it links to the new node, start "
                    "the new node, then add it with `phalanx member add`.",
        epilog=_ADD_NODE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add.add_argument("directory", metavar="DIR", help="a directory made by `phalanx cluster init`")
    add.add_argument("--id", dest="node_id", metavar="ID", default=None,
                     help="the new node's id (default: the next free n<k>)")
    add.set_defaults(handler=_run_add_node)
    link = sub.add_parser(
        "link", help="let two clusters cluster-send to each other (public material only)",
        description="Copy each cluster's PUBLIC material (its CA certificate, its nodes' "
                    "addresses and signing public keys, its protocol's fault model, n and f) "
                    "into the other's DIR/links/<cluster id>.toml. A node of a linked "
                    "cluster is then accepted on the inter-cluster path only (cluster-"
                    "sending messages), never as a member; restart the nodes to pick it up.",
        epilog=_LINK_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    link.add_argument("first", metavar="DIR_A", help="a directory made by `phalanx cluster init`")
    link.add_argument("second", metavar="DIR_B", help="another one (a different CA)")
    link.set_defaults(handler=_run_link)


def _run_init(args: argparse.Namespace) -> int:
    try:
        options: dict[str, str] = {}
        for item in args.options:
            name, sep, value = item.partition("=")
            if not sep or not name or not value:
                raise ClusterError(f"--option {item}: expected NAME=VALUE, e.g. "
                                   "--option stuck_resolution=pbft")
            options[name] = value
        cluster = init_cluster(
            args.directory, protocol=args.protocol, nodes=args.nodes,
            base_port=args.base_port, host=args.host, fsync=args.fsync,
            app=_app_reference(args.app),
            services=tuple(args.services),
            protocol_options=options, refuse_busy_ports=True,
        )
    except ClusterError as e:
        print_error("phalanx cluster init", str(e))
        return EXIT_USAGE
    print(f"created {args.protocol} cluster of {len(cluster.nodes)} nodes running the "
          f"{cluster.app} app in {args.directory}")
    for warning in (ephemeral_overlap_warning(args.base_port, args.nodes),
                    fault_tolerance_warning(args.protocol, args.nodes)):
        if warning is not None:
            print(warning, file=sys.stderr)
    for n in cluster.nodes:
        print(f"  {n.id}: peers {n.peer_addr}, clients {n.client_addr}")
    if cluster.client_signing_key is not None:
        print(f"  client signing key: {cluster.client_signing_key}")
    for key, path in sorted(cluster.app_files.items()):
        print(f"  app {key}: {path}")
    for name in sorted(set(args.services)):
        print(f"  service {name}: [{name}] in every node config")
    print(f"start it with: phalanx cluster up {args.directory}")
    return 0


def _run_link(args: argparse.Namespace) -> int:
    from pathlib import Path

    from phalanx.ops.link import LinkError, link_clusters

    try:
        a, b = link_clusters(Path(args.first), Path(args.second))
    except LinkError as e:
        print_error("phalanx cluster link", str(e))
        return EXIT_USAGE
    for here, there in ((args.first, b), (args.second, a)):
        print(f"{here}: linked cluster {there.cluster_id} ({there.name}, {there.protocol}, "
              f"n={there.n}, f={there.f}) -> {here}/links/{there.cluster_id}.toml")
    print("restart the nodes of both clusters to pick the links up")
    return 0


def _run_add_node(args: argparse.Namespace) -> int:
    from phalanx.ops.add_node import add_node

    try:
        config = add_node(args.directory, args.node_id)
    except ClusterError as e:
        print_error("phalanx cluster add-node", str(e))
        return EXIT_USAGE
    d = args.directory
    print(f"added node {config.id}: peers {config.peer_listen}, clients "
          f"{config.client_listen}, config {d}/nodes/{config.id}.toml")
    print("next (the running nodes link to it when it is added; no restart):")
    print(f"  phalanx cluster up {d} --node {config.id}")
    print(f"  phalanx member add {config.id} --cluster {d}")
    print(f"  phalanx member promote {config.id} --cluster {d}   # once it has caught up")
    return 0


def _run_client_key(args: argparse.Namespace) -> int:
    try:
        path = add_client_key(args.directory, args.name)
    except ClusterError as e:
        print_error("phalanx cluster client-key", str(e))
        return EXIT_USAGE
    print(f"created client signing key {path}; added {args.name!r} to every node config")
    print("running nodes accept it after a restart (they read their config at start-up)")
    return 0


def _run_up(args: argparse.Namespace) -> int:
    try:
        cluster = open_cluster(args.directory)
        wanted = args.nodes or [n.id for n in cluster.nodes]
        unknown = [n for n in wanted if n not in {m.id for m in cluster.nodes}]
        if unknown:
            raise ClusterError(f"no node {unknown[0]!r} in {args.directory} (its nodes: "
                               f"{', '.join(m.id for m in cluster.nodes)})")
        for node_id in wanted:  # every config and credential file, before starting any
            check_files(load_node_config(cluster.node_config_path(node_id)))
        procs = NodeProcesses(cluster)
        live = procs.live_elsewhere(wanted)
        if live:
            running = procs.live_elsewhere()
            others = [n.id for n in cluster.nodes if n.id not in running]
            hint = (f"; start only the others with {' '.join(f'--node {n}' for n in others)}"
                    if others else "")
            raise ClusterError(
                "already running: " + ", ".join(f"{n} (pid {pid})" for n, pid in live.items())
                + f"; stop a node first to restart it (kill PID){hint}")
        return supervise(procs, wanted, grace=args.grace)
    except (ClusterError, ConfigError) as e:
        print_error("phalanx cluster up", str(e))
        return EXIT_USAGE


def _app_reference(app: str) -> str:
    """`--app` as the node configs store it: a custom app's file path made absolute."""
    from phalanx.appspec.custom import absolute, is_custom

    return absolute(app) if is_custom(app) else app
