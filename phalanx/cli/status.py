"""`phalanx status`: every node's view of the cluster, asked concurrently.

Owns: the command's argparse wiring and output (`add_status_command`), `query_status` (every
node's `StatusReply`) and `format_status_table`. Exit status: 0 when every node answered, 1
when some did not (their rows say ``unreachable``), 2 on usage errors; every error is one
line on stderr.

Start-up: the top level imports only argparse and light helpers; trio and the client are
imported by the functions that use them (`tests/test_packaging.py` holds this).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from phalanx.cli.cluster_arg import CLUSTER_ENV, add_cluster_option, open_cluster_arg
from phalanx.cli.errors import EXIT_USAGE

if TYPE_CHECKING:  # the handlers import these: building the parser must stay cheap
    from phalanx.net.client_protocol import StatusReply
    from phalanx.ops.node_config import ClusterConfig

STATUS_TIMEOUT = 1.5
_STATUS_EPILOG = f"""\
examples:
  phalanx status --cluster ./demo-cluster
  phalanx status --cluster ./demo-cluster --json | jq '.[] | select(.role=="leader")'

--json prints a list with one object per node: node, role, term, leader, commit_index,
applied_index, last_checkpoint, peers, connected_peers, dropped_messages, protocol,
client_auth (role "unreachable" and an "error" for a node that did not answer). A node
running with [client] auth = "none" (no client authentication) is named in a WARNING on
stderr, as is every certificate of DIR expiring within 30 days (`phalanx cert show`).
--cluster defaults to ${CLUSTER_ENV}. Exit status 0 if every node answered, else 1;
2 on a usage error (bad arguments, no cluster at DIR, a missing or invalid config or
credential file).
"""


def add_status_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``phalanx status`` on `subparsers`."""
    status = subparsers.add_parser(
        "status", help="show every node's role, term, commit and applied index",
        description="Ask every node of a cluster for its status.",
        epilog=_STATUS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_cluster_option(status)
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    # A status probe should not hang on a dead node for the full operation timeout.
    status.set_defaults(handler=_status_main, timeout=STATUS_TIMEOUT)




@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStatus:
    """One row of `phalanx status`: a node's reply, or why there is none."""

    node: str
    reply: StatusReply | None
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        r = self.reply
        if r is None:
            return {"node": self.node, "role": "unreachable", "term": None, "leader": None,
                    "commit_index": None, "applied_index": None, "last_checkpoint": None,
                    "peers": [], "connected_peers": [], "error": self.error}
        return {
            "node": self.node, "role": r.role, "term": r.term, "leader": r.leader,
            "commit_index": r.commit_index, "applied_index": r.applied_index,
            "last_checkpoint": r.last_checkpoint, "peers": list(r.peers),
            "connected_peers": list(r.connected_peers), "dropped_messages": r.dropped_messages,
            "protocol": r.protocol, "client_auth": r.client_auth,
        }


async def query_status(cluster: ClusterConfig, *, client_timeout: float) -> list[NodeStatus]:
    """Every node's status, asked concurrently, in cluster order (`client_timeout`: how long
    each node gets to answer)."""
    import trio

    from phalanx.client.async_client import ClientError, ClientTimeout, open_client

    rows: dict[str, NodeStatus] = {}
    async with open_client(cluster, timeout=client_timeout) as client:

        async def ask(node: str) -> None:
            try:
                rows[node] = NodeStatus(node=node, reply=await client.status(node))
            except ClientTimeout as e:
                why = f" ({e.last_error})" if e.last_error else ""
                rows[node] = NodeStatus(
                    node=node, reply=None, error=f"no answer within {client_timeout:g}s{why}"
                )
            except ClientError as e:
                rows[node] = NodeStatus(node=node, reply=None, error=str(e) or type(e).__name__)

        async with trio.open_nursery() as nursery:
            for n in cluster.nodes:
                nursery.start_soon(ask, n.id)
    return [rows[n.id] for n in cluster.nodes]


def format_status_table(rows: Sequence[NodeStatus]) -> str:
    """A fixed-width table, one line per node (what `phalanx status` prints)."""
    header = ("NODE", "ROLE", "TERM", "LEADER", "COMMIT", "APPLIED", "CHECKPOINT", "PEERS")
    lines: list[tuple[str, ...]] = [header]
    for row in rows:
        r = row.reply
        if r is None:
            lines.append((row.node, "unreachable", "-", "-", "-", "-", "-", row.error or ""))
            continue
        connected = set(r.connected_peers)
        peers = " ".join(p if p in connected else f"{p}(down)" for p in r.peers)
        lines.append((r.node, r.role, str(r.term), r.leader or "-", str(r.commit_index),
                      str(r.applied_index), str(r.last_checkpoint), peers))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)) + "  " + line[-1]
        for line in lines
    ).rstrip() + "\n"


def _status_main(args: argparse.Namespace) -> int:
    cluster = open_cluster_arg(args, "phalanx status")
    if cluster is None:
        return EXIT_USAGE
    import trio

    from phalanx.cli.cert_rotate import expiry_warnings

    for warning in expiry_warnings(cluster.directory):  # within 30 days: rotate them
        print(warning, file=sys.stderr)
    rows = trio.run(lambda: query_status(cluster, client_timeout=args.timeout))
    insecure = [r.node for r in rows if r.reply is not None and r.reply.client_auth == "none"]
    if insecure:
        print(f"WARNING: INSECURE: {', '.join(insecure)} run with [client] auth = \"none\": "
              "their client ports accept anyone, with full read and write access",
              file=sys.stderr)
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
    else:
        sys.stdout.write(format_status_table(rows))
    return 0 if all(r.reply is not None for r in rows) else 1
