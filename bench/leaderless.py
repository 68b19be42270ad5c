"""Leaderless vs PBFT vs Raft: commit latency and throughput under contention, same run.

Run: `.venv/bin/python bench/leaderless.py` (~3.5 min; `make bench-leaderless`),
`--quick` for a smoke run (1 round, 4 clients at 0% and 50%, 1 s levels: ~15 s per
protocol), `--help` for the flags. `--cprofile DIR` runs each cluster's first node under
cProfile; `bench/profile_counts.py` turns its dump into messages, signatures, Ready bundles
and fsyncs per request (docs/LEADERLESS.md "Round 4").

Clusters (real processes on loopback, TLS, fsync "group" = real fsync, default timing), one
per protocol at its registry size (`ProtocolSpec.default_nodes`, f = 1): Raft n=3, PBFT n=4,
leaderless n=4. They run one at a time and interleave: each round starts every protocol's
cluster in turn (`--protocols` order), measures all its levels, stops it; `--rounds` rounds
give A/B/C/A/B/C, so a drift of this VM's speed shows up in every protocol alike.

Workload (closed loop, driven by the public client `phalanx.client` through each protocol's
`CallStrategy`; nothing here looks at a protocol's name):
- Each operation writes a fresh 100-byte value (client and sequence number inside, so every
  write changes the version of its key).
- "Conflicting" with probability p (the conflict level, default 0%, 10%, 50%): the op writes
  one of `--hot-keys` (default 4) keys shared by all clients of the level; otherwise a key
  unique to the client and the op.
- Signed-transaction protocols (ENDORSEMENT, the leaderless core) need a version requirement
  on every key a write overwrites: a unique key requires "absent" (version b""); a hot key
  requires the version this client last saw of it (b"" at first: every level uses fresh hot
  keys; after its own commit, the version of the value it wrote; after an abort it reads the
  version again, `Client.agreed_version`, before its next write of that key, and that read
  counts in the latency of that next op). A conflicting write may abort
  (`TransactionAborted`): commits and aborts are counted apart, and throughput is commits/s.
- Raft and PBFT get the same key pattern as plain puts (they order everything: a conflict
  costs them nothing and never aborts).
- Levels: 1 client at 0% conflicts (commit p50/p99: the latency figure), then `--clients`
  (default 64) clients at each conflict level (commits/s: the throughput figures). A warmup,
  then a `--duration` window; an op counts when it ends inside the window, its latency is
  its own start-to-outcome time.
- CPU: the servers' utime+stime over the window (`_loadgen.CpuMeter`), as cores and as
  milliseconds per committed op (all nodes together), and the load generator's own. Disk:
  the bytes the servers wrote to files per committed op (`/proc/PID/io` wchar: WAL,
  core-state journals, checkpoints), where a durable-state rewrite per Ready shows; the
  nodes' group-commit fsync batches and node-to-node bytes per committed op (their
  metrics endpoints).

Targets (issue 15, no contention): leaderless 1-client p50 <= 0.6x PBFT's; leaderless
commits/s at 64 clients >= PBFT's. The report prints every figure and a verdict per target.

Must not be imported by the package; imports `phalanx.*` for the client and the registry only.
Loopback only. Progress goes to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import trio
from _loadgen import CpuMeter, machine_info, percentile, proc_write_bytes, start_profilers
from _phalanx import PhalanxCluster, PhalanxUnavailable

from phalanx.apps.kv_ops import version_of
from phalanx.client.async_client import Client, ClientError, open_client
from phalanx.client.errors import TransactionAborted
from phalanx.protocols import CallStrategy, FaultModel
from phalanx.protocols import get as get_protocol
from phalanx.protocols import names as protocol_names

DEFAULT_PROTOCOLS = "raft,pbft,leaderless"
NO_VERSION = b""
CALL_TIMEOUT_S = 5.0
"""The call timeout of Raft and PBFT clients (the client's default)."""
P50_RATIO_GOAL = 0.6
"""Issue 15: leaderless 1-client p50 <= 0.6x PBFT's (no contention)."""


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass(slots=True, kw_only=True)
class Level:
    """One (protocol, round, clients, conflict) measurement."""

    protocol: str
    nodes: int
    round: int
    clients: int
    conflict: float
    seconds: float
    commits: int = 0
    aborts: int = 0
    errors: int = 0
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    abort_p50_ms: float = math.nan
    server_cpu: float = 0.0  # cores, all nodes together
    written: int = 0  # bytes the servers wrote to files over the window (wchar), all nodes
    fsync_batches: float = 0.0  # group-commit persist+fsync batches, all nodes
    peer_bytes: float = 0.0  # bytes sent node to node, all nodes
    loadgen_cpu: float = 0.0
    note: str = ""

    @property
    def commits_per_s(self) -> float:
        return self.commits / self.seconds if self.seconds > 0 else 0.0

    def per_commit(self, total: float) -> float:
        return total / self.commits if self.commits else math.nan

    @property
    def kib_per_commit(self) -> float:
        return self.written / 1024 / self.commits if self.commits else math.nan

    @property
    def cpu_ms_per_commit(self) -> float:
        return self.server_cpu * self.seconds * 1e3 / self.commits if self.commits else math.nan


@dataclass(slots=True, kw_only=True)
class Report:
    levels: list[Level] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    machine_start: str = ""
    machine_end: str = ""


# --------------------------------------------------------------------------------------------
# One client's operations


class Outcome:
    COMMIT = "commit"
    ABORT = "abort"


class Worker:
    """One closed-loop client of a level: picks keys, carries versions (ENDORSEMENT)."""

    def __init__(self, client: Client, *, index: int, prefix: str, hot: Sequence[str],
                 conflict: float, value_size: int, seed: int) -> None:
        self._client = client
        self._index = index
        self._prefix = prefix
        self._hot = tuple(hot)
        self._conflict = conflict
        self._value_size = value_size
        self._rng = random.Random(seed)
        self._seq = 0
        self._versioned = client.signs_transactions
        self._known: dict[str, bytes] = {key: NO_VERSION for key in self._hot}

    def _value(self) -> bytes:
        head = f"{self._prefix}{self._index}-{self._seq}|".encode()
        return (head + b"v" * self._value_size)[: self._value_size]

    async def op(self) -> str:
        """One write; returns its `Outcome` (raises `ClientError` on anything else: a timed
        out write may or may not have committed)."""
        self._seq += 1
        hot = self._hot and self._rng.random() < self._conflict
        key = (self._rng.choice(self._hot) if hot
               else f"{self._prefix}{self._index}-{self._seq}")
        value = self._value()
        if not self._versioned:
            await self._client.put(key, value)
            return Outcome.COMMIT
        if hot and key not in self._known:  # after an abort: read the version again
            self._known[key] = await self._client.agreed_version(key)
        required = self._known[key] if hot else NO_VERSION
        try:
            await self._client.put(key, value, requirements={key: required})
        except TransactionAborted:
            if hot:
                del self._known[key]
            return Outcome.ABORT
        except ClientError:
            if hot:  # it may or may not have committed: read the version before the next
                self._known.pop(key, None)
            raise
        if hot:
            self._known[key] = version_of(value)
        return Outcome.COMMIT


# --------------------------------------------------------------------------------------------
# A level


SCRAPED = ("fsync_seconds_count", "peer_bytes_out")
"""Node metrics read before and after each window (`PhalanxCluster.scrape`)."""


async def run_level(
    client: Client, cluster: PhalanxCluster, *, protocol: str, nodes: int, round_no: int,
    clients: int, conflict: float, hot_keys: int, warmup_s: float, duration_s: float,
    value_size: int, tag: str, grace_s: float = 15.0,
) -> Level:
    """`clients` closed-loop workers on one shared client (it pipelines calls over one TLS
    connection per node); measure the window."""
    prefix = f"{tag}-"
    hot = [f"{tag}-hot{i}" for i in range(hot_keys)]
    workers = [Worker(client, index=i, prefix=prefix, hot=hot, conflict=conflict,
                      value_size=value_size, seed=zlib.crc32(f"{tag}/{i}".encode()))
               for i in range(clients)]
    commits: list[float] = []
    aborts: list[float] = []
    errors = [0]
    first_error: list[str] = []
    window = [math.inf, math.inf]
    stop = trio.Event()
    running = [clients]
    all_done = trio.Event()
    perf = time.perf_counter

    async def loop(worker: Worker) -> None:
        try:
            await _ops(worker)
        finally:
            running[0] -= 1
            if running[0] == 0:
                all_done.set()

    async def _ops(worker: Worker) -> None:
        while not stop.is_set():
            t0 = perf()
            try:
                outcome = await worker.op()
            except ClientError as e:
                t1 = perf()
                if window[0] <= t1 <= window[1]:
                    errors[0] += 1
                    if not first_error:
                        first_error.append(f"{type(e).__name__}: {e}"[:200])
                await trio.sleep(0.01)
                continue
            t1 = perf()
            if window[0] <= t1 <= window[1]:
                (commits if outcome == Outcome.COMMIT else aborts).append(t1 - t0)

    pids = cluster.server_pids()
    meter = CpuMeter(pids)
    async with trio.open_nursery() as nursery:
        for worker in workers:
            nursery.start_soon(loop, worker)
        await trio.sleep(warmup_s)
        metrics0 = await trio.to_thread.run_sync(cluster.scrape, SCRAPED)
        meter.start()
        written0 = sum(proc_write_bytes(p) for p in pids)
        window[0] = perf()
        window[1] = window[0] + duration_s
        await trio.sleep(duration_s)
        own, srv = meter.stop()
        written = sum(proc_write_bytes(p) for p in pids) - written0
        metrics1 = await trio.to_thread.run_sync(cluster.scrape, SCRAPED)
        stop.set()
        with trio.move_on_after(grace_s):  # let in-flight calls end: clean connections
            await all_done.wait()
        nursery.cancel_scope.cancel()
    commits.sort()
    aborts.sort()
    return Level(
        protocol=protocol, nodes=nodes, round=round_no, clients=clients, conflict=conflict,
        seconds=duration_s, commits=len(commits), aborts=len(aborts), errors=errors[0],
        p50_ms=percentile(commits, 50) * 1e3, p99_ms=percentile(commits, 99) * 1e3,
        abort_p50_ms=percentile(aborts, 50) * 1e3, server_cpu=srv, written=written,
        fsync_batches=metrics1.get("fsync_seconds_count", 0.0)
        - metrics0.get("fsync_seconds_count", 0.0),
        peer_bytes=metrics1.get("peer_bytes_out", 0.0) - metrics0.get("peer_bytes_out", 0.0),
        loadgen_cpu=own,
        note=first_error[0] if first_error else "",
    )


async def wait_writable(client: Client, cluster: PhalanxCluster, timeout_s: float = 60.0) -> None:
    """Until one write commits: a leader (Raft, PBFT) or a quorum of endorsers is up."""
    deadline = time.monotonic() + timeout_s
    attempt = 0
    last = ""
    while time.monotonic() < deadline:
        if cluster.procs.exited():
            raise PhalanxUnavailable(f"node(s) exited: {cluster.procs.exited()}")
        attempt += 1
        key = f"ready-{attempt}"
        try:
            with trio.fail_after(5):
                await client.put(key, b"1", requirements=(
                    {key: NO_VERSION} if client.signs_transactions else None))
            return
        except (ClientError, trio.TooSlowError) as e:
            last = f"{type(e).__name__}: {e}"
        await trio.sleep(0.2)
    raise PhalanxUnavailable(f"no committed write after {timeout_s:g} s ({last})")


# --------------------------------------------------------------------------------------------
# A protocol's session (one cluster, every level)


def run_protocol(protocol: str, round_no: int, args: argparse.Namespace, report: Report,
                 workdir: Path) -> None:
    spec = get_protocol(protocol)
    nodes = spec.default_nodes
    cluster = PhalanxCluster(protocol=protocol, workdir=str(workdir / f"r{round_no}"),
                             nodes=nodes, cprofile=(
                                 os.path.join(args.cprofile, f"r{round_no}")
                                 if args.cprofile else None))
    log(f"{protocol} (round {round_no}): starting {nodes} nodes in {cluster.directory}")
    cluster.start()
    try:

        async def session() -> None:
            signed = spec.call_strategy is CallStrategy.ENDORSEMENT
            timeout = args.tx_timeout if signed else CALL_TIMEOUT_S
            async with open_client(cluster.config, timeout=timeout) as client:
                await wait_writable(client, cluster)
                plan = [(1, 0.0)] + [(args.clients, c) for c in args.conflicts]
                for clients, conflict in plan:
                    tag = f"r{round_no}c{clients}p{round(conflict * 100)}"
                    log(f"  {protocol}: {clients} client(s), {conflict:.0%} conflicting, "
                        f"{args.warmup:g} s warmup + {args.duration:g} s")
                    spies = []
                    if args.profile:
                        os.makedirs(args.profile, exist_ok=True)
                        spies = start_profilers(
                            cluster.server_pids(), os.path.join(args.profile,
                                                                f"{protocol}-{tag}"),
                            args.warmup + args.duration)
                    level = await run_level(
                        client, cluster, protocol=protocol, nodes=nodes,
                        round_no=round_no, clients=clients, conflict=conflict,
                        hot_keys=args.hot_keys, warmup_s=args.warmup,
                        duration_s=args.duration, value_size=args.value_size, tag=tag)
                    for spy in spies:
                        await trio.to_thread.run_sync(spy.wait)
                    report.levels.append(level)
                    log(f"    {_fmt(level)}")

        trio.run(session)
    finally:
        cluster.stop()


# --------------------------------------------------------------------------------------------
# Report


def _fmt(r: Level) -> str:
    note = f" [{r.note}]" if r.note else ""
    return (f"{r.commits_per_s:,.0f} commits/s, {r.aborts} aborts, {r.errors} errors, "
            f"p50 {_ms(r.p50_ms)} ms, p99 {_ms(r.p99_ms)} ms, servers {r.server_cpu:.2f} cores "
            f"= {_ms(r.cpu_ms_per_commit)} ms CPU/commit, "
            f"{_ms(r.kib_per_commit)} KiB written/commit{note}")


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def _median(values: Sequence[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return statistics.median(vals) if vals else math.nan


def _pick(report: Report, protocol: str, clients: int, conflict: float) -> list[Level]:
    return [r for r in report.levels if r.protocol == protocol and r.clients == clients
            and r.conflict == conflict]


def target_rows(report: Report, args: argparse.Namespace) -> list[tuple[str, str, str, str]]:
    """(target, measured, goal, verdict): the issue's two no-contention targets, on the
    median over rounds of each protocol's figure (n/a when a side was not measured)."""
    rows = []
    lead = [p for p in args.protocols if get_protocol(p).call_strategy
            is CallStrategy.ENDORSEMENT]
    ref = [p for p in args.protocols if get_protocol(p).call_strategy
           is not CallStrategy.ENDORSEMENT and get_protocol(p).fault_model is FaultModel.BYZANTINE]
    if not lead or not ref:
        return [("leaderless targets", "need an ENDORSEMENT and a Byzantine ordered protocol",
                 "-", "n/a")]
    a, b = lead[0], ref[0]
    p50_a = _median([r.p50_ms for r in _pick(report, a, 1, 0.0)])
    p50_b = _median([r.p50_ms for r in _pick(report, b, 1, 0.0)])
    ok = None if math.isnan(p50_a) or math.isnan(p50_b) else p50_a <= P50_RATIO_GOAL * p50_b
    measured = f"{p50_a / p50_b:.2f}x ({p50_a:.2f} / {p50_b:.2f} ms)"
    rows.append((f"{a} 1-client p50 / {b}'s", "not run" if ok is None else measured,
                 f"<= {P50_RATIO_GOAL}x", _verdict(ok)))
    if 0.0 in args.conflicts:
        t_a = _median([r.commits_per_s for r in _pick(report, a, args.clients, 0.0)])
        t_b = _median([r.commits_per_s for r in _pick(report, b, args.clients, 0.0)])
        ok = None if math.isnan(t_a) or math.isnan(t_b) or t_b == 0 else t_a >= t_b
        rows.append((f"{a} commits/s at {args.clients} clients, 0% / {b}'s",
                     "not run" if ok is None else f"{t_a / t_b:.2f}x ({t_a:,.0f} / {t_b:,.0f})",
                     ">= 1.0x", _verdict(ok)))
    return rows


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def print_report(report: Report, args: argparse.Namespace, out: Callable[[str], None]) -> None:
    out("")
    sizes = ", ".join(f"{p} n={get_protocol(p).default_nodes}" for p in args.protocols)
    out(f"Leaderless benchmark: {sizes} "
        f"on 127.0.0.1 (TLS, fsync on), {args.value_size}-byte writes, {args.hot_keys} hot keys, "
        f"{args.duration:g} s per level, {args.rounds} round(s) interleaved")
    out(f"machine at start: {report.machine_start}")
    out(f"machine at end:   {report.machine_end}")
    for name, why in sorted(report.skipped.items()):
        out(f"  SKIPPED {name}: {why}")
    out("")
    head = (f"{'protocol':<11} {'rnd':>3} {'clients':>7} {'conflict':>8} {'commits/s':>9} "
            f"{'aborts':>6} {'errors':>6} {'p50 ms':>8} {'p99 ms':>8} {'abort p50':>9} "
            f"{'srv cores':>9} {'CPU ms/commit':>13} {'KiB/commit':>10} {'fsyncs/commit':>13} "
            f"{'peer KiB/commit':>15} {'gen':>5}")
    out(head)
    out("-" * len(head))
    for p in args.protocols:
        for r in report.levels:
            if r.protocol != p:
                continue
            out(f"{r.protocol:<11} {r.round:>3} {r.clients:>7} {r.conflict:>8.0%} "
                f"{r.commits_per_s:>9,.0f} {r.aborts:>6} {r.errors:>6} {_ms(r.p50_ms):>8} "
                f"{_ms(r.p99_ms):>8} {_ms(r.abort_p50_ms):>9} {r.server_cpu:>9.2f} "
                f"{_ms(r.cpu_ms_per_commit):>13} {_ms(r.kib_per_commit):>10} "
                f"{_ms(r.per_commit(r.fsync_batches)):>13} "
                f"{_ms(r.per_commit(r.peer_bytes / 1024)):>15} {r.loadgen_cpu:>5.2f}")
    notes = [(r.protocol, r.round, r.clients, r.conflict, r.note) for r in report.levels
             if r.note]
    for p, rnd, c, conflict, note in notes:
        out(f"  first error {p} round {rnd}, {c} clients, {conflict:.0%}: {note}")
    out("(srv cores = the servers' CPU over the window, all nodes; CPU ms/commit = that CPU "
        "per committed op; KiB/commit = bytes the servers wrote to files (WAL, journals, "
        "checkpoints; /proc wchar) per committed op, all nodes; fsyncs/commit = the nodes' "
        "group-commit persist+fsync batches (phalanx_fsync_seconds_count) per committed op, "
        "all nodes; peer KiB/commit = node-to-node bytes per committed op; gen = the load "
        "generator's cores)")
    out("")
    rows = target_rows(report, args)
    title = "target (medians over rounds)"
    w0 = max(len(title), *(len(r[0]) for r in rows))
    w1 = max(len(r[1]) for r in rows)
    out(f"{title:<{w0}}  {'measured':<{w1}}  {'goal':<8}  verdict")
    out(f"{'-' * w0}  {'-' * w1}  {'-' * 8}  -------")
    for name, value, goal, verdict in rows:
        out(f"{name:<{w0}}  {value:<{w1}}  {goal:<8}  {verdict}")


# --------------------------------------------------------------------------------------------
# CLI


def _csv(kind: Callable[[str], object]) -> Callable[[str], list[object]]:
    def parse(text: str) -> list[object]:
        try:
            return [kind(x.strip()) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad list {text!r}") from None
    return parse


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--protocols", default=DEFAULT_PROTOCOLS,
                   help=f"comma-separated, in run order (default {DEFAULT_PROTOCOLS}; "
                   f"registered: {','.join(protocol_names())})")
    p.add_argument("--conflicts", type=_csv(int), default=None,
                   help="conflict levels in percent for the throughput levels (default 0,10,50)")
    p.add_argument("--clients", type=int, default=64,
                   help="clients of the throughput levels (default 64)")
    p.add_argument("--hot-keys", type=int, default=4, help="shared hot keys (default 4)")
    p.add_argument("--rounds", type=int, default=2,
                   help="interleaved rounds over the protocols (default 2)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per level (default 5)")
    p.add_argument("--warmup", type=float, default=1.0, help="warmup seconds per level")
    p.add_argument("--value-size", type=int, default=100, help="value bytes (default 100)")
    p.add_argument("--tx-timeout", type=float, default=2.0,
                   help="signed transactions' deadline (and call timeout), seconds: an aborted "
                   "write waits about this long (default 2)")
    p.add_argument("--workdir", default=None, help="where the cluster directories go")
    p.add_argument("--json", default=None, help="also write the raw results to this file")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="py-spy every server of each level (raw stacks into DIR)")
    p.add_argument("--cprofile", default=None, metavar="DIR",
                   help="run each cluster's first node under cProfile, stats into "
                   "DIR/r<round>/<protocol>-<node>.prof (whole session; the node's CPU grows)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1 round, 4 clients at 0%% and 50%%, 1 s levels")
    args = p.parse_args(argv)
    args.protocols = [x.strip() for x in args.protocols.split(",") if x.strip()]
    unknown = sorted(set(args.protocols) - set(protocol_names()))
    if unknown or not args.protocols:
        p.error(f"unknown protocols {unknown}; registered: {','.join(protocol_names())}")
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 1.0, 0.3
        if args.conflicts is None:
            args.conflicts = [0, 50]
        args.clients = min(args.clients, 4)
    if args.conflicts is None:
        args.conflicts = [0, 10, 50]
    if any(not 0 <= c <= 100 for c in args.conflicts):
        p.error("--conflicts are percentages in 0..100")
    args.conflicts = [c / 100 for c in args.conflicts]
    if (args.clients < 1 or args.rounds < 1 or args.hot_keys < 1 or args.duration <= 0
            or args.value_size < 32 or args.tx_timeout <= 0):
        p.error("--clients, --rounds, --hot-keys, --duration, --tx-timeout must be positive; "
                "--value-size >= 32")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = Report(machine_start=machine_info())
    log(f"machine: {report.machine_start}")
    own = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="phalanx-bench-ll-"))
    try:
        for round_no in range(1, args.rounds + 1):
            for protocol in args.protocols:
                try:
                    run_protocol(protocol, round_no, args, report, workdir)
                except Exception as e:  # one protocol's failure must not lose the others'
                    traceback.print_exc(file=sys.stderr)
                    report.skipped[f"{protocol} round {round_no}"] = f"{type(e).__name__}: {e}"
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    report.machine_end = machine_info()
    print_report(report, args, print)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"levels": [asdict(r) | {"commits_per_s": r.commits_per_s,
                                               "cpu_ms_per_commit": r.cpu_ms_per_commit}
                                  for r in report.levels],
                       "skipped": report.skipped, "machine_start": report.machine_start,
                       "machine_end": report.machine_end}, f, indent=2)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
