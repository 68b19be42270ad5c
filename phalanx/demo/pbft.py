"""`phalanx demo --protocol pbft`: a real 4-node PBFT cluster with one Byzantine replica, a
primary SIGKILL, a view change, and the proof.

Owns: `run_pbft_demo` and its summary (`phalanx.demo.cluster_demo` dispatches here).

What it does, in order:
    1. `init_cluster --protocol pbft --nodes 4` in a temp dir (TLS, Ed25519 keys, fsync on).
    2. Starts the four replicas as processes; n1, the primary of view 0, runs
       ``--byzantine MODE`` (default ``equivocate``: it sends conflicting pre-prepares for
       one sequence number to different halves of its peers).
    3. Runs the KV workload of `phalanx.demo.workload` (register workers doing
       read/write/cas, a ledger worker), recorded as a Jepsen history. The BFT client sends
       each request to every replica and accepts a result on f+1 = 2 matching replies.
    4. SIGKILLs the current primary and measures the time to a new view whose primary is
       active, and to the first acknowledged write invoked after the kill.
    5. Stops the workload; reads every acknowledged ledger key back; checks the history for
       linearizability; prints a summary.

n = 4 tolerates f = 1 fault in all. While the Byzantine replica is the primary, killing
the primary removes the liar (one fault at a time); if the view already moved on, the demo
still kills the primary and says in the summary that two replicas were faulty at once
(PBFT then promises safety, not liveness).

Exit status 0 only if the history is linearizable, nothing acknowledged was lost and a
write was acknowledged after the view change. Must not import the runtime (nodes are
processes) or consensus cores. Not deterministic; never run by the simulator.
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import trio
from rich.console import Console
from rich.table import Table

from phalanx.client.async_client import Client, ClientError, open_client
from phalanx.demo.cluster_demo import DemoFailed, Progress, _cause, _statuses, _wait_for
from phalanx.demo.workload import Workload, ledger_keys
from phalanx.jepsen.history import write_history
from phalanx.jepsen.linearizability import check
from phalanx.ops.local_cluster import NodeProcesses, find_free_base_port, init_cluster, node_command
from phalanx.ops.node_config import ClusterConfig

NODES: Final = 4
BYZANTINE_NODE: Final = "n1"
"""The primary of view 0 (replicas in id order; primary of view v is replicas[v mod n])."""


@dataclass(slots=True, kw_only=True)
class PbftDemoOptions:
    warmup: float = 4.0
    after_failover: float = 2.0
    workers: int = 4
    keys: int = 4
    mode: str = "equivocate"
    seed: int | None = None
    directory: Path


@dataclass(slots=True, kw_only=True)
class PbftDemoResult:
    directory: Path
    mode: str = ""
    ops_ok: int = 0
    ops_fail: int = 0
    ops_info: int = 0
    writes_acked: int = 0
    duration: float = 0.0
    killed: str = ""
    killed_view: int = 0
    killed_byzantine: bool = False
    new_primary: str = ""
    new_view: int = 0
    time_to_view: float = math.nan
    time_to_write: float = math.nan
    honest_dropped: int = 0
    ledger_acked: int = 0
    ledger_missing: int = 0
    linearizable: bool | str = False
    explain: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (self.linearizable is True and self.ledger_missing == 0
                and not math.isnan(self.time_to_write))


async def _primary(client: Client, nodes: list[str], *, above_view: int = -1) -> Any:
    """A status of an active primary of a view above `above_view`, else None."""
    for s in (await _statuses(client, nodes)).values():
        if s.role == "primary" and s.term > above_view:
            return s
    return None


async def run_pbft_demo(options: PbftDemoOptions, console: Console) -> PbftDemoResult:
    cluster_dir = options.directory / "cluster"
    cluster = init_cluster(cluster_dir, protocol="pbft", nodes=NODES,
                           base_port=find_free_base_port(NODES))
    result = PbftDemoResult(directory=cluster_dir, mode=options.mode)
    state: dict[str, Workload] = {}
    progress = Progress(console, lambda: state.get("workload"))

    def command(config_path: Path) -> list[str]:
        argv = node_command(config_path)
        if config_path.stem == BYZANTINE_NODE:
            argv += ["--byzantine", options.mode]
        return argv

    procs = NodeProcesses(cluster, command=command)
    try:
        async with trio.open_nursery() as outer:
            outer.start_soon(progress.run)
            await _scenario(cluster, procs, options, progress, state, result)
            outer.cancel_scope.cancel()
    finally:
        progress.say("stopping the nodes")
        procs.stop(grace=5.0)
    return result


async def _scenario(cluster: ClusterConfig, procs: NodeProcesses, options: PbftDemoOptions,
                    progress: Progress, state: dict[str, Workload],
                    result: PbftDemoResult) -> None:
    rng = random.Random(options.seed)
    nodes = [n.id for n in cluster.nodes]
    progress.say(f"PBFT cluster of {NODES} replicas in {cluster.directory} (TLS, Ed25519, "
                 f"fsync on); {BYZANTINE_NODE} runs --byzantine {options.mode}")
    procs.start()
    async with open_client(cluster, timeout=2.0, attempt_timeout=0.5) as admin:
        first = await _wait_for("an active primary", trio.current_time() + 20,
                                lambda: _primary(admin, nodes))
        progress.say(f"{first.node} is the primary of view {first.term}; starting the workload")
        async with open_client(cluster, timeout=5.0, attempt_timeout=1.0) as client:
            workload = Workload(client, rng=random.Random(rng.getrandbits(64)),
                                workers=options.workers, keys=options.keys)
            state["workload"] = workload
            async with trio.open_nursery() as nursery:
                await nursery.start(workload.run)
                await trio.sleep(options.warmup)
                await _kill_primary(admin, procs, nodes, progress, workload, result)
                await trio.sleep(options.after_failover)
                progress.say("stopping the workload")
                workload.stop()
            statuses = await _statuses(admin, [n for n in nodes if n != BYZANTINE_NODE])
            result.honest_dropped = sum(s.dropped_messages for s in statuses.values())
        progress.say("reading back every acknowledged ledger key (f+1 matching replies)")
        acked = workload.ledger_acked
        result.ledger_acked = len(acked)
        found = await ledger_keys(cluster, written=workload.ledger_written)
        result.ledger_missing = len(acked - found)
        progress.say("checking the history for linearizability")
        history = workload.history()
        verdict = await trio.to_thread.run_sync(lambda: check(history, time_limit=20.0))
        result.linearizable = verdict.valid
        result.explain = verdict.explain()
        result.ops_ok, result.ops_fail, result.ops_info = workload.ok, workload.fail, workload.info
        result.writes_acked = workload.writes_acked
        result.duration = workload.duration
        write_history(options.directory / "history.jsonl", history)


async def _kill_primary(admin: Client, procs: NodeProcesses, nodes: list[str],
                        progress: Progress, workload: Workload,
                        result: PbftDemoResult) -> None:
    old = await _wait_for("the primary", trio.current_time() + 10,
                          lambda: _primary(admin, nodes))
    victim = old.node
    result.killed, result.killed_view = victim, old.term
    result.killed_byzantine = victim == BYZANTINE_NODE
    kill_at = trio.current_time()
    workload.nemesis("kill", victim)
    procs.kill(victim)
    what = "the Byzantine replica" if result.killed_byzantine else "an honest replica"
    progress.say(f"SIGKILL {victim} (primary of view {old.term}, {what})")
    survivors = [n for n in nodes if n != victim]
    new = await _wait_for("a view change", kill_at + 20,
                          lambda: _primary(admin, survivors, above_view=old.term))
    result.time_to_view = trio.current_time() - kill_at
    result.new_primary, result.new_view = new.node, new.term
    progress.say(f"view {new.term}: {new.node} is primary after "
                 f"{result.time_to_view * 1000:.0f} ms")

    async def acked() -> float | None:
        return workload.first_write_ack_after(kill_at)

    when = await _wait_for("an acknowledged write", kill_at + 20, acked)
    result.time_to_write = when - kill_at
    progress.say(f"first write acknowledged {result.time_to_write * 1000:.0f} ms after the kill")


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:,.0f} ms"


def pbft_summary_table(r: PbftDemoResult) -> Table:
    table = Table(title=f"phalanx demo: 4-replica PBFT over TLS, {BYZANTINE_NODE} Byzantine "
                        f"({r.mode}), primary SIGKILLed mid-run")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rate = (r.ops_ok + r.ops_fail + r.ops_info) / r.duration if r.duration > 0 else 0.0
    faults = "1 (the liar itself)" if r.killed_byzantine else "2 (beyond f=1: safety only)"
    rows = [
        ("operations ok / fail / info", f"{r.ops_ok:,} / {r.ops_fail:,} / {r.ops_info:,}"),
        ("acknowledged writes", f"{r.writes_acked:,}"),
        ("throughput", f"{rate:,.0f} ops/s over {r.duration:.1f} s"),
        ("killed (SIGKILL)", f"{r.killed}, primary of view {r.killed_view}"),
        ("faulty replicas after the kill", faults),
        ("new primary", f"{r.new_primary}, view {r.new_view}"),
        ("time to the new view", _ms(r.time_to_view)),
        ("time to first acknowledged write", _ms(r.time_to_write)),
        ("messages dropped by honest replicas", f"{r.honest_dropped:,}"),
        ("acknowledged ledger keys lost", f"{r.ledger_missing} of {r.ledger_acked:,}"),
        ("linearizable", "yes" if r.linearizable is True else str(r.linearizable)),
        ("verdict", "PASS" if r.passed else "FAIL"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def main_pbft(options: PbftDemoOptions, console: Console) -> int:
    """Run the PBFT demo and print its summary; the exit status (see the module docstring)."""
    start = time.monotonic()
    result = trio.run(run_pbft_demo, options, console)
    console.print(pbft_summary_table(result))
    for line in result.explain:
        console.print(line, highlight=False, markup=False)
    console.print(f"finished in {time.monotonic() - start:.1f} s", highlight=False)
    return 0 if result.passed else 1


__all__ = ["DemoFailed", "PbftDemoOptions", "PbftDemoResult", "main_pbft", "run_pbft_demo"]


def run(args: argparse.Namespace, directory: Path, *, delete: bool) -> int:
    """`phalanx demo --protocol pbft` (`phalanx.protocols.builtin.PBFT.demo`)."""
    from phalanx.protocols import byzantine_mode_problem
    from phalanx.protocols import get as protocol_spec

    problem = byzantine_mode_problem(protocol_spec(args.protocol), args.byzantine)
    if problem is not None:
        print(f"phalanx demo: --byzantine {args.byzantine}: {problem}", file=sys.stderr)
        return 2
    options = PbftDemoOptions(warmup=args.warmup, workers=args.workers, seed=args.seed,
                              mode=args.byzantine, directory=directory)
    try:
        return main_pbft(options, Console())
    except (DemoFailed, ClientError, BaseExceptionGroup) as e:
        cause = _cause(e)
        if cause is None:
            raise
        print(f"phalanx demo: FAILED: {cause}", file=sys.stderr)
        return 1
    finally:
        if delete:
            shutil.rmtree(directory, ignore_errors=True)
