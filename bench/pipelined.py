"""Pipelined write benchmark: N connections x D outstanding writes, phalanx beside etcd 3.4.

Run: `.venv/bin/python bench/pipelined.py` (~2 min: Raft n=3 and etcd, 1x256 and 4x64, two
interleaved rounds), `--quick` for a smoke run, `--help` for the flags.

What is measured (issue 23: "pipelined throughput, many outstanding requests per client
connection, fsync on, one write per request"): for each level NxD, N client connections to
the leader each keep D writes outstanding; every request is one KV put of a unique key with
a `--value-size` value. A warmup, then a `--duration` window; writes/s = replies inside the
window / window; p50/p99 of their send-to-reply latencies; the servers' CPU and the load
generator's own CPU per write (ms of CPU per acknowledged write: on a 2-core machine the
generator competes with the servers for the same cores).

Arms (`--arms`, all by default, run interleaved within each round, their order reversed
every other round so no arm always runs first):
- `phalanx-raw`: pre-encoded requests (`_pipeload.phalanx_raw`): the generator writes ready
  frames and matches replies, so it measures the servers, not our Python client.
- `phalanx-client`: the same load through `phalanx.client.Client` (N clients, D tasks each).
- `etcd-pipelined`: HTTP/1.1 pipelining on etcd's v3 JSON gateway, D requests written
  ahead per connection (the gateway answers a connection's requests one after another, in
  order).
- `etcd-conns`: N x D keep-alive connections, one request at a time each (kv.py's method).

Both clusters (phalanx: `--protocol`, default Raft n=3, fsync "group"; etcd 3.4: 3 members,
default fsync) run for the whole run on loopback; the one not measured idles (each phalanx
node ~2-3% of a core, etcd less). Progress goes to stderr, the report to stdout.
`--profile DIR` records py-spy raw stacks of every server (and the generator is profiled
with `--cprofile-loadgen FILE`).

Must not be imported by the package. Loopback only.
"""

from __future__ import annotations

import argparse
import cProfile
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import trio
from _etcd import EtcdCluster, EtcdError, etcd_binary, etcd_version
from _loadgen import machine_info, make_value, start_profilers
from _phalanx import PhalanxCluster, PhalanxUnavailable
from _pipeload import (
    Body,
    PipeResult,
    RawPlan,
    etcd_conns,
    etcd_pipelined,
    measure,
    phalanx_client,
    phalanx_raw,
)

from phalanx.protocols import CallStrategy
from phalanx.protocols import get as get_protocol

ARMS = ("phalanx-raw", "phalanx-client", "etcd-pipelined", "etcd-conns")


def log(msg: str) -> None:
    print(f"[pipelined {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_levels(text: str) -> list[tuple[int, int]]:
    levels = []
    for part in text.split(","):
        n, sep, d = part.strip().lower().partition("x")
        if not sep or not n.isdigit() or not d.isdigit() or int(n) < 1 or int(d) < 1:
            raise argparse.ArgumentTypeError(f"level {part!r}: expected NxD, e.g. 4x64")
        levels.append((int(n), int(d)))
    return levels


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", type=parse_levels, default=parse_levels("1x256,4x64"),
                   help="NxD: N connections with D writes outstanding each (default "
                        "1x256,4x64)")
    p.add_argument("--arms", default=",".join(ARMS),
                   help=f"comma-separated arms to run (default all: {','.join(ARMS)})")
    p.add_argument("--protocol", default="raft", help="phalanx protocol (default raft)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before each window")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per window")
    p.add_argument("--value-size", type=int, default=100, help="bytes per value (100)")
    p.add_argument("--max-rate", type=float, default=40_000.0,
                   help="writes/s the raw generator pre-encodes frames for (default 40,000; "
                        "beyond it frames are encoded live and counted)")
    p.add_argument("--profile", metavar="DIR",
                   help="py-spy raw stacks of every server, per arm and level, into DIR")
    p.add_argument("--cprofile-loadgen", metavar="FILE",
                   help="cProfile the load generator's whole run into FILE (pstats)")
    p.add_argument("--workdir", help="where the phalanx cluster lives (default: a temp dir)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: level 1x32, one round, 1 s warmup + 2 s")
    args = p.parse_args(argv)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown:
        p.error(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(ARMS)}")
    if args.quick:
        args.levels, args.rounds, args.warmup, args.duration = [(1, 32)], 1, 1.0, 2.0
    if args.rounds < 1 or args.duration <= 0 or args.warmup < 0:
        p.error("--rounds >= 1, --duration > 0 and --warmup >= 0 required")
    if ("phalanx-raw" in args.arms
            and get_protocol(args.protocol).call_strategy is not CallStrategy.LEADER):
        log(f"phalanx-raw needs a leader protocol; {args.protocol}: arm dropped")
        args.arms.remove("phalanx-raw")
    return args


def fmt(r: PipeResult) -> str:
    err = f", {r.errors} errors" if r.errors else ""
    note = f" [{r.note}]" if r.note else ""
    return (f"{r.rate:,.0f} writes/s, p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms, CPU ms/write "
            f"servers {r.cpu_ms_per_write(r.server_cores):.3f} loadgen "
            f"{r.cpu_ms_per_write(r.loadgen_cores):.3f} (cores {r.server_cores:.2f} + "
            f"{r.loadgen_cores:.2f}){err}{note}")


async def run(args: argparse.Namespace, results: list[tuple[int, str, PipeResult]],
              info: dict[str, str]) -> None:
    value = make_value(args.value_size)
    phalanx: PhalanxCluster | None = None
    etcd: EtcdCluster | None = None
    want_phalanx = any(a.startswith("phalanx") for a in args.arms)
    want_etcd = any(a.startswith("etcd") for a in args.arms)
    try:
        if want_phalanx:
            nodes = get_protocol(args.protocol).default_nodes
            phalanx = PhalanxCluster(protocol=args.protocol, workdir=args.workdir, nodes=nodes)
            info["phalanx"] = f"phalanx {args.protocol}, {nodes} nodes, fsync=group"
            log(f"phalanx: starting {nodes} {args.protocol} nodes in {phalanx.directory}")
            phalanx.start()
        if want_etcd:
            binary = etcd_binary()
            if binary is None:
                info["etcd"] = "SKIPPED: `etcd` not on PATH"
                args.arms = [a for a in args.arms if not a.startswith("etcd")]
            else:
                info["etcd"] = etcd_version(binary) + ", 3 members, default fsync"
                etcd = EtcdCluster(binary)
                log(f"etcd: starting 3 members ({info['etcd']})")
                etcd.start()
        if phalanx is not None:
            async with phalanx.connected():
                log(f"phalanx: leader {await phalanx.wait_ready()}")
        if etcd is not None:
            etcd_leader = await etcd.wait_ready()
            log(f"etcd: leader {etcd_leader.name} (client port {etcd_leader.client_port})")
        for rnd in range(args.rounds):
            arms = args.arms if rnd % 2 == 0 else list(reversed(args.arms))
            for n, d in args.levels:
                for arm in arms:
                    prefix = f"r{rnd}-{n}x{d}-{arm}-"
                    log(f"round {rnd + 1}/{args.rounds}, {arm}, {n}x{d}: "
                        f"{args.warmup:g} s warmup + {args.duration:g} s "
                        f"(load {info_load()})")
                    leader = ""
                    if arm == "phalanx-raw" and phalanx is not None:
                        # (found again per level: under a loaded machine elections happen)
                        async with phalanx.connected():
                            leader = await phalanx.wait_ready()
                    body, pids, note = _arm(arm, args, phalanx, etcd, leader, n, d, value,
                                            prefix)
                    spies = []
                    if args.profile:
                        spies = start_profilers(pids, f"{args.profile}/{arm}-{n}x{d}-r{rnd}",
                                                args.warmup + args.duration)
                    counters = COUNTERS if arm.startswith("phalanx") and phalanx else ()
                    before = await _scrape(phalanx, counters)
                    started = time.perf_counter()
                    result = await measure(arm, n, d, pids, body(), warmup_s=args.warmup,
                                           duration_s=args.duration)
                    after = await _scrape(phalanx, counters)
                    result = replace(result, note=" ".join(filter(None, (
                        result.note, note(),
                        _counter_note(before, after, time.perf_counter() - started)))))
                    for spy in spies:
                        await trio.to_thread.run_sync(spy.wait)
                    log(f"  {fmt(result)}")
                    results.append((rnd, arm, result))
    finally:
        if phalanx is not None:
            phalanx.stop()
        if etcd is not None:
            etcd.stop()


COUNTERS = ("leader_changes", "driver_proposal_batches", "driver_io_batches",
            "driver_slow_passes")
"""The nodes' counters each phalanx level reports (summed over the nodes, per second of
the level: warmup, window and drain), so a reader sees writes per proposal, fsync batches
and leader changes beside the writes/s."""


async def _scrape(cluster: PhalanxCluster | None, names: Sequence[str]) -> dict[str, float]:
    if cluster is None or not names:
        return {}
    return await trio.to_thread.run_sync(cluster.scrape, names)


def _counter_note(before: dict[str, float], after: dict[str, float], seconds: float) -> str:
    if not after:
        return ""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    short = {"driver_proposal_batches": "proposals/s",
             "driver_io_batches": "worker-thread persists/s",
             "driver_slow_passes": "slow passes", "leader_changes": "leader changes"}
    return ", ".join(
        f"{short[k]} {v / seconds:,.0f}" if k.endswith("batches") else f"{short[k]} {v:g}"
        for k, v in sorted(delta.items()) if v)


def info_load() -> str:
    import os

    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _arm(arm: str, args: argparse.Namespace, phalanx: PhalanxCluster | None,
         etcd: EtcdCluster | None, leader: str, n: int, d: int, value: bytes, prefix: str
         ) -> tuple[Callable[[], Body], Sequence[int], Callable[[], str]]:
    """(body factory, server pids, note) of one arm at one level."""
    if arm.startswith("phalanx"):
        if phalanx is None:
            raise RuntimeError(f"{arm} without a running phalanx cluster")
        config = phalanx.config
        if arm == "phalanx-raw":
            per_lane = math.ceil(args.max_rate * (args.warmup + args.duration) / (n * d)) + 2
            t0 = time.perf_counter()
            plan = RawPlan(config, connections=n, depth=d, value=value, prefix=prefix,
                           frames_per_lane=per_lane)
            log(f"  pre-encoded {per_lane * n * d:,} frames in "
                f"{time.perf_counter() - t0:.1f} s (not in the window)")
            return (lambda: phalanx_raw(config, leader, plan), phalanx.server_pids(),
                    lambda: f"live encodes {plan.live_encodes}" if plan.live_encodes else "")
        return (lambda: phalanx_client(config, connections=n, depth=d, value=value,
                                       prefix=prefix), phalanx.server_pids(), lambda: "")
    if etcd is None or etcd.leader is None:
        raise RuntimeError(f"{arm} without a running etcd cluster")
    port = etcd.leader.client_port
    maker = etcd_pipelined if arm == "etcd-pipelined" else etcd_conns
    return (lambda: maker(port, connections=n, depth=d, value=value, prefix=prefix),
            etcd.server_pids(), lambda: "")


def report(args: argparse.Namespace, results: list[tuple[int, str, PipeResult]],
           info: dict[str, str], start: str, end: str, out: Callable[[str], None]) -> None:
    out("")
    out(f"Pipelined write benchmark: N connections x D outstanding writes, one put per request, "
        f"{args.value_size}-byte values, {args.duration:g} s windows, {args.rounds} "
        f"interleaved round(s)")
    out(f"machine at start: {start}")
    out(f"machine at end:   {end}")
    for name, text in sorted(info.items()):
        out(f"  {name}: {text}")
    out("")
    out(f"{'arm':<15} {'NxD':>6} {'round':>5} {'writes/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'srv ms/w':>8} {'gen ms/w':>8} {'srv cores':>9} {'gen cores':>9} errors")
    for rnd, arm, r in results:
        out(f"{arm:<15} {f'{r.connections}x{r.depth}':>6} {rnd + 1:>5} {r.rate:>9,.0f} "
            f"{r.p50_ms:>7.2f} {r.p99_ms:>7.2f} {r.cpu_ms_per_write(r.server_cores):>8.3f} "
            f"{r.cpu_ms_per_write(r.loadgen_cores):>8.3f} {r.server_cores:>9.2f} "
            f"{r.loadgen_cores:>9.2f} {r.errors}{' ' + r.note if r.note else ''}")
    out("")
    out("medians over rounds:")
    best: dict[tuple[int, int], dict[str, float]] = {}
    for n, d in args.levels:
        for arm in args.arms:
            rs = [r for _, a, r in results if a == arm and (r.connections, r.depth) == (n, d)]
            if not rs:
                continue
            rate = statistics.median(r.rate for r in rs)
            best.setdefault((n, d), {})[arm] = rate
            srv = statistics.median(r.cpu_ms_per_write(r.server_cores) for r in rs)
            gen = statistics.median(r.cpu_ms_per_write(r.loadgen_cores) for r in rs)
            out(f"  {arm:<15} {n}x{d}: {rate:,.0f} writes/s, p50 "
                f"{statistics.median(r.p50_ms for r in rs):.2f} ms, servers {srv:.3f} ms/w, "
                f"loadgen {gen:.3f} ms/w")
    for (n, d), rates in best.items():
        ours = max((v for k, v in rates.items() if k.startswith("phalanx")), default=math.nan)
        theirs = max((v for k, v in rates.items() if k.startswith("etcd")), default=math.nan)
        verdict = "PASS" if ours >= 30_000 else "MISS"
        ratio = f", {ours / theirs:.2f}x etcd's best arm" if theirs == theirs else ""
        out(f"  target >= 30,000 writes/s at {n}x{d}: {ours:,.0f}{ratio} -> {verdict} "
            f"(issue 23 sets it for Raft; this run: {args.protocol})")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results: list[tuple[int, str, PipeResult]] = []
    info: dict[str, str] = {}
    start = machine_info()
    log(f"machine: {start}")
    profiler = cProfile.Profile() if args.cprofile_loadgen else None
    try:
        if profiler is not None:
            profiler.enable()
        trio.run(run, args, results, info)
    except (PhalanxUnavailable, EtcdError) as e:
        log(f"failed: {e}")
        return 1
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.cprofile_loadgen)
    report(args, results, info, start, machine_info(), print)
    return 0


if __name__ == "__main__":
    sys.exit(main())
