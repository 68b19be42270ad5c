"""`phalanx announce status`: what every node of a running cluster announces to its linked
clusters and the highest verified checkpoint it holds from each (the service:
`phalanx.services.announce_node`; docs/GOSSIP.md "Between clusters").

Owns: `add_announce_command`, `query_announce` (every node's `AnnounceStatus`,
concurrently, over `ServiceCall` on the client ports, read-only role) and
`format_announce_status`.

Exit status: 0 every node answered, 1 otherwise, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from phalanx.cli.cluster_arg import add_cluster_option, open_cluster_arg
from phalanx.cli.errors import EXIT_NEGATIVE, EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from phalanx.client.errors import ClientError
    from phalanx.ops.node_config import ClusterConfig
    from phalanx.services.announce_api import AnnounceStatus

SERVICE: Final = "announce"

_EPILOG = """\
examples:
  phalanx cluster init ./a --protocol pbft --nodes 4 --service announce
  phalanx cluster init ./b --protocol pbft --nodes 4 --base-port 7500 --service announce
  phalanx cluster link ./a ./b && (phalanx cluster up ./a & phalanx cluster up ./b &)
  phalanx announce status --cluster ./b
  phalanx announce status --cluster ./b --json | jq '.n1.received'

Per node: the newest checkpoint index it signed, the certified checkpoint it announces to
each linked cluster, and the highest certified checkpoint it verified from each (index,
the state digest's first 16 hex digits, when it arrived).
"""


def add_announce_command(
        subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``phalanx announce status`` on `subparsers`."""
    p = subparsers.add_parser(
        "announce", help="show the checkpoints clusters announce to each other",
        description="Show what the announce service of every node of a running cluster "
                    "announces to linked clusters and holds from them (`cluster init "
                    "--service announce`, `cluster link`).",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="announce_command", metavar="SUBCOMMAND", required=True)
    status = sub.add_parser("status", help="every node's announced and received checkpoints",
                            epilog=_EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster_option(status)
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=_main)


def _main(args: argparse.Namespace) -> int:
    cluster = open_cluster_arg(args, f"phalanx announce {args.announce_command}")
    if cluster is None:
        return EXIT_USAGE
    import trio

    rows = trio.run(lambda: query_announce(cluster, seconds=args.timeout))
    if args.json:
        print(json.dumps({node: _as_json(row) for node, row in rows.items()}, indent=2))
    else:
        sys.stdout.write(format_announce_status(rows))
    return EXIT_OK if all(not isinstance(r, Exception) for r in rows.values()) \
        else EXIT_NEGATIVE


async def query_announce(cluster: ClusterConfig, *, seconds: float = 5.0
                         ) -> Mapping[str, AnnounceStatus | ClientError]:
    """Every node's `AnnounceStatus` (or why there is none), in cluster order."""
    from phalanx.client.errors import ProtocolViolation
    from phalanx.client.service_calls import call_every_node
    from phalanx.services.announce_api import AnnounceStatus, AnnounceStatusCall

    replies = await call_every_node(cluster, SERVICE, AnnounceStatusCall(), seconds=seconds)
    out: dict[str, AnnounceStatus | ClientError] = {}
    for node, reply in replies.items():
        out[node] = reply if isinstance(reply, AnnounceStatus | Exception) else \
            ProtocolViolation(f"{node}: answered {type(reply).__name__}")
    return out


def format_announce_status(rows: Mapping[str, AnnounceStatus | Exception]) -> str:
    """One line per node and linked cluster: what it announces there, what it holds."""
    lines = [f"{'node':<6} {'signed':>8}  {'linked cluster':<34} {'announces':>10} "
             f"{'holds':>10}  state digest"]
    for node, row in rows.items():
        if isinstance(row, Exception):
            lines.append(f"{node:<6} {'-':>8}  no answer: {row}")
            continue
        out = {c.cluster: c for c in row.certified}
        got = {c.cluster: c for c in row.received}
        for cluster in sorted(out.keys() | got.keys()) or ["-"]:
            o, g = out.get(cluster), got.get(cluster)
            lines.append(f"{node:<6} {row.signed_index:>8}  {cluster:<34} "
                         f"{o.index if o else '-':>10} {g.index if g else '-':>10}  "
                         f"{g.state_digest.hex()[:16] if g else '-'}")
    return "\n".join(lines) + "\n"


def _as_json(row: AnnounceStatus | Exception) -> object:
    if isinstance(row, Exception):
        return {"error": str(row)}
    return {"cluster": row.cluster, "signed_index": row.signed_index,
            "certified": {c.cluster: {"index": c.index, "state_digest": c.state_digest.hex(),
                                      "unix_ms": c.unix_ms} for c in row.certified},
            "received": {c.cluster: {"index": c.index, "state_digest": c.state_digest.hex(),
                                     "unix_ms": c.unix_ms} for c in row.received},
            "counters": dict(row.counters)}


__all__: Sequence[str] = ("add_announce_command", "format_announce_status", "query_announce")
