"""`phalanx demo`'s command line: the parser and the dispatch to a protocol's demo.

Owns: `add_demo_command`. Light on purpose (argparse and the protocol registry only): the
demos themselves (`phalanx.demo.cluster_demo`, `.pbft`, `.leaderless`, `.local`) import
trio, rich and the client, and load only when one runs (`ProtocolSpec.demo`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from phalanx.appspec import DEFAULT_APP
from phalanx.appspec import get as app_spec
from phalanx.appspec import specs as app_specs
from phalanx.cli.errors import int_between
from phalanx.protocols import DEFAULT_PROTOCOL
from phalanx.protocols import get as protocol_spec
from phalanx.protocols import specs as protocol_specs
from phalanx.services import specs as service_specs

_DESCRIPTION = """\
Run a local 3-node Raft cluster (real processes, mutual TLS, fsynced storage in a temp dir)
under a KV workload; SIGKILL the leader mid-run and report the time to a new leader and to
the first acknowledged write; restart the killed node and report its recovery (checkpoint
+ log replay) and catch-up; check the recorded history for linearizability and that no
acknowledged write was lost; print a summary and clean up. Takes about 15 seconds.

exit status: 0 if the history is linearizable, nothing acknowledged was lost and the
restarted node caught up; 1 otherwise.

`phalanx demo --local [ARGS]` runs the single-process crash/recovery demo instead
(`phalanx demo --local --help` for its options).

`phalanx demo --app chain` runs the blockchain app instead (phalanx.demo.chain): PBFT, 4
replicas, one Byzantine and one SIGKILLed and restarted during signed transfers; then the
exported chain is validated and a light-client proof verified against the restarted
replica. Exit 0 = PASS.

`phalanx demo --scenario gossip` runs the gossip node service instead (phalanx.demo.gossip):
5 nodes, rumors published and timed to every node, 2 nodes SIGKILLed, rumors still reach
every live node, the dead are marked suspect then dead, one restarts, rejoins and catches up
by anti-entropy. PASS/FAIL per step; exit 0 = every step passed. About 20 seconds.

`phalanx demo --scenario cross-shard` runs cross-shard transfers instead
(phalanx.demo.cross_shard): a PBFT shard of 4 (one --byzantine) and a Raft shard of 3,
linked; --rounds transfers each way per phase, each debited in one shard and credited in
the other through a certified cluster-sent value; a SIGKILL and a restart; money conserved
and every credit applied once. PASS/FAIL per step. About 30 seconds.
"""



def add_demo_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``phalanx demo`` (and ``phalanx demo --local``) on `subparsers`."""
    parser = subparsers.add_parser(
        "demo", help="a 3-node cluster, a leader crash, and a linearizability check",
        description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demos = [s.name for s in protocol_specs() if s.demo is not None]
    parser.add_argument("--app", choices=[a.name for a in app_specs()], default=DEFAULT_APP,
                        help="the application: " + "; ".join(
                            f"{a.name}: {a.summary}" for a in app_specs())
                        + " (default %(default)s)")
    parser.add_argument("--protocol", choices=demos, default=None,
                        help="raft (3 nodes, leader kill), pbft (4 replicas, one Byzantine, "
                        "primary kill and view change; phalanx.demo.pbft) or leaderless (4 "
                        "endorsers, one Byzantine, a kill and restart, conflicting and "
                        "commuting transactions, convergence; phalanx.demo.leaderless); "
                        f"default {DEFAULT_PROTOCOL} (--app chain: pbft)")
    scenarios = [s for s in service_specs() if s.demo is not None]
    parser.add_argument("--scenario", choices=[s.scenario_name for s in scenarios],
                        default=None, help="a node service's demo instead: " + "; ".join(
                            f"{s.scenario_name}: {s.summary}" for s in scenarios)
                        + " (--protocol picks the nodes' protocol, default "
                        f"{DEFAULT_PROTOCOL})")
    parser.add_argument("--rounds", type=int_between(1, 1000), default=5, metavar="N",
                        help="--scenario: rumors (gossip) or transfers each way (cross-shard) "
                             "per phase (default: %(default)s)")
    parser.add_argument("--byzantine", default="equivocate", metavar="MODE",
                        help="pbft, leaderless: the Byzantine node's mode (default: "
                             "%(default)s)")
    parser.add_argument("--local", nargs=argparse.REMAINDER, metavar="ARGS", default=None,
                        help="run the single-process crash/recovery demo with ARGS")
    parser.add_argument("--warmup", type=float, default=3.0, metavar="SECONDS",
                        help="workload before the leader is killed (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=4,
                        help="concurrent register clients (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=None, help="workload random seed")
    parser.add_argument("--keep", metavar="DIR", type=Path, default=None,
                        help="build the cluster in DIR (must be empty or absent) and keep it, "
                             "with the history in DIR/history.jsonl")
    parser.set_defaults(handler=_main)


def _main(args: argparse.Namespace) -> int:
    if args.local is not None:
        from phalanx.demo import local

        return local.run(args.local)
    if args.workers < 1 or args.warmup < 0:
        print("phalanx demo: need --workers >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    keep: Path | None = args.keep
    if keep is not None and keep.exists() and any(keep.iterdir()):
        print(f"phalanx demo: {keep} is not empty", file=sys.stderr)
        return 2
    directory = keep if keep is not None else Path(tempfile.mkdtemp(prefix="phalanx-demo-"))
    if args.scenario is not None:  # a node service's demo picks its own cluster
        by_scenario = {s.scenario_name: s for s in service_specs() if s.demo is not None}
        scenario = by_scenario[args.scenario].demo  # argparse's choices
        assert scenario is not None
        return scenario.load()(args, directory, delete=keep is None)
    app_demo = app_spec(args.app).demo
    if app_demo is not None:  # the app's own demo picks its protocol
        return app_demo.load()(args, directory, delete=keep is None)
    if args.protocol is None:
        args.protocol = DEFAULT_PROTOCOL
    demo = protocol_spec(args.protocol).demo
    if demo is None:  # argparse's choices already
        print(f"phalanx demo: {args.protocol} has no demo", file=sys.stderr)
        return 2
    return demo.load()(args, directory, delete=keep is None)
