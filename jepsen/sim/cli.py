"""`phalanx sim`: seeded deterministic-simulation sweeps from the command line.

Owns: `add_sim_command(subparsers)` (the lead wires it into `phalanx.cli.main`) and its handler.
Progress goes to stderr (rich bars on a terminal, plain lines otherwise:
`phalanx.jepsen.sim.sim_progress`), the summary and failure reports to stdout; the exit
status is 1 when any seed fails, 2 on bad arguments (one line on stderr:
`phalanx.cli.errors`). Counts and times are checked by their argparse types (finite,
positive), so NaN or inf never reaches the simulator.

Rules: argument parsing and printing only; the work is `phalanx.jepsen.sim.sweep`, which
the handler imports (with `phalanx.jepsen.sim.run`): building the parser, and so `phalanx
sim --help`, must not load the simulator. The parser's defaults are `RunConfig`'s (a test
holds them equal).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from phalanx.cli.errors import (
    EXIT_USAGE,
    int_between,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    print_error,
)
from phalanx.jepsen import nemesis
from phalanx.jepsen.sim.scenarios import SCENARIOS, check_scenario
from phalanx.protocols import DEFAULT_PROTOCOL
from phalanx.protocols import get as get_protocol
from phalanx.protocols import names as protocol_names

DEFAULT_CLIENTS = 3
DEFAULT_KEYS = 3
DEFAULT_MAX_EVENTS = 400_000
"""`phalanx.jepsen.sim.run.RunConfig`'s defaults, named here so the parser needs no simulator."""
MAX_NODES = 200
MAX_JOBS = 256



def add_sim_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "sim",
        help="run seeded deterministic simulations and check safety, linearizability, liveness",
        description=(
            "Run N seeded simulations of a cluster under injected faults. Each seed draws its "
            "own subset of the fault kinds and its own protocol knobs (swarm testing) and is "
            "checked for vote safety (Raft), election safety, log matching, leader "
            "completeness, state-machine safety, committed-means-durable-on-a-majority, "
            "linearizability of the client history and liveness after healing. A failure "
            "prints its seed, the seed's faults and knobs, a replay command and the end of "
            "its trace."
        ),
    )
    p.add_argument("--protocol", choices=protocol_names(), default=DEFAULT_PROTOCOL,
                   help="the protocol to simulate (default: %(default)s)")
    p.add_argument("--app", default="", metavar="FILE.py:FACTORY",
                   help="simulate your own state machine (FILE.py:FACTORY or MODULE:FACTORY) "
                   "instead of the KV store: it needs random_command(rng) (docs/"
                   "STATE_MACHINES.md, \"Test it\"); checked: linearizability against its "
                   "model, replica convergence, liveness")
    p.add_argument("--seeds", type=positive_int, default=100,
                   help="number of seeds (default 100)")
    p.add_argument("--seed-start", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--nodes", type=int_between(1, MAX_NODES), default=None,
                   help=f"cluster size, 1..{MAX_NODES} (default: 3 or 5 by seed)")
    p.add_argument(
        "--faults",
        default="all",
        help=f"all, none, or a comma list of: {', '.join(nemesis.SIM_FAULT_KINDS)}; "
        f"opt-in (not in all; protocols that declare them): "
        f"{', '.join(nemesis.OPT_IN_FAULT_KINDS)}",
    )
    p.add_argument(
        "--bug",
        action="append",
        default=[],
        metavar="NAME",
        help="TEST ONLY: enable a deliberate bug of the protocol's core (the sweep should "
        "then fail); a wrong name lists the protocol's bugs",
    )
    p.add_argument(
        "--scenario", choices=SCENARIOS, default="",
        help="add a named nemesis scenario to each seed's schedule (with --faults none: the "
        "scenario alone): long-halves cuts the nodes into two halves from ~0.3 s to the last "
        "fifth of --time (docs/LEADERLESS.md \"Simulation\")")
    p.add_argument("--jobs", type=int_between(1, MAX_JOBS), default=1,
                   help=f"worker processes, 1..{MAX_JOBS} (default 1)")
    p.add_argument("--time", type=positive_float, default=2.0,
                   help="virtual seconds of faults (default 2)")
    p.add_argument(
        "--trace", type=Path, default=None, help="write the full trace of a single seed here"
    )
    p.add_argument(
        "--liveness", type=positive_float, default=2.0,
        help="virtual seconds after healing in which every operation must complete (default 2)",
    )
    p.add_argument(
        "--no-swarm", action="store_true",
        help="use every --faults kind and the protocol's default knobs on every seed "
        "(default: each seed draws a fault subset and protocol knobs from its own seed)",
    )
    p.add_argument(
        "--byzantine", type=non_negative_int, default=0, metavar="K",
        help="PBFT: K replicas lie with seeded behaviours (K <= f keeps every check passing)",
    )
    p.add_argument(
        "--twins", type=non_negative_int, default=0, metavar="T",
        help="PBFT: T twinned replicas (TEST ONLY: K + T > f is the must-fail control)",
    )
    p.add_argument("--clients", type=positive_int, default=DEFAULT_CLIENTS,
                   help=f"concurrent client sessions (default {DEFAULT_CLIENTS})")
    p.add_argument("--keys", type=positive_int, default=DEFAULT_KEYS,
                   help=f"keys the clients read and write (default {DEFAULT_KEYS})")
    p.add_argument("--max-events", type=positive_int, default=DEFAULT_MAX_EVENTS,
                   help="event budget of one seed; a run that exceeds it fails "
                   f"(default {DEFAULT_MAX_EVENTS:,})")
    p.add_argument("--no-codec", action="store_true", help="skip message encode/decode")
    p.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", dest="settings",
        help="fix a protocol knob (a config field of the protocol's core) on every seed, over "
        "the swarm's draw; repeatable; VALUE is an int, true/false or a word, e.g. "
        "--set stuck_resolution=pbft (leaderless: order checkpoint votes through PBFT)",
    )
    p.add_argument(
        "--dissemination", choices=("direct", "gossip"), default="direct",
        help="how a core's broadcasts travel: direct (one message per peer, the full mesh) "
        "or gossip (rumors through each node's gossip layer; docs/GOSSIP.md) "
        "(default: %(default)s)")
    p.add_argument("--gossip-tick-ms", type=positive_float, default=2.0,
                   help="with --dissemination gossip: the gossip layers' tick; a wave "
                   "carries one tick's broadcasts (default 2)")
    wan = p.add_argument_group(
        "wide-area network (docs/SCALE.md)",
        "Place nodes and clients round-robin in K regions of a published inter-region "
        "round-trip table (N. Virginia, Frankfurt, Tokyo, Sydney, Sao Paulo, ...), with "
        "jitter, bandwidth and loss; node ticks and client timeouts grow with the longest "
        "round trip. Without --regions: the default sub-millisecond network.")
    wan.add_argument("--regions", type=int_between(1, 10), default=None, metavar="K",
                     help="regions, 1..10 (default: no WAN)")
    wan.add_argument("--wan-jitter-pct", type=non_negative_float, default=10.0,
                     help="mean jitter, percent of the one-way delay (default 10)")
    wan.add_argument("--link-mbps", type=non_negative_float, default=100.0,
                     help="bandwidth of each node-to-node link, 0 = unlimited (default 100)")
    wan.add_argument("--uplink-mbps", type=non_negative_float, default=1000.0,
                     help="bandwidth of each node's uplink, 0 = unlimited (default 1000)")
    wan.add_argument("--wan-loss", type=non_negative_float, default=0.0,
                     help="probability that an inter-region message is lost (default 0)")
    wan.add_argument("--cpu-model", action="store_true",
                     help="with --regions: each node handles its received messages one at a "
                     "time, paying measured CPU costs per message, signature and MAC "
                     "(phalanx.jepsen.sim.cpu; default: processing takes no time)")
    p.add_argument("--sized-budgets", action="store_true",
                   help="scale the event and byte budgets with (nodes/5)^2 and the run's "
                   "length (for large clusters; default: --max-events as given)")
    p.set_defaults(handler=_handle)



def parse_settings(items: list[str]) -> tuple[tuple[str, int | bool | str], ...]:
    """`--set NAME=VALUE` items as sorted knob pairs (ValueError: a one-line message)."""
    out: dict[str, int | bool | str] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.isidentifier() or not raw:
            raise ValueError(f"--set {item}: expected NAME=VALUE, e.g. --set stuck_resolution=pbft")
        value: int | bool | str = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        elif raw.lstrip("-").isdigit():
            value = int(raw)
        out[name] = value
    return tuple(sorted(out.items()))


def _handle(args: argparse.Namespace) -> int:
    from phalanx.jepsen.sim.run import RunConfig, run
    from phalanx.jepsen.sim.sim_progress import SweepProgress
    from phalanx.jepsen.sim.sweep import sweep

    try:
        faults = nemesis.parse_faults(args.faults, kinds=nemesis.SIM_FAULT_KINDS) if (
            args.faults.strip() == "all") else nemesis.parse_faults(
            args.faults, kinds=nemesis.SIM_FAULT_KINDS + nemesis.OPT_IN_FAULT_KINDS)
    except nemesis.ScheduleError as exc:
        print_error("phalanx sim", str(exc))
        return EXIT_USAGE
    if args.seeds < 1 or args.jobs < 1 or args.time <= 0 or args.liveness <= 0:
        print_error("phalanx sim", "--seeds, --jobs, --time and --liveness must be positive")
        return EXIT_USAGE
    try:
        check_scenario(args.scenario, int(args.time * 1e9))
    except ValueError as exc:
        print_error("phalanx sim", f"--scenario: {exc}")
        return EXIT_USAGE
    if args.byzantine < 0 or args.twins < 0:
        print_error("phalanx sim", "--byzantine and --twins must be >= 0")
        return EXIT_USAGE
    spec = get_protocol(args.protocol)
    if (args.byzantine or args.twins) and spec.byzantine is None:
        able = ", ".join(s for s in protocol_names() if get_protocol(s).byzantine is not None)
        print_error("phalanx sim", f"--byzantine and --twins need a protocol that tolerates "
                    f"Byzantine replicas ({able}); {args.protocol} does not")
        return EXIT_USAGE
    unsupported = [k for k in faults
                   if k in nemesis.OPT_IN_FAULT_KINDS and k not in spec.sim_fault_kinds]
    if unsupported:
        able = ", ".join(s for s in protocol_names()
                         if unsupported[0] in get_protocol(s).sim_fault_kinds)
        print_error("phalanx sim", f"--faults {unsupported[0]}: protocol {args.protocol} does "
                    f"not support it (static membership); use one that does ({able or 'none'})")
        return EXIT_USAGE
    known_bugs = sorted(spec.sim_bugs.load()) if spec.sim_bugs is not None else []
    unknown_bugs = sorted(set(args.bug) - set(known_bugs))
    if unknown_bugs:
        print_error("phalanx sim", f"--bug {unknown_bugs[0]}: not a deliberate bug of "
                    f"{args.protocol} (known: {', '.join(known_bugs) or 'none'})")
        return EXIT_USAGE
    if args.nodes is not None and args.nodes < 1:
        print_error("phalanx sim", "--nodes must be >= 1")
        return EXIT_USAGE
    if min(args.clients, args.keys, args.max_events) < 1:
        print_error("phalanx sim", "--clients, --keys and --max-events must be >= 1")
        return EXIT_USAGE
    try:
        settings = parse_settings(args.settings)
    except ValueError as exc:
        print_error("phalanx sim", str(exc))
        return EXIT_USAGE
    if args.wan_loss > 1:
        print_error("phalanx sim", f"--wan-loss {args.wan_loss:g}: a probability, 0..1")
        return EXIT_USAGE
    if args.cpu_model and args.regions is None:
        print_error("phalanx sim", "--cpu-model is part of the WAN model: give --regions K")
        return EXIT_USAGE
    from phalanx.jepsen.sim.cpu import CpuCosts
    from phalanx.jepsen.sim.wan import WanConfig
    wan = None if args.regions is None else WanConfig(
        regions=args.regions, jitter_pct=args.wan_jitter_pct, link_mbps=args.link_mbps,
        uplink_mbps=args.uplink_mbps, loss=args.wan_loss,
        cpu=CpuCosts() if args.cpu_model else None)
    if args.app:
        from phalanx.appspec.custom import absolute
        from phalanx.jepsen.sim.protocols import protocol_setup
        args.app = absolute(args.app)  # worker processes load the same file
        try:  # an app that will not load or cannot be tested: one line, before any seed
            protocol_setup(args.protocol, bugs=frozenset(),
                           nodes=spec.fault_model.nodes_for(1), app=args.app)
        except ValueError as exc:
            print_error("phalanx sim", str(exc))
            return EXIT_USAGE
    base = RunConfig(
        app=args.app,
        wan=wan,
        sized_budgets=args.sized_budgets,
        settings=settings,
        seed=args.seed_start,
        dissemination=args.dissemination,
        gossip_tick_ns=int(args.gossip_tick_ms * 1e6),
        protocol=args.protocol,
        nodes=args.nodes if args.nodes is not None else 3,
        faults=faults,
        bugs=frozenset(args.bug),
        byzantine=args.byzantine,
        twins=args.twins,
        time_ns=int(args.time * 1e9),
        liveness_ns=int(args.liveness * 1e9),
        swarm=not args.no_swarm,
        use_codec=not args.no_codec,
        clients=args.clients,
        keys=args.keys,
        max_events=args.max_events,
        scenario=args.scenario,
    )
    if settings:
        from phalanx.jepsen.sim.protocols import protocol_setup
        try:  # a bad knob is a one-line error now, not a traceback in every seed
            protocol_setup(base.protocol, bugs=base.bugs, nodes=base.nodes, knobs=settings,
                           seed=base.seed)
        except (TypeError, ValueError) as exc:
            print_error("phalanx sim", f"--set: {exc}")
            return EXIT_USAGE
    if args.trace is not None:
        if args.seeds != 1:
            print_error("phalanx sim", "--trace needs --seeds 1")
            return EXIT_USAGE
        if not args.trace.parent.is_dir():
            print_error("phalanx sim", f"--trace {args.trace}: no directory "
                        f"{args.trace.parent} to write it in")
            return EXIT_USAGE
        result = run(replace(base, keep_trace=True))
        args.trace.write_text("\n".join(result.trace_lines or []) + "\n")
        print(f"seed {base.seed}: {'ok' if result.ok else 'FAILED'}; trace hash "
              f"{result.trace_hash}; {len(result.trace_lines or [])} lines -> {args.trace}")
        if not result.ok:
            print(result.report())
        return 0 if result.ok else 1
    if args.nodes is None:
        # Alternate two sizes by seed, so one sweep covers both quorum sizes (PBFT: 3f+1).
        sizes = ((0, spec.fault_model.nodes_for(1)), (1, spec.fault_model.nodes_for(2)))
        app = f", app {base.app.rpartition('/')[2]}" if base.app else ""
        groups = [(f"{base.protocol}{app}, {n} nodes", n, off) for off, n in sizes
                  if args.seeds > off]
        with SweepProgress(sys.stderr) as shown:
            results = []
            for label, n, off in groups:
                seeds = range(args.seed_start + off, args.seed_start + args.seeds, 2)
                results.append(sweep(
                    # Mixed sizes keep K <= f at each (give --nodes to run more than f liars).
                    replace(base, nodes=n, byzantine=min(args.byzantine, spec.max_faults(n))),
                    seeds, jobs=args.jobs, label=label, **shown.group(label, len(seeds))))
    else:
        app = f", app {base.app.rpartition('/')[2]}" if base.app else ""
        groups = [(f"{base.protocol}{app}, {base.nodes} nodes", base.nodes, 0)]
        seeds = range(args.seed_start, args.seed_start + args.seeds)
        with SweepProgress(sys.stderr) as shown:
            results = [sweep(base, seeds, jobs=args.jobs, label=groups[0][0],
                             **shown.group(groups[0][0], len(seeds)))]
    failed = [o for r in results for o in r.failures]
    for o in sorted(failed, key=lambda o: o.seed):
        print(o.report)
        print()
    for (label, _, _), r in zip(groups, results, strict=True):
        print(r.summary(label))
    if len(results) > 1:
        n = sum(len(r.outcomes) for r in results)
        print(f"all: {n} seed{'' if n == 1 else 's'}, {n - len(failed)} passed, "
              f"{len(failed)} failed")
    return 1 if failed else 0
