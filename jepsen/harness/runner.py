"""One Jepsen test on a real local cluster: workload + nemesis, heal, final reads, check, store.

Owns:
    `RunOptions`, `RunResult` and `run_test(options, console)`, which:
      1. creates the run directory ``STORE/<test>/<timestamp>/`` (and ``STORE/latest``) and
         a fresh proxied cluster in its ``cluster/`` folder (`open_real_cluster`), so every
         node's log (``cluster/logs``) and data (``cluster/data``) end up in the store;
      2. waits for a leader, then runs `concurrency` logical client processes (each with its
         own client session) at `rate` operations per second in total (Poisson arrivals),
         while the nemesis schedule from `generate_schedule(seed, ...)` is applied in wall
         time (its virtual times multiplied by `nemesis_scale`, so episodes last long enough
         for real processes to notice); a process whose operation ends ``info`` continues
         under a new process id;
      3. stops the clients, heals everything, waits until every node has applied the
         leader's commit index, and reads every key once more (the final reads);
      4. writes ``history.jsonl``, checks it (the workload's checker plus the stats rule:
         every operation kind must succeed at least once, so a useless run cannot pass) and
         writes ``test.json`` and ``results.json``.
    Verdict: True (valid), False (invalid: the checker found a violation, the cluster did
    not recover after healing, or the stats rule failed) or "unknown" (search budget).

Must not import the runtime or consensus cores. Real time and processes: not deterministic,
never run by the simulator; the seed fixes the schedule and the workload's choices.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import trio
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from phalanx import __version__
from phalanx.client import open_client
from phalanx.jepsen.harness.cluster import ClusterUnavailable, RealCluster, open_real_cluster
from phalanx.jepsen.harness.nemesis_real import RealNemesis
from phalanx.jepsen.harness.register import RegisterWorkload
from phalanx.jepsen.history import FAIL, INFO, OK, History, HistoryRecorder, Process, write_history
from phalanx.jepsen.linearizability import UNKNOWN
from phalanx.jepsen.nemesis import Schedule, generate_schedule, schedule_to_json

WORKLOADS: Final = ("register",)
"""Workloads this runner can drive now; bank and set come with their Txn support."""

FINAL_READ_ATTEMPTS: Final = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    protocol: str = "raft"
    nodes: int = 5
    workload: str = "register"
    faults: tuple[str, ...] = ()
    time_s: float = 60.0
    rate: float = 50.0
    concurrency: int = 5
    seed: int = 0
    store: Path = Path("store")
    keys: int = 5
    ops_per_key: int = 150
    op_timeout: float = 2.0
    nemesis_scale: float = 4.0
    recovery_timeout: float = 60.0
    check_time_limit: float = 60.0

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload {self.workload!r} is not supported by the runner yet")
        if self.nodes < 1 or self.concurrency < 1 or self.rate <= 0 or self.time_s <= 0:
            raise ValueError("nodes and concurrency must be >= 1, rate and time > 0")
        if self.nemesis_scale <= 0:
            raise ValueError("nemesis_scale must be > 0")

    @property
    def test_name(self) -> str:
        faults = "+".join(self.faults) if self.faults else "none"
        return f"{self.protocol}-{self.workload}-{faults}-n{self.nodes}"


@dataclass(slots=True, kw_only=True)
class RunResult:
    directory: Path
    valid: bool | str = UNKNOWN
    reasons: list[str] = field(default_factory=list)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per operation kind ``f``: ``{"ok": n, "fail": n, "info": n}``."""
    nemesis_events: int = 0
    recovered: bool = False
    final_reads_ok: int = 0
    final_reads: int = 0
    duration_s: float = 0.0
    checker: dict[str, object] = field(default_factory=dict)
    network: dict[str, int] = field(default_factory=dict)

    @property
    def totals(self) -> dict[str, int]:
        out = {OK: 0, FAIL: 0, INFO: 0}
        for per in self.counts.values():
            for k, v in per.items():
                out[k] += v
        return out


def make_run_directory(store: Path, test: str) -> Path:
    """``store/<test>/<UTC timestamp>/``, created, with ``store/latest`` pointing at it."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    run_dir = store / test / stamp
    run_dir.mkdir(parents=True)
    latest = store / "latest"
    with contextlib.suppress(FileNotFoundError):
        latest.unlink()
    with contextlib.suppress(OSError):  # best effort: a link, not the data
        latest.symlink_to(run_dir.relative_to(store), target_is_directory=True)
    return run_dir


def schedule_for(options: RunOptions, nodes: tuple[str, ...]) -> Schedule:
    """The run's nemesis schedule in unscaled (virtual) time; see `nemesis_scale`."""
    duration_ns = int(options.time_s / options.nemesis_scale * 1e9)
    return generate_schedule(random.Random(options.seed), nodes=nodes, faults=options.faults,
                             duration_ns=duration_ns)


def stats_verdict(history: History, functions: tuple[str, ...]) -> list[str]:
    """Jepsen's stats rule: every operation kind must have succeeded at least once."""
    ok = {op.f for op in history.ops if op.type == OK and op.process != "nemesis"}
    return [f"no {f} operation succeeded" for f in functions if f not in ok]


class _Run:
    """The mutable state of one run, shared by its tasks."""

    def __init__(self, options: RunOptions, cluster: RealCluster) -> None:
        self.options = options
        self.cluster = cluster
        self.recorder = HistoryRecorder()
        self.t0 = trio.current_time()
        rng = random.Random(options.seed)
        self.rng = random.Random(rng.getrandbits(64) ^ 1)
        self.workload = RegisterWorkload(
            recorder=self.recorder, now=self.now, rng=random.Random(rng.getrandbits(64)),
            keys=options.keys, ops_per_key=options.ops_per_key)
        self.counts: Counter[tuple[str, str]] = Counter()
        self.stopped = False
        self.next_process = options.concurrency
        self.nemesis = RealNemesis(cluster, record=self.record_nemesis, clock_skew=False)

    def stopping(self) -> bool:
        return self.stopped

    def now(self) -> int:
        return int((trio.current_time() - self.t0) * 1e9)

    def record_nemesis(self, f: str, value: str) -> None:
        self.recorder.nemesis(f=f, value=value, time=self.now())

    def fresh_process(self) -> int:
        p = self.next_process
        self.next_process += 1
        return p

    def total(self, kind: str) -> int:
        return sum(v for (_, k), v in self.counts.items() if k == kind)

    async def worker(self, slot: int) -> None:
        process: Process = slot
        o = self.options
        async with open_client(self.cluster.config, timeout=o.op_timeout,
                               attempt_timeout=min(0.5, o.op_timeout)) as client:
            next_at = trio.current_time()
            while not self.stopping():
                next_at += self.rng.expovariate(o.rate / o.concurrency)
                now = trio.current_time()
                next_at = max(next_at, now - 1.0)  # fell behind: do not burst
                await trio.sleep_until(next_at)
                if self.stopping():
                    break
                f, kind = await self.workload.operate(process, client)
                self.counts[(f, kind)] += 1
                if kind == INFO:
                    process = self.fresh_process()

    async def run_nemesis(self, schedule: Schedule) -> None:
        for event in schedule:
            await trio.sleep_until(self.t0 + event.at_ns * self.options.nemesis_scale / 1e9)
            await self.nemesis.apply(event)

    async def final_reads(self, result: RunResult) -> None:
        async with open_client(self.cluster.config, timeout=self.options.op_timeout) as client:
            for key in self.workload.keys:
                result.final_reads += 1
                for _ in range(FINAL_READ_ATTEMPTS):
                    kind = await self.workload.final_read(self.fresh_process(), client, key)
                    if kind == OK:
                        result.final_reads_ok += 1
                        break
                    await trio.sleep(0.5)

    def describe_faults(self) -> str:
        current = self.nemesis.current
        return "; ".join(current[e] for e in sorted(current)) or "none"


async def _progress(run: _Run, console: Console, total: float) -> None:
    if not console.is_terminal:
        await _plain_progress(run, console)
    else:
        await _bar_progress(run, console, total)


async def _plain_progress(run: _Run, console: Console) -> None:
    while True:
        await trio.sleep(5.0)
        console.print(
            f"[{trio.current_time() - run.t0:5.1f}s] ok {run.total(OK):,}, "
            f"info {run.total(INFO):,}, fail {run.total(FAIL):,}; "
            f"faults: {run.describe_faults()}", highlight=False, soft_wrap=True, markup=False)


async def _bar_progress(run: _Run, console: Console, total: float) -> None:
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[counts]}"), console=console,
                  transient=True) as bar:
        task = bar.add_task("running", total=total, counts="")
        while True:
            bar.update(task, completed=min(total, trio.current_time() - run.t0),
                       counts=f"ok {run.total(OK):,} info {run.total(INFO):,} "
                              f"fail {run.total(FAIL):,} | faults: {run.describe_faults()}")
            await trio.sleep(0.25)


async def run_test(options: RunOptions, console: Console) -> RunResult:
    """Run one test (see the module docstring); the result is also in the run directory."""
    run_dir = make_run_directory(options.store, options.test_name)
    result = RunResult(directory=run_dir)
    started = time.monotonic()
    test_doc = {**asdict(options), "store": str(options.store), "faults": list(options.faults),
                "version": __version__, "test": options.test_name}
    async with open_real_cluster(run_dir / "cluster", nodes=options.nodes,
                                 protocol=options.protocol,
                                 rng=random.Random(options.seed)) as cluster:
        schedule = schedule_for(options, cluster.nodes)
        test_doc["schedule"] = json.loads(schedule_to_json(schedule))
        (run_dir / "test.json").write_text(json.dumps(test_doc, indent=2, sort_keys=True))
        console.print(f"cluster of {options.nodes} nodes up in {cluster.config.directory}; "
                      "waiting for a leader", highlight=False)
        leader = await cluster.wait_for_leader(30.0)
        console.print(f"{leader} leads; running {options.workload} for {options.time_s:g} s "
                      f"with {len(schedule)} nemesis events", highlight=False)
        run = _Run(options, cluster)
        async with trio.open_nursery() as outer:
            outer.start_soon(_progress, run, console, options.time_s)
            async with trio.open_nursery() as nursery:
                for slot in range(options.concurrency):
                    nursery.start_soon(run.worker, slot)
                nursery.start_soon(run.run_nemesis, schedule)
                await trio.sleep_until(run.t0 + options.time_s)
                run.stopped = True
                nursery.cancel_scope.deadline = trio.current_time() + options.op_timeout + 5
            run.nemesis.heal_all()
            console.print("healed every fault; waiting for the cluster to recover",
                          highlight=False)
            try:
                await cluster.wait_recovered(options.recovery_timeout)
                result.recovered = True
            except ClusterUnavailable as e:
                result.reasons.append(str(e))
            await run.final_reads(result)
            outer.cancel_scope.cancel()
        result.network = cluster.network.statistics()
    history = run.recorder.history()
    write_history(run_dir / "history.jsonl", history)
    result.nemesis_events = run.nemesis.applied
    for (f, kind), n in sorted(run.counts.items()):
        result.counts.setdefault(f, {OK: 0, FAIL: 0, INFO: 0})[kind] = n
    console.print(f"checking {len(history.ops):,} history events", highlight=False)
    limit = options.check_time_limit
    result.checker = await trio.to_thread.run_sync(
        lambda: run.workload.check(history, time_limit=limit))
    stats = stats_verdict(history, run.workload.functions)
    result.reasons.extend(stats)
    checked = result.checker.get("valid")
    if checked is False:
        result.reasons.append(f"{options.workload} checker: not valid")
    if checked is False or stats or not result.recovered:
        result.valid = False
    elif checked == UNKNOWN:
        result.valid = UNKNOWN
    else:
        result.valid = True
    result.duration_s = time.monotonic() - started
    _write_results(run_dir, result)
    return result


def _write_results(run_dir: Path, result: RunResult) -> None:
    doc = {
        "valid": result.valid,
        "reasons": result.reasons,
        "counts": result.counts,
        "totals": result.totals,
        "nemesis_events": result.nemesis_events,
        "recovered": result.recovered,
        "final_reads": {"ok": result.final_reads_ok, "total": result.final_reads},
        "duration_s": round(result.duration_s, 3),
        "network": result.network,
        "checker": result.checker,
    }
    tmp = run_dir / "results.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))
    os.replace(tmp, run_dir / "results.json")
