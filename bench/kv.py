"""KV write benchmark: phalanx vs PySyncObj vs etcd, 3 nodes on loopback, same run, ratios.

Run: `.venv/bin/python bench/kv.py` (a few minutes), `--quick` for a smoke run (1 and 16
clients, 2 s per level, no RSS phase). `--help` lists the flags; `--protocol pbft` runs a
4-replica PBFT cluster as "phalanx" and, by default, phalanx's 3-node Raft cluster beside it
as "raft" (same load, same run).

What is measured, per system and per client count C (default 1, 16, 64, 256):
- C closed-loop clients, each writing put after put with 100-byte values to unique keys;
  a warmup, then a `--duration` window; throughput = acks inside the window / window, p50 and
  p99 of those acks' latencies. Same load-generator code (`_loadgen.run_level`, one trio
  process) for phalanx and etcd; PySyncObj has no external client, so its blocking
  `ReplDict.set(sync=True)` clients run as threads inside its member processes.
- phalanx: `phalanx.ops.local_cluster.init_cluster` + one `python -m phalanx node run` process per
node,
  fsync "group" (real fsync), default timing; driven by `phalanx.client.Client`.
- etcd 3.4: 3 members (default fsync), v3 HTTP/JSON gateway via a raw keep-alive HTTP/1.1
  client to the leader (`_etcd.py`). Skipped with a message when `etcd` is not on PATH.
- PySyncObj: 3 member processes, default `SyncObjConf` (no fsync: it has none). Skipped
  with a message when `pysyncobj` is not importable.
- Failover (phalanx, and etcd for reference): one client keeps writing; the leader process is
  SIGKILLed; reported: time from the kill to the first acknowledged write.
- RSS (phalanx): `--rss-keys` keys loaded through the client in pipelined batches
  (`--rss-batch` puts per Txn command), then VmRSS of every node vs. the raw key+value bytes,
  once the nodes have settled (the load's last checkpoint written and its replaced layers
  freed: RSS steady within 1% over 3 s, at most 30 s); the peak seen during the load and the
  settling is printed beside it.
- CPU: the load generator's and the servers' CPU over each window, in cores, because all
  of it shares one small machine; a generator near 1.0 core is itself a bottleneck.

Must not be imported by the package; it lives outside it and imports `phalanx.*` only through
`_phalanx.py`. Only loopback addresses are used. Progress goes to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import trio
from _etcd import EtcdCluster, EtcdError, etcd_binary, etcd_version
from _loadgen import LevelResult, Target, machine_info, make_value, run_level, start_profilers
from _pso import PsoCluster, PsoError, pysyncobj_version

from phalanx.protocols import DEFAULT_PROTOCOL, FaultModel
from phalanx.protocols import get as get_protocol
from phalanx.protocols import names as protocol_names

SYSTEMS = ("phalanx", "raft", "etcd", "pysyncobj")
"""`raft` is phalanx's own 3-node Raft cluster beside a `--protocol pbft` run (the PBFT
issue's "beside Raft in the same run"; load levels only, no failover or RSS phase)."""
PBFT_DEFAULT_SYSTEMS = "phalanx,raft"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass(slots=True, kw_only=True)
class Report:
    """Everything the run measured, printed at the end (and optionally dumped as JSON)."""

    levels: list[LevelResult] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    failover_s: dict[str, list[float]] = field(default_factory=dict)
    rss: dict[str, float] = field(default_factory=dict)  # keys, raw_bytes, max_rss, ...
    machine_start: str = ""
    machine_end: str = ""

    def level(self, system: str, clients: int) -> LevelResult | None:
        for r in self.levels:
            if r.system == system and r.clients == clients:
                return r
        return None


# --------------------------------------------------------------------------------------------
# Per-system phases


async def _drive(target: Target, args: argparse.Namespace, report: Report) -> None:
    value = make_value(args.value_size)
    for clients in args.clients:
        log(f"{target.name}: {clients} clients, {args.warmup:g} s warmup + {args.duration:g} s")
        spies = []
        if args.profile:
            os.makedirs(args.profile, exist_ok=True)
            prefix = os.path.join(args.profile, f"{target.name}-c{clients}")
            spies = start_profilers(target.server_pids(), prefix, args.warmup + args.duration)
            log(f"  profiling {len(spies)} server(s) into {prefix}-<pid>.txt")
        probe = getattr(target, "diagnostics", None)  # optional: counters to diff per level
        before = await probe() if probe is not None else {}
        result = await run_level(
            target, clients=clients, warmup_s=args.warmup, duration_s=args.duration,
            value=value, key_prefix=f"c{clients}-",
        )
        if probe is not None:
            after = await probe()
            delta = {k: v - before.get(k, 0) for k, v in sorted(after.items())}
            shown = " ".join(f"{k}={v:g}" for k, v in delta.items() if v)
            result = replace(result, note=(result.note + " " if result.note else "") + shown)
        for spy in spies:
            await trio.to_thread.run_sync(spy.wait)
        report.levels.append(result)
        log(f"  {_fmt_level(result)}")


def bench_etcd(args: argparse.Namespace, report: Report) -> None:
    binary = etcd_binary()
    if binary is None:
        report.skipped["etcd"] = (
            "`etcd` not on PATH (Debian: apt-get install etcd-server); etcd side skipped"
        )
        log(report.skipped["etcd"])
        return
    report.versions["etcd"] = etcd_version(binary)
    cluster = EtcdCluster(binary)
    log(f"etcd: starting 3 members ({report.versions['etcd']})")
    cluster.start()
    try:

        async def phase() -> None:
            leader = await cluster.wait_ready()
            log(f"etcd: leader {leader.name} (client port {leader.client_port})")
            await _drive(cluster, args, report)
            if not args.skip_failover:
                from _failover import etcd_failover

                report.failover_s["etcd"] = await etcd_failover(
                    cluster, trials=args.failover_trials, log=log
                )

        trio.run(phase)
    except EtcdError as e:
        report.skipped["etcd"] = f"etcd failed: {e}"
        log(report.skipped["etcd"])
    finally:
        cluster.stop()


def bench_pysyncobj(args: argparse.Namespace, report: Report) -> None:
    version = pysyncobj_version()
    if version is None:
        report.skipped["pysyncobj"] = (
            "`pysyncobj` not installed (pip install -e '.[bench]'); PySyncObj side skipped"
        )
        log(report.skipped["pysyncobj"])
        return
    report.versions["pysyncobj"] = f"PySyncObj {version}"
    conf = json.loads(args.pso_conf) if args.pso_conf else {}
    cluster = PsoCluster(conf=conf)
    log(f"pysyncobj: starting 3 members (conf {conf or 'default'})")
    cluster.start()
    try:
        leader = cluster.wait_ready()
        log(f"pysyncobj: leader {leader}")
        for clients in args.clients:
            log(f"pysyncobj: {clients} clients, {args.warmup:g} s warmup + {args.duration:g} s")
            result = cluster.run_level(
                clients=clients, warmup_s=args.warmup, duration_s=args.duration,
                value_size=args.value_size, prefix=f"c{clients}-",
            )
            report.levels.append(result)
            log(f"  {_fmt_level(result)}")
    except PsoError as e:
        report.skipped["pysyncobj"] = f"PySyncObj failed: {e}"
        log(report.skipped["pysyncobj"])
    finally:
        cluster.stop()


def bench_raft(args: argparse.Namespace, report: Report) -> None:
    """phalanx's Raft cluster beside a PBFT run: the same load levels, nothing else."""
    bench_phalanx(args, report, system="raft", protocol="raft")


def bench_phalanx(args: argparse.Namespace, report: Report, *, system: str = "phalanx",
                  protocol: str | None = None) -> None:
    """The phalanx cluster of `protocol` (default `--protocol`), reported as `system`; the
    failover and RSS phases only for the cluster under test ("phalanx")."""
    protocol = protocol or args.protocol
    extras = system == "phalanx"
    try:
        from _phalanx import PhalanxCluster, PhalanxUnavailable, phalanx_failover, phalanx_rss
    except ImportError as e:
        report.skipped[system] = f"phalanx runtime/client not importable: {e}"
        log(report.skipped[system])
        return
    try:
        nodes = get_protocol(protocol).default_nodes  # f = 1: 3 (crash), 4 (Byzantine)
        cluster = PhalanxCluster(protocol=protocol, workdir=args.workdir, nodes=nodes,
                                 checkpoint_every_bytes=args.checkpoint_every_bytes)
    except PhalanxUnavailable as e:
        report.skipped[system] = str(e)
        log(report.skipped[system])
        return
    cluster.name = system
    report.versions[system] = f"phalanx ({protocol}, {nodes} nodes, fsync=group)"
    log(f"{system}: starting {nodes} {protocol} nodes in {cluster.directory}")
    cluster.start()
    try:

        async def phase() -> None:
            async with cluster.connected():
                leader = await cluster.wait_ready()
                log(f"{system}: leader {leader}")
                await _drive(cluster, args, report)
                if not extras:
                    return
                if not args.skip_failover:
                    report.failover_s["phalanx"] = await phalanx_failover(
                        cluster, trials=args.failover_trials, log=log
                    )
                if not args.skip_rss:
                    report.rss.update(await phalanx_rss(
                        cluster, keys=args.rss_keys, value_size=args.value_size, log=log,
                        budget_s=args.rss_budget, batch=args.rss_batch,
                    ))

        trio.run(phase)
    except PhalanxUnavailable as e:
        report.skipped[system] = f"{system} failed: {e}"
        log(report.skipped[system])
    finally:
        cluster.stop()


# --------------------------------------------------------------------------------------------
# Report


def _fmt_level(r: LevelResult) -> str:
    err = f", {r.errors} errors" if r.errors else ""
    note = f" [{r.note}]" if r.note else ""
    return (
        f"{r.throughput:,.0f} writes/s, p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms, "
        f"cpu loadgen {r.loadgen_cpu:.2f} servers {r.server_cpu:.2f}{err}{note}"
    )


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def target_rows(
    report: Report, *, at: int, protocol: str = DEFAULT_PROTOCOL
) -> list[tuple[str, str, str, bool | None]]:
    """(target, measured, goal, ok) rows; ok is None when the input was not measured.
    The targets are the Raft issue's, or the PBFT issue's for a Byzantine protocol."""
    pbft = get_protocol(protocol).fault_model is FaultModel.BYZANTINE
    p50_goal, rate_goal, failover_goal = (5.0, 3000, 2.0) if pbft else (2.0, 5000, 1.0)
    rows: list[tuple[str, str, str, bool | None]] = []
    one = report.level("phalanx", 1)
    mid = report.level("phalanx", at)
    rows.append((
        "phalanx single-client p50", f"{_ms(one.p50_ms)} ms" if one else "not run",
        f"<= {p50_goal:g} ms", None if one is None or one.ops == 0 else one.p50_ms <= p50_goal,
    ))
    rows.append((
        f"phalanx writes/s at {at} clients", f"{mid.throughput:,.0f}" if mid else "not run",
        f">= {rate_goal:,}", None if mid is None else mid.throughput >= rate_goal,
    ))
    fo = report.failover_s.get("phalanx")
    worst = max(fo) if fo else math.nan
    failover = (
        "phalanx view change (kill primary -> first ack)" if pbft
        else "phalanx failover (kill -> first ack)",
        "not run" if not fo else f"max {worst * 1e3:.0f} ms of {len(fo)}",
        f"<= {failover_goal:g} s", None if not fo else worst <= failover_goal,
    )
    if pbft:  # the PBFT issue compares with no peer and sets no memory target
        rows.append(failover)
        return rows
    for peer, goal in (("etcd", 1.0), ("pysyncobj", 3.0)):
        other = report.level(peer, at)
        if mid is None or other is None or other.throughput == 0:
            rows.append((f"phalanx / {peer} at {at} clients", "not run", f">= {goal:.1f}x", None))
            continue
        ratio = mid.throughput / other.throughput
        rows.append((
            f"phalanx / {peer} at {at} clients", f"{ratio:.2f}x", f">= {goal:.1f}x",
            ratio >= goal,
        ))
    rows.append(failover)
    if report.rss and report.rss["keys"] < 1_000_000:
        rows.append((
            "phalanx node RSS at 1M keys", f"only {report.rss['keys']:,.0f} keys loaded",
            "<= 3x raw", None,
        ))
    elif report.rss:
        ratio = report.rss["max_rss"] / report.rss["raw_bytes"]
        rows.append((
            f"phalanx node RSS at {report.rss['keys']:,.0f} keys",
            f"{ratio:.2f}x raw ({report.rss['max_rss'] / 2**20:,.0f} MiB)", "<= 3x raw",
            ratio <= 3.0,
        ))
    else:
        rows.append(("phalanx node RSS at 1M keys", "not run", "<= 3x raw", None))
    return rows


def print_report(report: Report, args: argparse.Namespace, out: Callable[[str], None]) -> None:
    out("")
    spec = get_protocol(args.protocol)
    nodes = (f"{spec.default_nodes} {spec.name} replicas (phalanx; peers 3 nodes)"
             if spec.default_nodes != 3 else "3 nodes")
    out(f"KV write benchmark: {nodes} on 127.0.0.1, closed-loop clients, "
        f"{args.value_size}-byte values, {args.duration:g} s per level")
    out(f"machine at start: {report.machine_start}")
    out(f"machine at end:   {report.machine_end}")
    for name, version in sorted(report.versions.items()):
        out(f"  {name}: {version}")
    for name, why in sorted(report.skipped.items()):
        out(f"  SKIPPED {name}: {why}")
    out("")
    head = (f"{'system':<10} {'clients':>7} {'writes/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'errors':>6} {'cpu gen':>7} {'cpu srv':>7}")
    out(head)
    out("-" * len(head))
    for system in SYSTEMS:
        for r in report.levels:
            if r.system != system:
                continue
            out(f"{r.system:<10} {r.clients:>7} {r.throughput:>10,.0f} {_ms(r.p50_ms):>8} "
                f"{_ms(r.p99_ms):>8} {r.errors:>6} {r.loadgen_cpu:>7.2f} {r.server_cpu:>7.2f}")
    out("(cpu = cores used over the window: gen = load generator, srv = the servers; "
        "PySyncObj's clients run inside its servers)")
    notes = [(r.system, r.clients, r.note) for r in report.levels if r.note]
    for system, clients, note in notes:
        out(f"  note {system}@{clients}: {note}")
    out("")
    ratio_levels = [c for c in args.clients if report.level("phalanx", c)]
    for c in ratio_levels:
        ph = report.level("phalanx", c)
        assert ph is not None  # filtered above
        parts = []
        for peer in ("raft", "etcd", "pysyncobj"):
            other = report.level(peer, c)
            if other is not None and other.throughput > 0:
                parts.append(f"phalanx/{peer} {ph.throughput / other.throughput:.2f}x")
        if parts:
            out(f"ratios at {c:>3} clients: " + ", ".join(parts))
    for system, times in sorted(report.failover_s.items()):
        shown = ", ".join(f"{t * 1e3:.0f}" for t in times)
        out(f"failover {system}: kill -> first acked write (ms): {shown}")
    if report.rss:
        per = ", ".join(f"{k}={v / 2**20:,.0f} MiB" for k, v in sorted(report.rss.items())
                        if k.startswith("rss_"))
        rss = report.rss
        out(f"RSS at {rss['keys']:,.0f} keys (raw key+value {rss['raw_bytes'] / 2**20:,.0f} MiB, "
            f"loaded in {rss['load_s']:.0f} s, settled after {rss.get('settle_s', 0):.0f} s): "
            f"{per}; max = {rss['max_rss'] / max(rss['raw_bytes'], 1):.2f}x raw; peak during "
            f"the load and settling {rss.get('peak_rss', rss['max_rss']) / 2**20:,.0f} MiB = "
            f"{rss.get('peak_rss', rss['max_rss']) / max(rss['raw_bytes'], 1):.2f}x raw")
    out("")
    rows = target_rows(report, at=64 if 64 in args.clients else max(args.clients),
                       protocol=args.protocol)
    width = max(len(r[0]) for r in rows)
    vwidth = max(len(r[1]) for r in rows)
    out(f"{'target':<{width}}  {'measured':<{vwidth}}  {'goal':<10}  verdict")
    out(f"{'-' * width}  {'-' * vwidth}  {'-' * 10}  -------")
    for name, value, goal, ok in rows:
        out(f"{name:<{width}}  {value:<{vwidth}}  {goal:<10}  {_verdict(ok)}")


# --------------------------------------------------------------------------------------------
# CLI


def _client_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("client counts must be >= 1")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--protocol", default=DEFAULT_PROTOCOL, choices=protocol_names(),
                   help="phalanx protocol (default %(default)s)")
    p.add_argument("--systems", default=None,
                   help=f"comma-separated subset of {','.join(SYSTEMS)} (default: phalanx,etcd,"
                   f"pysyncobj; with --protocol pbft: {PBFT_DEFAULT_SYSTEMS})")
    p.add_argument("--clients", type=_client_list, default=None,
                   help="client counts (default 1,16,64,256; --quick: 1,16)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per level (default 5)")
    p.add_argument("--warmup", type=float, default=1.0, help="warmup seconds per level")
    p.add_argument("--value-size", type=int, default=100, help="value bytes (default 100)")
    p.add_argument("--failover-trials", type=int, default=3)
    p.add_argument("--skip-failover", action="store_true")
    p.add_argument("--rss-keys", type=int, default=1_000_000)
    p.add_argument("--rss-budget", type=float, default=900.0,
                   help="seconds the RSS load may take; RSS is then read at the keys loaded")
    p.add_argument("--rss-batch", type=int, default=100,
                   help="puts per command (a Txn) in the RSS load, 1..128 (the KV Txn limit); "
                   "1 = one put per request (default 100)")
    p.add_argument("--checkpoint-every-bytes", type=int, default=None,
                   help="override the phalanx nodes' [checkpoint] every_bytes (default: the "
                   "cluster default); it bounds the in-memory Raft log between checkpoints")
    p.add_argument("--skip-rss", action="store_true")
    p.add_argument("--pso-conf", default="", help="JSON SyncObjConf overrides for PySyncObj")
    p.add_argument("--workdir", default=None, help="where the phalanx cluster dir goes")
    p.add_argument("--json", default=None, help="also write the raw results to this file")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1 and 16 clients (unless --clients), 2 s, 1 failover "
                   "trial, no RSS phase")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="py-spy every server of each level (raw stacks into DIR); combine "
                   "with --quick --systems phalanx for a quick profiling run")
    args = p.parse_args(argv)
    if not 1 <= args.rss_batch <= 128:
        p.error("--rss-batch must be in 1..128")
    if args.clients is None:
        args.clients = [1, 16] if args.quick else [1, 16, 64, 256]
    if args.quick:
        args.duration = 2.0
        args.warmup = 0.5
        args.failover_trials = 1
        args.skip_rss = True
    if args.systems is None:
        args.systems = (PBFT_DEFAULT_SYSTEMS if args.protocol != DEFAULT_PROTOCOL
                        else "phalanx,etcd,pysyncobj")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {','.join(SYSTEMS)}")
    args.systems = systems
    if args.value_size < 1 or args.duration <= 0 or args.rss_keys < 1:
        p.error("--value-size, --duration and --rss-keys must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = Report(machine_start=machine_info())
    log(f"machine: {report.machine_start}")
    runners = {"phalanx": bench_phalanx, "raft": bench_raft, "etcd": bench_etcd,
               "pysyncobj": bench_pysyncobj}
    for system in args.systems:
        try:
            runners[system](args, report)
        except Exception as e:  # one system's failure must not lose the others' numbers
            traceback.print_exc(file=sys.stderr)
            report.skipped[system] = f"{system} failed: {type(e).__name__}: {e}"
            log(report.skipped[system])
    report.machine_end = machine_info()
    print_report(report, args, print)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({
                "levels": [asdict(r) | {"throughput": r.throughput} for r in report.levels],
                "skipped": report.skipped, "versions": report.versions,
                "failover_s": report.failover_s, "rss": report.rss,
                "machine_start": report.machine_start, "machine_end": report.machine_end,
            }, f, indent=2)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
