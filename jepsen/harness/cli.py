"""``phalanx jepsen run``: one Jepsen test on a fresh local cluster of real processes.

Owns `add_run_command(jepsen_subparsers)` (the lead wires it under ``phalanx jepsen``) and
`run(args)`, its handler: parse the options, run `phalanx.jepsen.harness.runner.run_test`,
print the verdict table, exit 0 valid, 1 invalid, 4 unknown (also: the cluster never became
available), 2 usage error (bad or contradictory options, e.g. a PBFT cluster that is not
3f+1 nodes: nothing was started). The table every subcommand follows: `phalanx.cli.errors`.

Must not import the runtime or consensus cores. Start-up: the top level is what the parser
needs (names of fault kinds and Byzantine modes); trio, rich and the runner (matplotlib, the
client) are imported by the handler, so every other `phalanx` command stays cheap.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

from phalanx.appspec import DEFAULT_APP
from phalanx.appspec import get as get_app
from phalanx.appspec import names as app_names
from phalanx.appspec import specs as app_specs
from phalanx.cli.errors import (
    EXIT_INDETERMINATE,
    EXIT_USAGE,
    int_between,
    positive_float,
    positive_int,
    print_error,
)
from phalanx.jepsen.harness.byzantine_plan import MODES, ByzantinePlanError
from phalanx.jepsen.harness.schedule import REAL_FAULT_KINDS
from phalanx.jepsen.nemesis import OPT_IN_FAULT_KINDS, ScheduleError, parse_faults
from phalanx.protocols import DEFAULT_PROTOCOL
from phalanx.protocols import get as get_protocol
from phalanx.protocols import names as protocol_names

Opts = TypeVar("Opts")
R = TypeVar("R")

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from phalanx.jepsen.harness.runner import RunOptions, RunOutcome

SHARDS_WORKLOAD: Final = "cross-shard-bank"
"""``--shards 2``'s workload (`phalanx.jepsen.harness.shards`; named here so that the parser
stays cheap)."""
APP_WORKLOAD: Final = "commands"
"""A custom app's workload (`phalanx.jepsen.app_workload`; named here so that the parser
stays cheap; a test checks it is `phalanx.jepsen.app_model.WORKLOAD`)."""
GOSSIP_WORKLOAD: Final = "gossip"
"""The gossip service's workload (`phalanx.jepsen.harness.gossip_run`): any protocol."""
GOSSIP_BUGS: Final = ("no-anti-entropy",)
"""``--gossip-bug`` choices (`phalanx.jepsen.harness.gossip_run.BUGS`, named here so that
the parser stays cheap; a test checks they agree)."""
RATE_DEFAULT: Final = 50.0
GOSSIP_RATE_DEFAULT: Final = 10.0
EXIT_VALID: Final = 0
EXIT_INVALID: Final = 1
EXIT_UNKNOWN: Final = EXIT_INDETERMINATE
MAX_NODES: Final = 100

_DESCRIPTION = f"""\
Start a fresh local cluster of real node processes (mutual TLS, fsynced storage), every peer
link through a fault-injection proxy; run a workload while a seeded nemesis schedule kills,
pauses and partitions nodes and delays, loses or duplicates traffic; then heal everything,
wait for recovery, read every key once more, check the history and print a verdict.

The run is stored in STORE/<test>/<timestamp>/ (STORE/latest links to it): test.json
(options, seed, versions, schedule), history.jsonl, results.json, nodes/<id>/ (each node's
log and data), cluster/ (its configuration), latency.svg, rate.svg and index.html (the
report: verdicts, plots with nemesis intervals shaded, per-process timeline,
counterexamples).

nemesis kinds (--nemesis, comma-separated, `all` or `none`):
  {", ".join(REAL_FAULT_KINDS)}
  opt-in, not in `all` (Raft): membership (two spare nodes are added, promoted and
  removed, and voters replaced, during the workload)
The shared kinds have the same names and schedule format as `phalanx sim --faults`; `all`
means every kind above. kill-leader, kill-majority, kill-all, partition-bridge, truncate-wal
(a torn WAL tail before a killed node restarts) and flip-checkpoint (a flipped bit in its
newest checkpoint) are real-cluster only.

Byzantine replicas (--protocol pbft or leaderless; --byzantine, comma-separated items MODE or
NODE=MODE; the modes of the run's protocol):
  {", ".join(MODES)}
Each item makes one more replica lie for the whole run: MODE is the runtime's
`phalanx node run --byzantine MODE` (the behaviours `phalanx sim --byzantine K` draws
from, under the same names); `twins` starts two processes with the node's identity and
key, the proxies routing half the honest replicas to each (`phalanx sim --twins T`);
`any`, or a count K, draws the mode from the seed (`phalanx sim --byzantine K`).
NODE=MODE pins the node (n1 is the primary of view 0); other items go to seeded nodes.
More than f Byzantine replicas (n = 3f+1) are refused unless --expect-violation (a
control run: it may end invalid). Byzantine replicas are named in the history, test.json,
results.json and the report, and are not waited for by the recovery check.

Two shards (--shards 2 [--protocol pbft,raft] [--workload cross-shard-bank]): two clusters,
linked, each with the cluster-sending service; clients read each shard's whole state and
transfer inside a shard and across (a debit and an outbox slot in one transaction, credited
in the other shard exactly once); each shard gets its own nemesis schedule, --byzantine
applies to its Byzantine-tolerant shards. Valid when every read's books balance (credits in
flight counted), no balance is negative and every credit is received by the end. See
docs/CLUSTER_SENDING.md.

Gossip (--workload gossip, any --protocol): every node runs the gossip service; clients
publish rumors at random nodes (`phalanx gossip publish`) under the nemesis; after healing,
every node's delivery log is read (`phalanx gossip status`). Valid when every rumor
acknowledged by a node process still running at the end reached every node up at the end
(a restarted node: the rumors published after it restarted or less than rumor_ttl/2
before), nothing was delivered that no one published, and nothing twice at a node.
--gossip-bug no-anti-entropy is a control run the checker must find invalid (with kill or
partitions). See docs/GOSSIP.md.

exit status: 0 valid, 1 invalid, 2 usage error (nothing was started), 4 unknown (also: the
cluster never became available), 70 internal error.
"""


def add_run_command(
    jepsen_subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Register ``run`` on the ``phalanx jepsen`` subparsers."""
    p = jepsen_subparsers.add_parser(
        "run", help="run a workload on a local cluster under faults and check it",
        description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--protocol", type=_protocol_list, default=None,
                   metavar="{" + ",".join(protocol_names()) + "}",
                   help=f"the cluster's protocol (default: {DEFAULT_PROTOCOL}); with --shards, "
                        "one per shard, comma-separated, or one for both (default pbft,raft)")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   dest="options",
                   help="an option of the protocol's core for the cluster's `cluster init` "
                        "(repeatable; checked by the protocol), e.g. --protocol leaderless "
                        "--option stuck_resolution=pbft")
    p.add_argument("--nodes", type=int_between(1, MAX_NODES), default=None,
                   help="nodes in the cluster (default 5; with --shards, in each shard: "
                        "default the protocol's smallest cluster of at least 3)")
    p.add_argument("--shards", type=int_between(1, 2), default=1,
                   help="2: two linked clusters (shards) and the cross-shard-bank workload "
                        "(see docs/CLUSTER_SENDING.md; default: %(default)s)")
    p.add_argument("--app", type=_app_choice, default=DEFAULT_APP,
                   metavar="{" + ",".join(app_names()) + ",FILE.py:FACTORY}",
                   help="the replicated application (default: %(default)s); its workloads: "
                   + "; ".join(f"{a.name}: {', '.join(a.workload_names)}"
                               for a in app_specs())
                   + f"; your own state machine (FILE.py:FACTORY or MODULE:FACTORY) with a "
                   f"random_command(rng) hook: {APP_WORKLOAD} (docs/STATE_MACHINES.md)")
    p.add_argument("--workload", choices=sorted({w for a in app_specs()
                                                 for w in a.workload_names}
                                                | {SHARDS_WORKLOAD, GOSSIP_WORKLOAD,
                                                   APP_WORKLOAD}),
                   default=None,
                   help="the workload (default: the app's first: kv register, chain bank: "
                        "signed transfers, reads verified block by block)")
    p.add_argument("--nemesis", default="kill,pause,partition-one,partition-halves",
                   metavar="LIST", help="fault kinds (default: %(default)s)")
    p.add_argument("--time", type=positive_float, default=60.0, metavar="S",
                   help="seconds of workload under faults (default: %(default)s)")
    p.add_argument("--rate", type=positive_float, default=None, metavar="R",
                   help=f"operations per second in total (default: {RATE_DEFAULT:g}; "
                        f"--workload gossip: {GOSSIP_RATE_DEFAULT:g})")
    p.add_argument("--concurrency", type=positive_int, default=5, metavar="C",
                   help="logical client processes (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="the nemesis schedule's and workload's seed: one seed, one schedule "
                   "(default: %(default)s)")
    p.add_argument("--keys", type=positive_int, default=5,
                   help="keys in use at a time (default: %(default)s)")
    p.add_argument("--ops-per-key", type=positive_int, default=150, metavar="N",
                   help="operations per key before a fresh key replaces it (default: %(default)s)")
    p.add_argument("--nemesis-scale", type=positive_float, default=4.0, metavar="X",
                   help="stretch the schedule's episodes by X (default: %(default)s)")
    p.add_argument("--store", type=Path, default=Path("store"), metavar="DIR",
                   help="where runs are stored (default: %(default)s)")
    p.add_argument("--byzantine", default="", metavar="SPEC",
                   help="PBFT, leaderless: Byzantine replicas, e.g. equivocate, "
                        "n1=equivocate, twins, silent,twins (described above; default: none)")
    p.add_argument("--expect-violation", action="store_true",
                   help="TEST ONLY: allow more than f Byzantine replicas (a control run)")
    p.add_argument("--gossip-bug", choices=GOSSIP_BUGS, default="",
                   help="TEST ONLY, --workload gossip: run every node with a deliberate "
                        "bug (a control run the checker must find invalid)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, *, console: Console | None = None) -> int:
    """The ``phalanx jepsen run`` handler; returns the exit status."""
    from rich.console import Console

    from phalanx.jepsen.harness.runner import WORKLOADS, RunOptions, run_test
    from phalanx.jepsen.linearizability import UNKNOWN

    out = console if console is not None else Console()
    protocol_options: dict[str, str] = {}
    for item in args.options:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            print_error("phalanx jepsen run", f"--option {item}: expected NAME=VALUE, e.g. "
                        "--option stuck_resolution=pbft")
            return EXIT_USAGE
        protocol_options[name] = value
    if args.workload == GOSSIP_WORKLOAD and args.shards == 1:
        if protocol_options:
            print_error("phalanx jepsen run", "--option is not supported with --workload gossip")
            return EXIT_USAGE
        return _run_gossip(args, out)
    if args.rate is None:
        args.rate = RATE_DEFAULT
    if args.shards > 1 or args.workload == SHARDS_WORKLOAD:
        if protocol_options:
            print_error("phalanx jepsen run", "--option is not supported with --shards")
            return EXIT_USAGE
        return _run_shards(args, out)
    if args.gossip_bug:
        print("phalanx jepsen run: error: --gossip-bug needs --workload gossip",
              file=sys.stderr)
        return EXIT_USAGE
    if args.protocol is None:
        args.protocol = DEFAULT_PROTOCOL
    if "," in args.protocol:
        print("phalanx jepsen run: error: several protocols need --shards 2",
              file=sys.stderr)
        return EXIT_USAGE
    if args.nodes is None:
        args.nodes = 5
    if args.workload is None:
        args.workload = get_app(args.app).default_workload
    if args.workload is None:  # a custom app without the testing hook
        print_error("phalanx jepsen run", f"--app {args.app}: the machine has no "
                    "random_command(rng), so there is nothing to send it (docs/"
                    "STATE_MACHINES.md, \"Test it\")")
        return EXIT_USAGE
    size_problem = get_protocol(args.protocol).size_problem(args.nodes)
    if size_problem is not None:
        print(f"phalanx jepsen run: error: {size_problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.workload not in (*WORKLOADS, APP_WORKLOAD):  # argparse's choices; a safety net
        print(f"phalanx jepsen run: error: the {args.workload} workload is not available yet "
              f"(available: {', '.join(WORKLOADS)})", file=sys.stderr)
        return EXIT_USAGE
    workloads = get_app(args.app).workload_names
    if args.workload not in workloads:
        print(f"phalanx jepsen run: error: the {args.app} app has no {args.workload} workload "
              f"(its workloads: {', '.join(workloads)})", file=sys.stderr)
        return EXIT_USAGE
    app_problem = get_app(args.app).protocol_problem(get_protocol(args.protocol))
    if app_problem is not None:
        print(f"phalanx jepsen run: error: {app_problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        faults = parse_faults(args.nemesis, kinds=REAL_FAULT_KINDS if (
            args.nemesis.strip() == "all") else REAL_FAULT_KINDS + OPT_IN_FAULT_KINDS)
    except ScheduleError as e:
        print_error("phalanx jepsen run", str(e))
        return EXIT_USAGE
    try:
        options = RunOptions(
            protocol=args.protocol, app=args.app, nodes=args.nodes, workload=args.workload,
            faults=faults,
            time_s=args.time, rate=args.rate, concurrency=args.concurrency, seed=args.seed,
            store=args.store, keys=args.keys, ops_per_key=args.ops_per_key,
            nemesis_scale=args.nemesis_scale, byzantine=args.byzantine,
            expect_violation=args.expect_violation,
            protocol_options=tuple(sorted(protocol_options.items())))
    except (ByzantinePlanError, ValueError) as e:
        print_error("phalanx jepsen run", str(e))
        return EXIT_USAGE
    result = _run_or_unavailable(run_test, options, out)
    if result is None:
        return EXIT_UNKNOWN
    out.print(verdict_table(options, result))
    for reason in result.reasons:
        out.print(f"  - {reason}", highlight=False, markup=False)
    warning = no_fault_warning(options.faults, result.nemesis_events, options.time_s)
    if warning is not None:
        out.print(warning, highlight=False, markup=False, soft_wrap=True)
    out.print(f"stored in {result.directory}", highlight=False, soft_wrap=True)
    if result.report is not None:
        out.print(f"report: {result.report}", highlight=False, soft_wrap=True)
    if result.valid is True:
        return EXIT_VALID
    return EXIT_UNKNOWN if result.valid == UNKNOWN else EXIT_INVALID


def _app_choice(text: str) -> str:
    """``--app``: a registered app, or your own state machine (loaded now: a typo is one
    line; a file path is made absolute, as `cluster init` stores it)."""
    from phalanx.appspec import UnknownApp
    from phalanx.appspec.custom import absolute, is_custom

    name = absolute(text) if is_custom(text) else text
    try:
        get_app(name)
    except UnknownApp as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name


def _protocol_list(text: str) -> str:
    """``--protocol``: one registered protocol name, or several comma-separated."""
    known = protocol_names()
    for name in text.split(","):
        if name not in known:
            raise argparse.ArgumentTypeError(
                f"unknown protocol {name!r} (known: {', '.join(known)})")
    return text


def _run_shards(args: argparse.Namespace, out: Console) -> int:
    """``--shards 2``: two linked clusters and the cross-shard bank
    (`phalanx.jepsen.harness.shards`)."""

    from phalanx.jepsen.harness.shards import ShardRunOptions, run_shards

    if args.shards != 2 or args.workload not in (None, SHARDS_WORKLOAD):
        print(f"phalanx jepsen run: error: the {SHARDS_WORKLOAD} workload runs on exactly "
              "2 shards: use --shards 2 --workload " + SHARDS_WORKLOAD, file=sys.stderr)
        return EXIT_USAGE
    given = args.protocol.split(",") if args.protocol is not None else ["pbft", "raft"]
    protocols = tuple(given * 2 if len(given) == 1 else given)
    if len(protocols) != 2:
        print("phalanx jepsen run: error: --shards 2 needs two protocols, e.g. "
              "--protocol pbft,raft", file=sys.stderr)
        return EXIT_USAGE
    nodes = tuple(args.nodes if args.nodes is not None else _smallest(p) for p in protocols)
    try:
        faults = parse_faults(args.nemesis, kinds=REAL_FAULT_KINDS)
        options = ShardRunOptions(
            protocols=protocols, nodes=nodes, faults=faults, time_s=args.time,
            rate=args.rate, concurrency=args.concurrency, seed=args.seed, store=args.store,
            nemesis_scale=args.nemesis_scale, byzantine=args.byzantine)
    except (ScheduleError, ValueError) as e:
        print_error("phalanx jepsen run", str(e))
        return EXIT_USAGE
    result = _run_or_unavailable(run_shards, options, out)
    if result is None:
        return EXIT_UNKNOWN
    t = _counts_table(options.test_name, options.time_s, options.seed, result.counts)
    t.add_section()
    t.add_row("nemesis events", str(result.nemesis_events), "", "")
    t.add_row("Byzantine", result.byzantine, "", "")
    for name, r in result.checkers.items():
        t.add_row(f"{name} checker", _verdict(r.valid), "", "")
    t.add_row("verdict", _verdict(result.valid), "", "", style="bold")
    out.print(t)
    for name, r in result.checkers.items():
        problems = r.details.get("problems")
        for problem in problems if isinstance(problems, list) else ():
            out.print(f"  - {name}: {problem}", highlight=False, markup=False)
    out.print(f"stored in {result.directory}", highlight=False, soft_wrap=True)
    if result.valid is True:
        return EXIT_VALID
    return EXIT_UNKNOWN if result.valid == "unknown" else EXIT_INVALID


def _run_gossip(args: argparse.Namespace, out: Console) -> int:
    """``--workload gossip``: the gossip service under faults
    (`phalanx.jepsen.harness.gossip_run`)."""

    from phalanx.jepsen.harness.gossip_run import GossipRunOptions, run_gossip

    protocol = args.protocol or DEFAULT_PROTOCOL
    if "," in protocol:
        print("phalanx jepsen run: error: several protocols need --shards 2", file=sys.stderr)
        return EXIT_USAGE
    try:
        faults = parse_faults(args.nemesis, kinds=REAL_FAULT_KINDS)
        options = GossipRunOptions(
            protocol=protocol, nodes=args.nodes if args.nodes is not None else 5,
            faults=faults, time_s=args.time,
            rate=args.rate if args.rate is not None else GOSSIP_RATE_DEFAULT,
            concurrency=args.concurrency, seed=args.seed, store=args.store,
            nemesis_scale=args.nemesis_scale, bug=args.gossip_bug)
    except (ScheduleError, ValueError) as e:
        print_error("phalanx jepsen run", str(e))
        return EXIT_USAGE
    result = _run_or_unavailable(run_gossip, options, out)
    if result is None:
        return EXIT_UNKNOWN
    t = _counts_table(options.test_name, options.time_s, options.seed, result.counts)
    t.add_section()
    t.add_row("nemesis events", str(result.nemesis_events), "", "")
    t.add_row("settled after heal", f"{result.settle_s:.1f} s", "", "")
    for name, r in result.checkers.items():
        t.add_row(f"{name} checker", _verdict(r.valid), "", "")
    t.add_row("verdict", _verdict(result.valid), "", "", style="bold")
    out.print(t)
    for name, r in result.checkers.items():
        problems = r.details.get("problems")
        for problem in problems if isinstance(problems, list) else ():
            out.print(f"  - {name}: {problem}", highlight=False, markup=False)
    for note in result.notes:
        out.print(f"  note: {note}", highlight=False, markup=False)
    out.print(f"stored in {result.directory}", highlight=False, soft_wrap=True)
    if result.valid is True:
        return EXIT_VALID
    return EXIT_UNKNOWN if result.valid == "unknown" else EXIT_INVALID


def _smallest(protocol: str) -> int:
    """The protocol's smallest valid cluster of at least 3 nodes."""
    return next(n for n in range(3, MAX_NODES) if get_protocol(protocol).size_problem(n) is None)


def no_fault_warning(faults: tuple[str, ...], nemesis_events: int, time_s: float) -> str | None:
    """The warning `jepsen run` prints when faults were asked for but none was injected: a
    "valid" verdict then says nothing about fault tolerance (issue 22)."""
    if not faults or nemesis_events > 0:
        return None
    return (f"warning: the nemesis injected no fault in {time_s:g} s ({', '.join(faults)}): "
            "this run tested no fault tolerance; give a longer --time (or a smaller "
            "--nemesis-scale)")


def verdict_table(options: RunOptions, r: RunOutcome) -> Table:
    t = _counts_table(options.test_name, options.time_s, options.seed, r.counts)
    tot = r.totals
    t.add_row("all", *(f"{tot[k]:,}" for k in ("ok", "info", "fail")), style="bold")
    t.add_section()
    t.add_row("nemesis events", str(r.nemesis_events), "", "")
    if r.byzantine != "none":
        t.add_row("Byzantine", r.byzantine, "", "")
    t.add_row("recovered after heal", "yes" if r.recovered else "NO", "", "")
    t.add_row("final reads ok", f"{r.final_reads_ok}/{r.final_reads}", "", "")
    for name, valid in r.checkers.items():
        t.add_row(f"{name} checker", _verdict(valid), "", "")
    t.add_row("verdict", _verdict(r.valid), "", "", style="bold")
    return t


def _verdict(valid: object) -> str:
    if valid is True:
        return "valid"
    return "INVALID" if valid is False else str(valid)


def _unavailable(exc: BaseException, kind: type[Exception]) -> BaseException | None:
    """`exc` if it is a `kind`, or the first `kind` in a (nested) group made only of them;
    else None (something else went wrong: re-raised)."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        matched, rest = exc.split(kind)
        if matched is not None and rest is None:
            leaf: BaseException = matched
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            return leaf
    return None


def _run_or_unavailable(run: Callable[[Opts, Console], Awaitable[R]], options: Opts,
                        out: Console) -> R | None:
    """`trio.run(run, options, out)`, or None after one line on stderr when the cluster never
    became available: a `ClusterUnavailable` raised inside the cluster's nursery arrives in
    an exception group (exit 4, not 70); anything else propagates."""
    import trio

    from phalanx.jepsen.harness.cluster import ClusterUnavailable

    try:
        return trio.run(run, options, out)
    except (ClusterUnavailable, BaseExceptionGroup) as e:
        unavailable = _unavailable(e, ClusterUnavailable)
        if unavailable is None:
            raise
        print(f"phalanx jepsen run: {unavailable}", file=sys.stderr)
        return None


def _counts_table(name: str, time_s: float, seed: int,
                  counts: dict[str, dict[str, int]]) -> Table:
    """The verdict table's head: the test, then ok/info/fail per operation kind."""
    from rich.table import Table

    t = Table(title=f"phalanx jepsen: {name}, {time_s:g} s, seed {seed}")
    t.add_column("operation")
    for col in ("ok", "info", "fail"):
        t.add_column(col, justify="right")
    for f, per in sorted(counts.items()):
        t.add_row(f, *(f"{per.get(k, 0):,}" for k in ("ok", "info", "fail")))
    return t
