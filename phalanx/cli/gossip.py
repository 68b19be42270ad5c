"""`phalanx gossip`: publish rumors on a running cluster's gossip service and watch them
spread (the service: `phalanx.services.gossip_node`; docs/GOSSIP.md).

Owns: `add_gossip_command`, `query_gossip` (every node's `GossipStatus`, concurrently) and
`format_gossip_status`. Both subcommands speak `ServiceCall` on the nodes' client ports
(`phalanx.client.service_calls`), authenticated like `phalanx kv`: publishing needs the
read-write role, status read-only.

Exit status: publish 0 published, 3 refused (no gossip service on that node, payload too
large), 6 forbidden, 4 no answer (it may or may not have been published), 2 usage;
status 0 every node answered, 1 otherwise, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from phalanx.cli.cluster_arg import add_cluster_option, open_cluster_arg
from phalanx.cli.errors import (
    EXIT_FORBIDDEN,
    EXIT_INDETERMINATE,
    EXIT_NEGATIVE,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    int_between,
    print_error,
    utf8_text,
)

if TYPE_CHECKING:
    from phalanx.client.errors import ClientError
    from phalanx.ops.node_config import ClusterConfig
    from phalanx.services.gossip_api import GossipStatus

SERVICE: Final = "gossip"

_EPILOG = """\
examples:
  phalanx cluster init ./g5 --nodes 5 --service gossip && phalanx cluster up ./g5 &
  phalanx gossip publish --cluster ./g5 "hello everyone"
  phalanx gossip publish --cluster ./g5 --node n3 "from n3"
  phalanx gossip status --cluster ./g5
  phalanx gossip status --cluster ./g5 --json | jq '.[] | .members'

publish signs TEXT as a rumor of --node (default: the first node) and returns at once; the
rumor reaches every live node within a few gossip ticks. status shows, per node, its
incarnation, the rumors it published or delivered (with the wall-clock time) and its SWIM
view of the others (ALIVE, SUSPECT, DEAD).
"""


def add_gossip_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``phalanx gossip publish|status`` on `subparsers`."""
    p = subparsers.add_parser(
        "gossip", help="publish rumors and watch the gossip service of a running cluster",
        description="Publish rumors through a cluster's gossip service and show what every "
                    "node delivered and how it sees the others (`cluster init --service "
                    "gossip`).",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="gossip_command", metavar="SUBCOMMAND", required=True)
    publish = sub.add_parser("publish", help="publish TEXT as a rumor from one node",
                             epilog=_EPILOG,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster_option(publish)
    publish.add_argument("--node", metavar="ID", default=None,
                         help="the node that signs and spreads it (default: the first node)")
    publish.add_argument("text", metavar="TEXT", type=utf8_text("rumor"),
                         help="the rumor's payload")
    status = sub.add_parser("status", help="every node's deliveries and membership view",
                            epilog=_EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster_option(status)
    status.add_argument("--rumors", type=int_between(0, 1000), default=20, metavar="N",
                        help="show each node's N newest rumors (default: %(default)s)")
    status.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(handler=_main)


def _main(args: argparse.Namespace) -> int:
    prog = f"phalanx gossip {args.gossip_command}"
    cluster = open_cluster_arg(args, prog)
    if cluster is None:
        return EXIT_USAGE
    import trio

    if args.gossip_command == "publish":
        return trio.run(_publish, args, cluster, prog)
    rows = trio.run(lambda: query_gossip(cluster, rumors=args.rumors, seconds=args.timeout))
    if args.json:
        print(json.dumps({node: _as_json(row) for node, row in rows.items()}, indent=2))
    else:
        sys.stdout.write(format_gossip_status(rows))
    return EXIT_OK if all(not isinstance(r, Exception) for r in rows.values()) \
        else EXIT_NEGATIVE


async def _publish(args: argparse.Namespace, cluster: ClusterConfig, prog: str) -> int:
    from phalanx.client.errors import ClientTimeout, Forbidden, RequestRejected
    from phalanx.client.service_calls import call_service
    from phalanx.services.gossip_api import GossipPublish, GossipPublished

    node = args.node or cluster.nodes[0].id
    if node not in {n.id for n in cluster.nodes}:
        print_error(prog, f"no node {node!r} in {cluster.directory} (nodes: "
                    f"{', '.join(n.id for n in cluster.nodes)})")
        return EXIT_USAGE
    try:
        reply = await call_service(cluster, node, SERVICE,
                                   GossipPublish(payload=args.text.encode()),
                                   seconds=args.timeout)
    except Forbidden as e:
        print(f"{prog}: forbidden: {e}", file=sys.stderr)
        return EXIT_FORBIDDEN
    except RequestRejected as e:
        print(f"{prog}: refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except ClientTimeout as e:
        print(f"{prog}: no answer, it may or may not have been published: {e} (is {node} "
              "up? pick another with --node)", file=sys.stderr)
        return EXIT_INDETERMINATE
    assert isinstance(reply, GossipPublished)  # the service's answer to a publish
    print(f"published {reply.origin}/{reply.incarnation}/{reply.seq}")
    return EXIT_OK


async def query_gossip(cluster: ClusterConfig, *, rumors: int = 20, seconds: float = 5.0
                       ) -> Mapping[str, GossipStatus | ClientError]:
    """Every node's `GossipStatus` (or why there is none), in cluster order."""
    from phalanx.client.errors import ProtocolViolation
    from phalanx.client.service_calls import call_every_node
    from phalanx.services.gossip_api import GossipStatus, GossipStatusCall

    replies = await call_every_node(cluster, SERVICE, GossipStatusCall(max_rumors=rumors),
                                    seconds=seconds)
    out: dict[str, GossipStatus | ClientError] = {}
    for node, reply in replies.items():
        out[node] = reply if isinstance(reply, GossipStatus | Exception) else \
            ProtocolViolation(f"{node}: answered {type(reply).__name__}")
    return out


def _text(payload: bytes, limit: int = 40) -> str:
    text = payload.decode("utf-8", "replace")
    return json.dumps(text if len(text) <= limit else text[:limit - 1] + "…",
                      ensure_ascii=False)


def format_gossip_status(rows: Mapping[str, GossipStatus | Exception]) -> str:
    """Two tables: per node (incarnation, rumors held, view of the others), then per rumor
    which nodes have it."""
    lines = [f"{'node':<6} {'incarnation':>14} {'rumors':>6}  view of the others"]
    holders: dict[tuple[str, int, int], list[str]] = {}
    payloads: dict[tuple[str, int, int], bytes] = {}
    for node, row in rows.items():
        if isinstance(row, Exception):
            lines.append(f"{node:<6} {'-':>14} {'-':>6}  no answer: {row}")
            continue
        view = ", ".join(f"{m.node} {m.status if m.status != 'ALIVE' else 'alive'}"
                         for m in row.members)
        lines.append(f"{node:<6} {row.incarnation:>14} {len(row.deliveries):>6}  {view}")
        for d in row.deliveries:
            key = (d.origin, d.incarnation, d.seq)
            holders.setdefault(key, []).append(node)
            payloads[key] = d.payload
    if holders:
        lines += ["", "rumor (origin/incarnation/seq)       payload"
                  + " " * 36 + "held by"]
        for key in sorted(holders, key=lambda k: (k[1], k[0], k[2])):
            rid = "/".join(map(str, key))
            lines.append(f"{rid:<36} {_text(payloads[key]):<42} "
                         f"{' '.join(holders[key])}")
    return "\n".join(lines) + "\n"


def _as_json(row: GossipStatus | Exception) -> object:
    if isinstance(row, Exception):
        return {"error": str(row)}
    return {"incarnation": row.incarnation, "started_incarnation": row.started_incarnation,
            "members": {m.node: [m.status, m.incarnation] for m in row.members},
            "rumors": [{"origin": d.origin, "incarnation": d.incarnation, "seq": d.seq,
                        "payload": d.payload.decode("utf-8", "replace"), "unix_ms": d.unix_ms}
                       for d in row.deliveries],
            "counters": dict(row.counters)}


__all__: Sequence[str] = ("add_gossip_command", "format_gossip_status", "query_gossip")
