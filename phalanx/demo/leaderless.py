"""`phalanx demo --protocol leaderless`: a real 4-node leaderless (PnyxDB) cluster with one
Byzantine endorser, a SIGKILL and restart, conflicting and commuting transactions, and the
proof that every replica converged.

Owns: `run_leaderless_demo`, its options, result and summary, and `run` (the spec's `demo`).

What it does, in order:
    1. `init_cluster --protocol leaderless --nodes 4` in a temp dir (TLS, Ed25519 node keys,
       a client signing key, fsync on); n4 runs ``--byzantine MODE`` (default
       ``equivocate``: on first sight of a transaction it endorses it unconditionally to half
       its peers and conditionally to the others, whatever it endorsed before).
    2. Commuting updates, all along: three clients `add` to a counter and `sadd` to a set,
       with no requirements (they commute, so they commit in any order).
    3. Conflicting transactions: in each round four clients `put` the same key with the same
       requirement (the version f+1 nodes report); at most one can commit, the others abort
       definitely (`TransactionAborted`: f+1 nodes say so).
    4. Between rounds it SIGKILLs the honest n2 (two faulty nodes at once, beyond f=1: the
       protocol promises safety, not progress, until n2 is back), restarts it (it replays its
       WAL and the core's durable record) and lets it catch up.
    5. Reads every node's whole applied state (STALE scans, one node at a time) until they
       are identical, and checks: the counter counts every acknowledged add (plus at most the
       unknown ones), the set holds every acknowledged member, each round committed at most
       one writer and the key holds the last winner.

Exit status 0 only if every check holds. Must not import the runtime (nodes are processes)
or consensus cores. Not deterministic; never run by the simulator.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import shutil
import sys
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import trio
from rich.console import Console
from rich.table import Table

from phalanx.apps import kv_ops
from phalanx.client.async_client import (
    Client,
    ClientError,
    ClientTimeout,
    TransactionAborted,
    open_client,
)
from phalanx.demo.cluster_demo import DemoFailed, _cause, _statuses, _wait_for
from phalanx.ops import pki
from phalanx.ops.local_cluster import NodeProcesses, find_free_base_port, init_cluster, node_command
from phalanx.ops.node_config import ClusterConfig

NODES: Final = 4
BYZANTINE_NODE: Final = "n4"
CRASHED_NODE: Final = "n2"
COUNTER: Final = "demo/hits"
SET: Final = "demo/members"
SEAT: Final = "demo/seat"
ADDERS: Final = 3
WRITERS: Final = 4
STAGGER: Final = 0.15
"""Seconds between the conflicting writers' starts."""

_Say = Callable[[str], None]


@dataclass(slots=True, kw_only=True)
class LeaderlessDemoOptions:
    directory: Path
    mode: str = "equivocate"
    rounds: int = 3
    down: float = 2.0
    seed: int | None = None


@dataclass(slots=True, kw_only=True)
class LeaderlessDemoResult:
    directory: Path
    mode: str = ""
    adds_ok: int = 0
    adds_unknown: int = 0
    members_ok: set[bytes] = field(default_factory=set)
    members_tried: set[bytes] = field(default_factory=set)
    rounds: list[tuple[list[str], int, int]] = field(default_factory=list)
    """Per round: the writers that committed, how many aborted, how many are unknown."""
    last_winner: bytes | None = None
    restarted: bool = False
    converged: bool = False
    digests: dict[str, str] = field(default_factory=dict)
    counter: int = 0
    members: int = 0
    seat: bytes | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.converged and self.restarted and not self.problems


async def run_leaderless_demo(options: LeaderlessDemoOptions,
                              console: Console) -> LeaderlessDemoResult:
    cluster_dir = options.directory / "cluster"
    cluster = init_cluster(cluster_dir, protocol="leaderless", nodes=NODES,
                           base_port=find_free_base_port(NODES))
    result = LeaderlessDemoResult(directory=cluster_dir, mode=options.mode)
    t0 = time.monotonic()

    def say(text: str) -> None:
        console.print(f"[{time.monotonic() - t0:5.1f}s] {text}", highlight=False,
                      soft_wrap=True)

    def command(config_path: Path) -> list[str]:
        argv = node_command(config_path)
        if config_path.stem == BYZANTINE_NODE:
            argv += ["--byzantine", options.mode]
        return argv

    procs = NodeProcesses(cluster, command=command)
    try:
        await _scenario(cluster, procs, options, say, result)
    finally:
        say("stopping the nodes")
        procs.stop(grace=5.0)
    return result


async def _scenario(cluster: ClusterConfig, procs: NodeProcesses,
                    options: LeaderlessDemoOptions, say: _Say,
                    result: LeaderlessDemoResult) -> None:
    nodes = [n.id for n in cluster.nodes]
    rng = random.Random(options.seed)
    say(f"leaderless cluster of {NODES} endorsers in {cluster.directory} (TLS, Ed25519, "
        f"signed client transactions, fsync on); {BYZANTINE_NODE} runs --byzantine "
        f"{options.mode}")
    procs.start()
    async with open_client(cluster, timeout=5.0, attempt_timeout=1.0) as admin:
        await _wait_for("every node", trio.current_time() + 20,
                        lambda: _all_answer(admin, nodes))
        say("every node answers; 3 clients start commuting adds (counter and set)")
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for i in range(ADDERS):
                nursery.start_soon(_adder, cluster, i, stop, result)
            for r in range(options.rounds):
                if r == 1:
                    procs.kill(CRASHED_NODE)
                    say(f"SIGKILL {CRASHED_NODE} (with the Byzantine {BYZANTINE_NODE}: two "
                        "faults, beyond f=1, so only safety is promised while it is down)")
                    await trio.sleep(options.down)
                    procs.start([CRASHED_NODE])
                    say(f"restarted {CRASHED_NODE}: it replays its WAL and durable record "
                        "and catches up from its peers")
                    result.restarted = True
                await _conflict_round(cluster, r, rng, say, result)
            stop.set()
        say(f"workload done: {result.adds_ok} adds acknowledged ({result.adds_unknown} "
            f"unknown), {len(result.members_ok)} set members acknowledged")
        say("reading every node's applied state until all are identical")
        await _converge(cluster, nodes, say, result)


async def _all_answer(admin: Client, nodes: list[str]) -> bool:
    return len(await _statuses(admin, nodes)) == len(nodes)


async def _adder(cluster: ClusterConfig, index: int, stop: trio.Event,
                 result: LeaderlessDemoResult) -> None:
    """One client: alternately `add 1` to the counter and `sadd` a fresh member, until
    `stop`. No requirements: the updates commute."""
    async with open_client(cluster, timeout=8.0, attempt_timeout=1.0) as client:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                if n % 2:
                    await client.add(COUNTER, 1)
                    result.adds_ok += 1
                else:
                    member = f"c{index}-{n}".encode()
                    result.members_tried.add(member)
                    await client.sadd(SET, member)
                    result.members_ok.add(member)
            except ClientTimeout:
                if n % 2:
                    result.adds_unknown += 1
            await trio.sleep(0.05)


async def _conflict_round(cluster: ClusterConfig, r: int, rng: random.Random, say: _Say,
                          result: LeaderlessDemoResult) -> None:
    """`WRITERS` clients put `SEAT` with one requirement (the version f+1 nodes report)."""
    async with open_client(cluster, timeout=5.0, attempt_timeout=1.0) as c:
        version = await c.agreed_version(SEAT)
    won: list[str] = []
    aborted = unknown = 0

    async def writer(i: int) -> None:
        nonlocal aborted, unknown
        name = f"round{r}-writer{i}"
        # Staggered a little (still overlapping): all at the same instant, each honest node
        # endorses the first it sees and no writer reaches a quorum (they all expire).
        await trio.sleep(STAGGER * i + rng.random() * 0.01)
        async with open_client(cluster, timeout=2.0, attempt_timeout=1.0,
                               abort_grace=5.0) as client:
            try:
                await client.put(SEAT, name.encode(), requirements={SEAT: version})
                won.append(name)
            except TransactionAborted:
                aborted += 1
            except ClientError:
                unknown += 1

    async with trio.open_nursery() as nursery:
        for i in range(WRITERS):
            nursery.start_soon(writer, i)
    result.rounds.append((won, aborted, unknown))
    if won:
        result.last_winner = won[-1].encode()
    say(f"round {r + 1}: {WRITERS} conflicting puts of {SEAT} (same requirement): "
        f"committed {', '.join(won) or 'none'}; {aborted} aborted definitely"
        + (f", {unknown} unknown" if unknown else ""))
    if len(won) > 1:
        result.problems.append(f"round {r + 1}: {len(won)} conflicting writers committed")


def _node_client(cluster: ClusterConfig, node: str) -> AbstractAsyncContextManager[Client]:
    found = next(n for n in cluster.nodes if n.id == node)
    context = pki.client_context(cluster.ca, certificate=cluster.client_cert,
                                 private_key=cluster.client_key, check_hostname=False)
    return open_client([(found.id, found.client_addr.host, found.client_addr.port)],
                       ssl_context=context, protocol=cluster.protocol,
                       client_id=pki.new_client_id(cluster.client_cert), timeout=3.0,
                       attempt_timeout=1.0)


async def _state(cluster: ClusterConfig, node: str) -> list[tuple[str, bytes]] | None:
    """`node`'s whole applied KV state (a STALE scan), or None if it does not answer."""
    async with _node_client(cluster, node) as client:
        try:
            items: list[tuple[str, bytes]] = await client.scan("", limit=10_000, stale=True)
        except ClientError:
            return None
        return items


async def _converge(cluster: ClusterConfig, nodes: list[str], say: _Say,
                    result: LeaderlessDemoResult) -> None:
    deadline = trio.current_time() + 20
    states: dict[str, list[tuple[str, bytes]] | None] = {}
    while True:
        states = {n: await _state(cluster, n) for n in nodes}
        shapes = {repr(s) for s in states.values()}
        if len(shapes) == 1 and None not in states.values():
            break
        if trio.current_time() > deadline:
            result.problems.append("the nodes' states did not converge within 20 s")
            break
        await trio.sleep(0.2)
    for n, items in states.items():
        result.digests[n] = "-" if items is None else hashlib.sha256(
            repr(items).encode()).hexdigest()[:16]
        say(f"  {n}: state digest {result.digests[n]} ({0 if items is None else len(items)} "
            "keys)" + ("  <- Byzantine (lies on the wire only)" if n == BYZANTINE_NODE else "")
            + ("  <- restarted" if n == CRASHED_NODE else ""))
    result.converged = not result.problems and len(set(result.digests.values())) == 1
    values = dict(states[nodes[0]] or [])
    result.counter = int(values.get(COUNTER, b"0"))
    members = set(kv_ops.decode_set(values.get(SET)) or [])
    result.members = len(members)
    result.seat = values.get(SEAT)
    if not result.adds_ok <= result.counter <= result.adds_ok + result.adds_unknown:
        result.problems.append(f"counter {result.counter}: {result.adds_ok} adds acknowledged, "
                               f"{result.adds_unknown} unknown")
    if not result.members_ok <= members <= result.members_tried:
        result.problems.append("the set lost an acknowledged member or holds a stranger")
    unknown_writes = any(u for _, _, u in result.rounds)  # one may have landed after all
    if (result.last_winner is not None and result.seat != result.last_winner
            and not unknown_writes):
        result.problems.append(f"{SEAT} holds {result.seat!r}, not the last winner "
                               f"{result.last_winner!r}")


def summary_table(r: LeaderlessDemoResult) -> Table:
    table = Table(title=f"phalanx demo: 4-node leaderless (PnyxDB) over TLS, "
                        f"{BYZANTINE_NODE} Byzantine ({r.mode}), {CRASHED_NODE} SIGKILLed "
                        "and restarted")
    table.add_column("measure")
    table.add_column("value", justify="right")
    committed = sum(len(w) for w, _, _ in r.rounds)
    aborted = sum(a for _, a, _ in r.rounds)
    rows = [
        ("commuting adds acknowledged / unknown", f"{r.adds_ok:,} / {r.adds_unknown:,}"),
        ("counter on every node", f"{r.counter:,}"),
        ("set members acknowledged / held", f"{len(r.members_ok):,} / {r.members:,}"),
        ("conflicting rounds", f"{len(r.rounds)} x {WRITERS} writers"),
        ("conflicting puts committed / aborted", f"{committed} / {aborted}"),
        (f"{SEAT} on every node", (r.seat or b"-").decode(errors="replace")),
        ("restarted node caught up", "yes" if r.restarted and r.converged else "no"),
        ("identical state digests", "yes" if r.converged else "NO"),
        ("verdict", "PASS" if r.passed else "FAIL"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def run(args: argparse.Namespace, directory: Path, *, delete: bool) -> int:
    """`phalanx demo --protocol leaderless` (`phalanx.protocols.builtin.LEADERLESS.demo`)."""
    from phalanx.protocols import byzantine_mode_problem
    from phalanx.protocols import get as protocol_spec

    problem = byzantine_mode_problem(protocol_spec(args.protocol), args.byzantine)
    if problem is not None:
        print(f"phalanx demo: --byzantine {args.byzantine}: {problem}", file=sys.stderr)
        return 2
    options = LeaderlessDemoOptions(directory=directory, mode=args.byzantine, seed=args.seed)
    console = Console()
    start = time.monotonic()
    try:
        result = trio.run(run_leaderless_demo, options, console)
        console.print(summary_table(result))
        for problem in result.problems:
            console.print(f"  - {problem}", highlight=False, markup=False)
        console.print(f"finished in {time.monotonic() - start:.1f} s", highlight=False)
        return 0 if result.passed else 1
    except (DemoFailed, ClientError, BaseExceptionGroup) as e:
        cause = _cause(e)
        if cause is None:
            raise
        print(f"phalanx demo: FAILED: {cause}", file=sys.stderr)
        return 1
    finally:
        if delete:
            shutil.rmtree(directory, ignore_errors=True)
