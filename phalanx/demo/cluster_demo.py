"""`phalanx demo`: a real 3-node Raft cluster on this machine, a leader crash, and the proof.

Owns: the real-cluster Raft demonstration (its command line is `phalanx.demo.command`),
which also keeps the single-process crash/recovery demo reachable as ``phalanx demo --local``
(`phalanx.demo.local.run`).

What the demo does, in order (`run_demo`):
    1. `init_cluster` in a temp dir: CA, TLS certificates, durable storage (fsync on), free
       ports; checkpoints every few hundred entries so a restart has one to load.
    2. Starts the three nodes as processes (`NodeProcesses`), waits for a leader.
    3. A KV workload (`phalanx.demo.workload`): register workers doing read/write/cas on a few
       keys with unique values, recorded as a Jepsen history (a timed-out op is ``info``),
       and a ledger worker appending unique keys.
    4. SIGKILLs the leader; measures the time to a new leader and to the first acknowledged
       write invoked after the kill.
    5. Restarts the killed node; reports the checkpoint it restored and the log entries it
       replayed (from its log line), and the time until it has applied everything the
       leader had committed when it came back.
    6. Stops the workload; checks the history with the linearizability checker, checks that
       every acknowledged ledger key is on the leader AND on the restarted node.
    7. Prints a summary table; stops the nodes; removes the temp dir (unless --keep).

Exit status 0 only if the history is linearizable, nothing acknowledged was lost and the
restarted node caught up. Live progress with rich on a terminal; plain lines otherwise.

Must not import: the runtime (nodes are processes), consensus cores. Not deterministic (real
processes and clocks); never run by the simulator.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import re
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import trio
from rich.console import Console
from rich.live import Live
from rich.table import Table

from phalanx.client.async_client import Client, ClientError, open_client
from phalanx.demo.workload import Workload, ledger_keys
from phalanx.jepsen.history import write_history
from phalanx.jepsen.linearizability import check
from phalanx.ops.local_cluster import NodeProcesses, find_free_base_port, init_cluster
from phalanx.ops.node_config import ClusterConfig

NODES: Final = 3
STATUS_TIMEOUT: Final = 0.3
_RESTORED = re.compile(r"restored term=(\d+) checkpoint=(\d+) log=(\d+) entries")


class DemoFailed(Exception):
    """The cluster did not do what the demo needs (no leader, no catch-up) in time."""


@dataclass(slots=True, kw_only=True)
class DemoOptions:
    warmup: float = 3.0
    """Seconds of workload before the leader is killed."""
    after_failover: float = 2.0
    """Seconds of workload between the new leader and the restart of the killed node."""
    settle: float = 1.0
    """Seconds of workload after the restarted node caught up."""
    workers: int = 4
    keys: int = 4
    checkpoint_every: int = 100
    seed: int | None = None
    directory: Path
    """Where the cluster is built (``DIR/cluster``); the history goes to DIR/history.jsonl."""


@dataclass(slots=True, kw_only=True)
class DemoResult:
    directory: Path
    ops_ok: int = 0
    ops_fail: int = 0
    ops_info: int = 0
    writes_acked: int = 0
    duration: float = 0.0
    killed: str = ""
    old_term: int = 0
    new_leader: str = ""
    new_term: int = 0
    time_to_leader: float = math.nan
    time_to_write: float = math.nan
    restored_checkpoint: int | None = None
    replayed_entries: int | None = None
    catch_up_target: int = 0
    serving_time: float = math.nan
    """From the restart to the node's first status reply (process start, recovery, listen)."""
    catch_up_time: float = math.nan
    """From the restart until it applied everything the leader had committed at the restart."""
    ledger_acked: int = 0
    ledger_missing_leader: int = 0
    ledger_missing_restarted: int = 0
    linearizable: bool | str = False
    explain: list[str] = field(default_factory=list)
    history_path: Path | None = None

    @property
    def passed(self) -> bool:
        return (self.linearizable is True and self.ledger_missing_leader == 0
                and self.ledger_missing_restarted == 0 and not math.isnan(self.catch_up_time))


# --------------------------------------------------------------------------------------------
# Progress display


class Progress:
    """Phase and live counters: a rich Live panel on a terminal, plain lines otherwise."""

    def __init__(self, console: Console, workload: Callable[[], Workload | None]) -> None:
        self.console = console
        self.phase = "starting"
        self._workload = workload
        self._live: Live | None = None
        self._t0 = time.monotonic()
        self._last_ops = 0
        self._last_t = self._t0
        self._rate = 0.0

    def say(self, text: str) -> None:
        self.phase = text
        elapsed = time.monotonic() - self._t0
        self.console.print(f"[{elapsed:5.1f}s] {text}", highlight=False, soft_wrap=True)

    def _render(self) -> Table:
        w = self._workload()
        now = time.monotonic()
        ops = w.completed if w else 0
        if now - self._last_t >= 0.5:
            self._rate = (ops - self._last_ops) / (now - self._last_t)
            self._last_ops, self._last_t = ops, now
        table = Table.grid(padding=(0, 2))
        table.add_row("phase", self.phase)
        table.add_row("elapsed", f"{now - self._t0:.1f} s")
        table.add_row("ops/s", f"{self._rate:,.0f}")
        if w is not None:
            table.add_row("ops ok / fail / info", f"{w.ok:,} / {w.fail:,} / {w.info:,}")
            table.add_row("acknowledged writes", f"{w.writes_acked:,}")
        return table

    async def run(self) -> None:
        """Refresh the live panel (terminal) or print a line every 2 s (plain)."""
        if self.console.is_terminal:
            with Live(self._render(), console=self.console, refresh_per_second=4,
                      transient=True) as live:
                self._live = live
                while True:
                    await trio.sleep(0.25)
                    live.update(self._render())
        else:
            while True:
                await trio.sleep(2.0)
                w = self._workload()
                if w is not None:
                    self.console.print(
                        f"        {self.phase}: {w.completed:,} ops "
                        f"({w.ok:,} ok, {w.fail:,} fail, {w.info:,} info), "
                        f"{w.writes_acked:,} acknowledged writes", highlight=False,
                        soft_wrap=True)


# --------------------------------------------------------------------------------------------
# Cluster observation


async def _statuses(client: Client, nodes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}

    async def ask(node: str) -> None:
        with contextlib.suppress(ClientError), trio.move_on_after(STATUS_TIMEOUT):
            out[node] = await client.status(node)

    async with trio.open_nursery() as nursery:
        for n in nodes:
            nursery.start_soon(ask, n)
    return out


async def _wait_for(what: str, deadline: float, probe: Callable[[], Awaitable[Any]]) -> Any:
    """Poll `probe` every 20 ms until it returns something truthy; DemoFailed at `deadline`."""
    while True:
        got = await probe()
        if got:
            return got
        if trio.current_time() > deadline:
            raise DemoFailed(f"timed out waiting for {what}")
        await trio.sleep(0.02)


async def _leader(client: Client, nodes: list[str], *, above_term: int = -1) -> Any:
    for s in (await _statuses(client, nodes)).values():
        if s.role == "leader" and s.term > above_term:
            return s
    return None


async def _leader_ckpt(client: Client, nodes: list[str]) -> Any:
    s = await _leader(client, nodes)
    return s if s is not None and s.last_checkpoint > 0 else None


def _restored_line(log: Path, occurrence: int) -> tuple[int, int] | None:
    """(checkpoint index, log entries replayed) from the node's `occurrence`-th restore line."""
    try:
        found = _RESTORED.findall(log.read_text(errors="replace"))
    except OSError:
        return None
    if len(found) < occurrence:
        return None
    _, checkpoint, entries = found[occurrence - 1]
    return int(checkpoint), int(entries)


# --------------------------------------------------------------------------------------------
# The demo


async def run_demo(options: DemoOptions, console: Console) -> DemoResult:
    """Run the whole demo (see the module docstring) and return its figures."""
    cluster_dir = options.directory / "cluster"
    cluster = init_cluster(cluster_dir, nodes=NODES, base_port=find_free_base_port(NODES),
                           checkpoint_every=options.checkpoint_every)
    result = DemoResult(directory=cluster_dir)
    state: dict[str, Workload] = {}
    progress = Progress(console, lambda: state.get("workload"))
    procs = NodeProcesses(cluster)
    try:
        async with trio.open_nursery() as outer:
            outer.start_soon(progress.run)
            await _scenario(cluster, procs, options, progress, state, result)
            outer.cancel_scope.cancel()
    finally:
        progress.say("stopping the nodes")
        procs.stop(grace=5.0)
    return result


async def _scenario(
    cluster: ClusterConfig,
    procs: NodeProcesses,
    options: DemoOptions,
    progress: Progress,
    state: dict[str, Workload],
    result: DemoResult,
) -> None:
    rng = random.Random(options.seed)
    nodes = [n.id for n in cluster.nodes]
    progress.say(f"cluster of {NODES} nodes in {cluster.directory} (TLS, fsync on)")
    procs.start()
    progress.say("waiting for a leader")
    async with open_client(cluster, timeout=2.0, attempt_timeout=0.5) as admin:
        first = await _wait_for("a leader", trio.current_time() + 20,
                                lambda: _leader(admin, nodes))
        progress.say(f"{first.node} leads term {first.term}; starting the workload")
        async with open_client(cluster, timeout=3.0, attempt_timeout=0.5) as client:
            workload = Workload(client, rng=random.Random(rng.getrandbits(64)),
                                workers=options.workers, keys=options.keys)
            state["workload"] = workload
            async with trio.open_nursery() as nursery:
                await nursery.start(workload.run)
                await trio.sleep(options.warmup)
                await _kill_and_restart(admin, procs, nodes, options, progress, workload,
                                        result)
                await trio.sleep(options.settle)
                progress.say("stopping the workload")
                workload.stop()
            await _verify(admin, cluster, workload, progress, result, options)


async def _kill_and_restart(
    admin: Client,
    procs: NodeProcesses,
    nodes: list[str],
    options: DemoOptions,
    progress: Progress,
    workload: Workload,
    result: DemoResult,
) -> None:
    old = await _wait_for("the leader", trio.current_time() + 10, lambda: _leader(admin, nodes))
    if old.last_checkpoint == 0:  # so that the restart shows checkpoint + log replay
        progress.say("waiting for the leader's first checkpoint")
        with trio.move_on_after(10):
            old = await _wait_for("a checkpoint", trio.current_time() + 30,
                                  lambda: _leader_ckpt(admin, nodes))
    victim = old.node
    result.killed, result.old_term = victim, old.term
    restores_before = len(_RESTORED.findall(procs.log_path(victim).read_text(errors="replace")))
    kill_at = trio.current_time()
    workload.nemesis("kill", victim)
    procs.kill(victim)
    progress.say(f"SIGKILL {victim} (leader of term {old.term})")
    survivors = [n for n in nodes if n != victim]
    new = await _wait_for("a new leader", kill_at + 15,
                          lambda: _leader(admin, survivors, above_term=old.term))
    result.time_to_leader = trio.current_time() - kill_at
    result.new_leader, result.new_term = new.node, new.term
    progress.say(f"{new.node} leads term {new.term} after {result.time_to_leader * 1000:.0f} ms")
    acked = await _wait_for("an acknowledged write", kill_at + 15,
                            lambda: _async(workload.first_write_ack_after(kill_at)))
    result.time_to_write = acked - kill_at
    progress.say(f"first write acknowledged {result.time_to_write * 1000:.0f} ms after the kill")
    await trio.sleep(options.after_failover)
    progress.say(f"restarting {victim}")
    workload.nemesis("start", victim)
    leader_now = await _wait_for("the leader", trio.current_time() + 10,
                                 lambda: _leader(admin, survivors))
    result.catch_up_target = leader_now.commit_index
    restart_at = trio.current_time()
    procs.start([victim])

    async def caught_up() -> Any:
        s = (await _statuses(admin, [victim])).get(victim)
        if s is not None and math.isnan(result.serving_time):
            result.serving_time = trio.current_time() - restart_at
        return s if s is not None and s.applied_index >= result.catch_up_target else None

    await _wait_for(f"{victim} to catch up", restart_at + 20, caught_up)
    result.catch_up_time = trio.current_time() - restart_at
    restored = _restored_line(procs.log_path(victim), restores_before + 1)
    if restored is not None:
        result.restored_checkpoint, result.replayed_entries = restored
    progress.say(
        f"{victim} back: checkpoint {result.restored_checkpoint}, "
        f"{result.replayed_entries} log entries replayed, applied index >= "
        f"{result.catch_up_target} after {result.catch_up_time * 1000:.0f} ms")


async def _async(value: Any) -> Any:
    return value


async def _verify(
    admin: Client,
    cluster: ClusterConfig,
    workload: Workload,
    progress: Progress,
    result: DemoResult,
    options: DemoOptions,
) -> None:
    progress.say("reading back every acknowledged ledger key from the leader")
    acked = workload.ledger_acked
    result.ledger_acked = len(acked)
    on_leader = await ledger_keys(cluster, written=workload.ledger_written)
    # The restarted node is a follower: wait until it applied all the leader had committed
    # once the workload stopped, then read its own state (stale reads served by it alone).
    nodes = [n.id for n in cluster.nodes]
    leader = await _wait_for("the leader", trio.current_time() + 10,
                             lambda: _leader(admin, nodes))
    victim = result.killed

    async def applied_all() -> Any:
        s = (await _statuses(admin, [victim])).get(victim)
        return s is not None and s.applied_index >= leader.commit_index

    await _wait_for(f"{victim} to apply index {leader.commit_index}",
                    trio.current_time() + 20, applied_all)
    progress.say(f"reading back every acknowledged ledger key from {victim}'s own state")
    on_restarted = await ledger_keys(cluster, written=workload.ledger_written, node=victim)
    result.ledger_missing_leader = len(acked - on_leader)
    result.ledger_missing_restarted = len(acked - on_restarted)
    progress.say("checking the history for linearizability")
    history = workload.history()
    verdict = await trio.to_thread.run_sync(lambda: check(history, time_limit=20.0))
    result.linearizable = verdict.valid
    result.explain = verdict.explain()
    result.ops_ok, result.ops_fail, result.ops_info = workload.ok, workload.fail, workload.info
    result.writes_acked = workload.writes_acked
    result.duration = workload.duration
    result.history_path = options.directory / "history.jsonl"
    write_history(result.history_path, history)


# --------------------------------------------------------------------------------------------
# Output


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:,.0f} ms"


def _verdict(valid: bool | str) -> str:
    if valid is True:
        return "yes"
    return "NO" if valid is False else str(valid)


def summary_table(r: DemoResult) -> Table:
    """The final summary: every figure the demo measured and each verdict."""
    table = Table(title="phalanx demo: 3-node Raft over TLS, leader SIGKILLed mid-run")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rate = (r.ops_ok + r.ops_fail + r.ops_info) / r.duration if r.duration > 0 else 0.0
    rows = [
        ("operations ok / fail / info", f"{r.ops_ok:,} / {r.ops_fail:,} / {r.ops_info:,}"),
        ("acknowledged writes", f"{r.writes_acked:,}"),
        ("throughput", f"{rate:,.0f} ops/s over {r.duration:.1f} s"),
        ("killed (SIGKILL)", f"{r.killed}, leader of term {r.old_term}"),
        ("new leader", f"{r.new_leader}, term {r.new_term}"),
        ("time to new leader", _ms(r.time_to_leader)),
        ("time to first acknowledged write", _ms(r.time_to_write)),
        ("restart: checkpoint restored at index",
         "-" if r.restored_checkpoint is None else f"{r.restored_checkpoint:,}"),
        ("restart: log entries replayed",
         "-" if r.replayed_entries is None else f"{r.replayed_entries:,}"),
        ("restart: serving again after", _ms(r.serving_time)),
        ("restart: caught up to commit index",
         f"{r.catch_up_target:,} in {_ms(r.catch_up_time)}"),
        ("acknowledged ledger keys lost (leader / restarted)",
         f"{r.ledger_missing_leader} / {r.ledger_missing_restarted} of {r.ledger_acked:,}"),
        ("linearizable", _verdict(r.linearizable)),
        ("verdict", "PASS" if r.passed else "FAIL"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _cause(error: BaseException) -> BaseException | None:
    """The `DemoFailed` or `ClientError` in `error` (trio nurseries wrap errors in groups)."""
    if isinstance(error, DemoFailed | ClientError):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            if (found := _cause(inner)) is not None:
                return found
    return None


def run_raft_demo(args: argparse.Namespace, directory: Path, *, delete: bool) -> int:
    """The Raft demo (`phalanx.protocols.builtin.RAFT.demo`): 3 nodes, a leader kill."""
    keep = None if delete else directory
    options = DemoOptions(warmup=args.warmup, workers=args.workers, seed=args.seed,
                          directory=directory)
    console = Console()
    start = time.monotonic()
    try:
        result = trio.run(run_demo, options, console)
    except (DemoFailed, ClientError, BaseExceptionGroup) as e:
        cause = _cause(e)
        if cause is None:
            raise
        print(f"phalanx demo: FAILED: {cause}", file=sys.stderr)
        return 1
    finally:
        if keep is None:
            shutil.rmtree(directory, ignore_errors=True)
    console.print(summary_table(result))
    for line in result.explain:
        console.print(line, highlight=False, markup=False)
    if keep is not None:
        console.print(f"cluster and history kept in {keep}", highlight=False)
    console.print(f"finished in {time.monotonic() - start:.1f} s", highlight=False)
    return 0 if result.passed else 1
